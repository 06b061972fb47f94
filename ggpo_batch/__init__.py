"""ggpo-batch: arm x seed RL post-training experiments on shared Slurm GPU clusters, with a ledger."""

__version__ = "0.1.0"
