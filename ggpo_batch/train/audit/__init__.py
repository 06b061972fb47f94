"""The run's evidence and what carries it across allocations: the audit, the weight-sync probe and
the resumable checkpoint (with the rename table of the classes its pickles name).
"""
