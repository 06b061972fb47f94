"""The payload of one allocation: `TrainingJob(spec_json, output)()` trains one run, writes its record.

Ranks come from submitit (4 tasks on a 4-GPU node) or from torchrun-style env vars
(RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; `launch.train_local` sets them). This module
is the edge that reads the environment; nothing below it does.

Preemption: submitit calls `checkpoint()` on rank 0 (its USR2 hook) and requeues the job; the
requeued job resumes from the last checkpoint in the run's checkpoint folder (`<output>.ckpt/` for a
job outside the queue), written collectively every `train.checkpoint_every` steps and at once when
any rank receives SIGUSR1 or SIGTERM (outside submitit, the job then exits with `Preempted` and a
rerun of the same command resumes).

Time limit: the job's save deadline is its allocation's start (GGPO_ALLOC_START) + the time limit -
the profile's signal delay (allocation.save_deadline). When the next batch would end past it, the
ranks checkpoint together, rank 0 writes `time_limit.json` in the attempt folder, and the job exits
TIME_LIMIT_EXIT_CODE (TimeLimitReached): settlement continues the run in a new allocation when its
spec says `continue_on_timeout`. A job that resumes adds the earlier allocations' time, each up to
the checkpoint it handed on, to its record (whose loop seconds span them too); the ledger books
each allocation on its own attempt (the details' `allocation_elapsed_seconds`).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import signal
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import submitit

from ...common.netutil import free_port
from ...config.logs import configure_logging
from ...config.settings import mlflow_uri
from ...contracts.allocation import (
    PREEMPTED_EXIT_CODE,
    TIME_LIMIT_EXIT_CODE,
    allocation_start,
    details_of,
    image_digest,
    job_log_context,
    policy_of,
    save_deadline,
    time_limit_path,
    write_stopped,
)
from ...contracts.run_record import entry_key, require_valid
from ...contracts.runspec import RunSpec
from ...errors import GgpoError
from .. import versions
from ..config import TrainConfig
from ..policy.deepspeed_import import import_deepspeed
from ..task.model_check import prompt_provenance
from .live_progress import Progress, record_rates
from .tracking import tracking_state

log = logging.getLogger(__name__)


class Preempted(GgpoError):
    """The job checkpointed on a preemption signal and stopped; rerun it to resume."""

    exit_code = PREEMPTED_EXIT_CODE


class TimeLimitReached(GgpoError):
    """The job checkpointed because its allocation's time limit was near, and stopped."""

    exit_code = TIME_LIMIT_EXIT_CODE


LONE_PORT_ENV = "GGPO_LONE_RANK_PORT"  # the MASTER_PORT a lone rank exported for itself (not a launcher's)
# A launcher's rendezvous (torchrun, submitit's export, a lone rank's own): what a process that only
# starts jobs (a worker) must not pass on to them (control/worker.py).
RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", LONE_PORT_ENV)


def _distributed_env() -> tuple[int, int, int, bool]:
    """(rank, world, local_rank, under_submitit); exports MASTER_* for torch's env:// init."""
    mine = os.environ.get(LONE_PORT_ENV)
    if mine is not None and os.environ.get("MASTER_PORT") == mine:
        # a port a lone rank chose for itself earlier in the process that submitted this job (debug
        # executor, embedded queue), inherited: submitit would take it as the rendezvous port instead
        # of drawing one from the job id, and it may still be held (EADDRINUSE)
        del os.environ["MASTER_PORT"]
    try:
        # overwrite: inside a submitit job its task environment is the truth. Stale RANK/WORLD_SIZE/
        # LOCAL_WORLD_SIZE inherited from the submitting process (an in-process vLLM engine sets
        # LOCAL_WORLD_SIZE) made export() refuse, and every task then trained alone as rank 0 of 1.
        env = submitit.helpers.TorchDistributedEnvironment().export(overwrite=True)
        return env.rank, env.world_size, env.local_rank, True
    except RuntimeError:  # not inside a submitit job (or submitit's debug executor): torchrun-style env
        # A lone process: rank 0 of 1, on a free local port, fresh for each job. The port this module
        # chose is marked (LONE_PORT_ENV), since a second job in the same process (debug executor,
        # embedded queue), or a child process that inherited the environment, found the first job's
        # port still held (EADDRINUSE in its TCPStore) when it reused it.
        if "RANK" not in os.environ or "MASTER_PORT" not in os.environ:
            port = str(free_port())
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=port, **{LONE_PORT_ENV: port})
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        return (int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1")),
                int(os.environ.get("LOCAL_RANK", "0")), False)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


