"""Episodes at engine speed: a trajectory's next turn joins the engine's running batch as soon as its
tool output is ready (`continuous`), driven through a vLLM engine's request API (`vllm_turns`).
Imports one-way: this package uses `environment` (the episode protocol), `rollout` and `codec`;
nothing outside it but the trainer, the evaluation and `vllm_backend` imports it."""

from .continuous import run_episodes

__all__ = ["run_episodes"]
