"""The task the policy trains on: items and their reward (`qa`), the retrieval tool, the curriculum of
each arm, the codec and tokenizers, the model checks that need them, and the tiny checkpoints tests build.
"""