# What a rank imports only once it runs, each time in a rank forked from a preloaded process
# (train/run/rankfork.py, executor/rank_server.py) unless the preload took it: the retriever's bm25s;
# the Hugging Face checkpoint module, which the export writes the policy through. (DeepSpeed's Muon
# optimizer, which its ZeRO engines import, comes with `import_deepspeed`, uncompiled.)
RANK_TIME_IMPORTS = ("bm25s", "ggpo_batch.train.pretrained.hf")


# What a rank with vLLM rollouts imports when its engine starts (`from vllm import LLM`, about 2.2
# CPU-seconds): preloaded only by a server that forks such ranks (`preload(vllm=True)`).
VLLM_IMPORTS = ("vllm.entrypoints.llm", "ggpo_batch.train.rollout.vllm_backend")


def preload(*, vllm: bool = False) -> None:
    """Import torch, DeepSpeed (on the CPU accelerator where there is no GPU), the trainer and what
    a rank imports once it runs (RANK_TIME_IMPORTS); with `vllm`, vLLM's too (VLLM_IMPORTS)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import_deepspeed()

    from . import trainer  # noqa: F401

    for name in RANK_TIME_IMPORTS + (VLLM_IMPORTS if vllm else ()):
        importlib.import_module(name)


def init_process_group(cuda: bool) -> None:
    """This rank's process group through DeepSpeed: NCCL on GPUs, gloo on CPU (DeepSpeed imported
    by deepspeed_import, which switches off its shared-memory op on CPU)."""
    import_deepspeed(cuda).init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False)


def _step_figures(trainer: Any, tokens_before: int) -> list[float]:
    """This rank's share of the last step's figures, summed over ranks with the stop flag:
    reward sum, trajectories, generated tokens."""
    rewards = [t.reward for t in trainer.evidence[-1].trajectories] if trainer.evidence else []
    return [float(sum(rewards)), float(len(rewards)),
            float(trainer.state.tally["backend_generated_tokens"] - tokens_before)]


def _provenance(spec_json: str, config_hash: str, *, cuda: bool, world: int, under_submitit: bool,
                folder: Path, reward_files: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Rank 0: this attempt's provenance (ggpo_batch/contracts/provenance.py) from what the job reads of its
    own environment, written into the attempt folder at once (a run that fails later still has it).
    A probe that breaks costs the record its provenance, never the run its allocation."""
    from ...contracts.provenance import collect, write_provenance

    try:
        nodes = list(submitit.JobEnvironment().hostnames) if under_submitit else [socket.gethostname()]
        doc = collect(spec_json, config_hash=config_hash, cuda=cuda, world_size=world, nodes=nodes,
                      visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), image_digest=image_digest(),
                      reward_files=reward_files)
        write_provenance(folder, doc)
    except Exception as exc:  # noqa: BLE001
        log.warning("provenance not recorded: %s: %s", type(exc).__name__, exc)
        return None
    return doc


