"""The training payload of one run: ggpo with DeepSpeed ZeRO and pluggable rollouts.

Reading order: `job` (the allocation's entry point: ranks, phases, record) -> `trainer` (setup,
the step, audit, evaluation, checkpoint) -> `ggpo` (advantages and loss) -> `curriculum` (which
groups a step trains on, per arm) -> `environment` (multi-turn episodes with the search tool) ->
`rollout` / `vllm_backend` (behaviour sampling) -> `task`, `retrieval`, `tokenizer`, `model`.
`config` (the `[train]` table) imports without torch; `launch.train_local` runs local CPU ranks.
"""
