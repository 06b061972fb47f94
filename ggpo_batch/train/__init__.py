"""The training payload of one run: ggpo with DeepSpeed ZeRO and pluggable rollouts."""