def _nodes(world: int) -> int:
    """Nodes of this job's world (submitit exports LOCAL_WORLD_SIZE; a local run is one node)."""
    try:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except ValueError:
        per_node = world
    return max(1, world // max(1, per_node))


def _allocation(t0: float, first_step: int, first_loop: float, st: Any) -> dict[str, Any]:
    """This allocation's share of the run so far: its elapsed seconds, steps and loop seconds."""
    return {"elapsed_seconds": time.time() - t0, "from_step": first_step, "to_step": st.step,
            "loop_seconds": st.loop_seconds - first_loop}


class TrainingJob(submitit.helpers.Checkpointable):
    def __init__(self, spec_json: str, output: str, checkpoint: str | None = None) -> None:
        """`checkpoint`: the run's checkpoint folder (default `<output>.ckpt`)."""
        self.spec_json = spec_json
        self.output = output
        self.checkpoint_dir = checkpoint
        self._stop_requested = False
        self._time_limit_signalled = False

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """submitit's preemption hook (rank 0, inside a signal handler: no collectives possible)."""
        self._stop_requested = True
        return submitit.helpers.DelayedSubmission(TrainingJob(self.spec_json, self.output, self._checkpoint_dir()))

    def time_limit_signal(self) -> None:
        """The scheduler's time-limit signal (executor/slurm.py, inside a signal handler). Heeded only by
        a job that does not know its own deadline: Slurm may send it up to 60 s early."""
        self._time_limit_signalled = True

    def _checkpoint_dir(self) -> str:
        return getattr(self, "checkpoint_dir", None) or self.output + ".ckpt"  # older pickles lack it

    def _time_up(self, deadline: float | None, next_batch_seconds: float) -> bool:
        """Would the next batch end past the save deadline (or, without one, did the scheduler say so)?"""
        if deadline is None:
            return getattr(self, "_time_limit_signalled", False)
        return time.time() + next_batch_seconds >= deadline

    def _on_signal(self, signum: int, frame: Any) -> None:
        log.warning("signal %s: checkpointing at the end of the batch in flight", signal.Signals(signum).name)
        self._stop_requested = True

    def _stop_at_time_limit(self, trainer: Any, ckpt: Path, t0: float, first_step: int, first_loop: float,
                            deadline: float | None) -> None:
        """After the checkpoint at the time limit: rank 0 says where the run stopped (time_limit.json),
        with this allocation's elapsed seconds through the save, amended into the checkpoint's own
        account too (so the record and the ledger bill the same seconds); every rank then stops."""
        from ..audit.checkpoint import amend_last_allocation

        st = trainer.state
        if trainer.rank == 0:
            share = _allocation(t0, first_step, first_loop, st)
            amend_last_allocation(ckpt, share)
            write_json_atomic(time_limit_path(Path(self.output).parent), {
                "step": st.step, "from_step": first_step, "loop_seconds": st.loop_seconds,
                "budget_seconds": trainer.budget_seconds, "loop_done": trainer.loop_done(),
                "elapsed_seconds": share["elapsed_seconds"], "deadline": deadline, "checkpoint": str(ckpt)})
        raise TimeLimitReached(f"time limit near: checkpointed at step {st.step} in {ckpt}")

    def __call__(self) -> dict[str, Any]:
        from ..task.rewards import RewardError

        try:
            return self._run()
        except RewardError as exc:  # the reason settlement books: the file, the row's id, the exception's last line
            write_stopped(Path(self.output).parent, str(exc), cause="reward")
            raise

    def _run(self) -> dict[str, Any]:
        t0 = allocation_start()
        deadline = save_deadline(t0)
        # The allocation's libraries, before anything is imported for training or trained (versions.py).
        run_cfg = TrainConfig.from_table(RunSpec.from_json(self.spec_json).train, "<run spec>")
        versions.require(versions.needed(run_cfg), f"the allocation ({socket.gethostname()})")
        rank, world, local_rank, under_submitit = _distributed_env()
        preload()
        import torch
        import torch.distributed as dist

        from .trainer import Trainer
        from .weight_sync import stop_if_failed

        spec = RunSpec.from_json(self.spec_json)
        # Text or JSON lines (GGPO_LOG_FORMAT, inherited from the worker), secrets masked as output is.
        configure_logging(text_format=f"%(asctime)s rank{rank} %(name)s %(message)s",
                          context=job_log_context(spec.run_key, self.output, rank))
        cfg = TrainConfig.from_table(spec.train, "<run spec>")
        if cfg.prompts_per_step % world:
            raise GgpoError(f"<run spec>: train.prompts_per_step {cfg.prompts_per_step} must be a multiple of the "
                            f"{world} ranks")
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local_rank)
        device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        init_process_group(cuda)
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        output, ckpt, nodes = Path(self.output), Path(self._checkpoint_dir()), _nodes(world)
        trainer = Trainer(spec, cfg, rank=rank, world=world, device=device,
                          budget_seconds=spec.loop_budget_seconds)
        progress: Progress | None = None
        provenance = None
        try:
            if rank == 0:
                from ..task.rewards import reward_files

                provenance = _provenance(self.spec_json, spec.config_hash, cuda=cuda, world=world,
                                         under_submitit=under_submitit, folder=output.parent,
                                         reward_files=reward_files(cfg.task))
            meta = trainer.load(ckpt, nodes=nodes)
            resumed = meta is not None
            # The allocations before this one, each up to the checkpoint it handed on: the record
            # bills them with this one, as its loop seconds span them.
            earlier: list[dict[str, Any]] = list(meta.get("allocations", [])) if meta else []
            earlier_seconds = sum(float(a["elapsed_seconds"]) for a in earlier)
            first_step, first_loop = trainer.state.step, trainer.state.loop_seconds
            if rank == 0:
                from .tracking import Tracking

                progress = Progress(output.parent, spec.loop_budget_seconds,
                                    Tracking.start(mlflow_uri(), spec, output))
                progress.begin(trainer.state)
            # Opening the MLflow run (a new SQLite store builds its schema: seconds) stays out of the
            # loop: the other ranks wait here (a reduction of the probe baselines' stop flags, which
            # stops a run whose backend does not run the policy's model before its first step), not
            # inside the first step's collectives.
            halt = torch.tensor([float(trainer.probe_stop_reason() is not None)], dtype=torch.float64, device=device)
            dist.all_reduce(halt, op=dist.ReduceOp.SUM)
            stop_if_failed(trainer.probe_stop_reason(), float(halt[0]), rank=rank, world=world,
                           step=trainer.state.step, folder=output.parent, history=trainer.state.history)
            done = bool(trainer.state.step) and trainer.loop_done()
            while not done:
                tokens_before = trainer.state.tally["backend_generated_tokens"]
                done = trainer.step()
                # One reduction: the stop, time-limit and probe-failure flags and the step's figures
                # (NCCL reduces device tensors only); any rank's flag stops every rank.
                time_up = self._time_up(deadline, trainer.state.last_batch_seconds)
                probe_stop = trainer.probe_stop_reason()
                red = torch.tensor([float(self._stop_requested), float(time_up), float(probe_stop is not None),
                                    *_step_figures(trainer, tokens_before)], dtype=torch.float64, device=device)
                dist.all_reduce(red, op=dist.ReduceOp.SUM)
                stop, time_up = float(red[0]) > 0, float(red[1]) > 0
                stop_if_failed(probe_stop, float(red[2]), rank=rank, world=world, step=trainer.state.step,
                               folder=output.parent, history=trainer.state.history)
                seconds = trainer.state.last_batch_seconds
                rates = (float(red[3] / red[4]) if red[4] else None, float(red[5]) / seconds if seconds > 0 else None)
                record_rates(trainer.state.history, *rates)
                if progress is not None:
                    progress.step(trainer.state, *rates)
                # At the time limit a run that will continue stops even with its loop done: export,
                # audit and evaluation may not fit before the kill; its continuation does them.
                out_of_time = time_up and (not done or spec.continue_on_timeout)
                periodic = cfg.checkpoint_every and trainer.state.step % cfg.checkpoint_every == 0
                if stop or out_of_time or (periodic and not done):
                    saving = time.time()
                    trainer.save(ckpt, meta={"allocations": [*earlier, _allocation(t0, first_step, first_loop,
                                                                                     trainer.state)]}, nodes=nodes)
                    if trainer.state.history:  # in the history (a later checkpoint and the details carry it)
                        trainer.state.history[-1]["checkpoint_seconds"] = time.time() - saving
                if out_of_time or (stop and not done):
                    if progress is not None:
                        progress.beat(trainer.state)
                        progress.end("KILLED")
                        progress = None
                    if out_of_time:
                        self._stop_at_time_limit(trainer, ckpt, t0, first_step, first_loop, deadline)
                    raise Preempted(f"checkpointed at step {trainer.state.step} in {ckpt}; rerun to resume")
            if progress is not None:
                progress.beat(trainer.state)
            digest, policy_sha256 = trainer.export(policy_dir(output))
            rank_digests: list[str | None] = [None] * world
            dist.all_gather_object(rank_digests, digest)  # the ranks must hold the same policy
            training_seconds = earlier_seconds + time.time() - t0
            t1 = time.time()
            audit = trainer.run_audit()
            audit_seconds = time.time() - t1
            if progress is not None:
                progress.beat(trainer.state)
            t2 = time.time()
            evaluation = trainer.evaluate()
            evaluation_seconds = time.time() - t2
            if progress is not None:
                progress.beat(trainer.state)
            own_elapsed = time.time() - t0
            elapsed = earlier_seconds + own_elapsed
            from .result import build_record

            st = trainer.state
            record = build_record(
                arm=spec.arm, seed=spec.seed, totals=trainer.totals(), templates=trainer.template_totals(),
                steps=st.step, audit_ok=audit.ok, loop_seconds=st.loop_seconds,
                budget_seconds=spec.loop_budget_seconds, last_batch_seconds=st.last_batch_seconds, gpus=spec.allocated_gpus,
                training_seconds=training_seconds, audit_seconds=audit_seconds,
                evaluation_seconds=evaluation_seconds, elapsed_seconds=elapsed)
            shared = [record]
            dist.broadcast_object_list(shared, src=0)  # every rank returns rank 0's record (its clocks)
            record = shared[0]
            reward_counts = trainer.reward_counts()  # collective: every rank's completions math-verify could not parse
            if rank == 0:
                require_valid(entry_key(spec.seed, spec.arm.name), record)
                if progress is not None and progress.tracking is not None:
                    progress.tracking.settle()  # bounded: the details then say for sure whether MLflow tracked it
                details = {"run_key": spec.run_key, "history": st.history, "evaluation": evaluation,
                           # every item trained on (evaluations after training count them as exposed)
                           "trained_item_ids": sorted(trainer.curriculum.trained_items(st.step)),
                           "audit": audit.details(), "reward": {"rewards": list(cfg.task.rewards) if cfg.task else
                                                                ["retrieval_qa"], **reward_counts},
                           "resumed": resumed, "world_size": world, "rollout": cfg.rollout,
                           # Each allocation's share (elapsed s, steps, loop s); this one's elapsed is
                           # what the ledger books on this attempt (the record sums them all).
                           "allocations": [*earlier, {**_allocation(t0, first_step, first_loop, st),
                                                      "elapsed_seconds": own_elapsed}],
                           "allocation_elapsed_seconds": own_elapsed,
                           "zero_stage": cfg.zero_stage, "under_submitit": under_submitit,
                           "rank_policy_sha256": rank_digests, "provenance": provenance,
                           # The trained policy as a Hugging Face directory (from_pretrained loads it).
                           "policy_dir": str(policy_dir(output)), "policy_sha256": policy_sha256,
                           # The prompts' provenance: template sha256, its keywords, one fixed rendering.
                           "model": {"path": cfg.model.path, "resolved": str(trainer.model_dir),
                                     "dtype": cfg.model.dtype, **prompt_provenance(trainer.codec)}
                           if cfg.model is not None else "builtin-byte-gpt2",
                           "data": dataclasses.asdict(cfg.data) if cfg.data is not None else "generated",
                           "tracking": tracking_state(output)}  # MLflow: on (its run), off (why) or none
                output.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(details_of(output), details)
                write_json_atomic(output, record)
                if progress is not None:
                    progress.end("FINISHED", (output, details_of(output)))
                    progress = None
            return record
        except BaseException:
            if progress is not None:
                progress.end("FAILED")
            raise
        finally:
            trainer.close()
            release_process_group()


def release_process_group() -> None:
    """End this process's part in the job's process group, so that another job can run in the same
    process (the debug executor, the embedded queue, tests): destroy the default group (unless a
    colocated vLLM engine's shutdown already did), and forget DeepSpeed's clone of it, which
    DeepSpeed caches for the life of the process and would otherwise hand to the next job's
    engine as a destroyed group ("Group ... is not registered")."""
    import torch.distributed as dist
    from deepspeed.utils import groups

    if dist.is_initialized():
        dist.barrier()  # ZeRO-3 on gloo aborts at exit without it (FACTS.md)
        dist.destroy_process_group()
    groups._WORLD_GROUP = None
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None


def policy_dir(record: Path) -> Path:
    """Where a run exports its trained policy: a Hugging Face directory beside its record."""
    return policy_of(record)


def run_with_budget(spec: RunSpec, budget_seconds: float | None) -> RunSpec:
    return spec if budget_seconds is None else replace(spec, loop_budget_seconds=float(budget_seconds))
