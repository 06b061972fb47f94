"""The policy and its objective: the model, the reference, log-probabilities, the ggpo loss, packed
passes, the step's batch and figures, DeepSpeed's engine config and the GPU-memory formula.
"""
