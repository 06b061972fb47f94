"""The payload of one allocation: `TrainingJob(spec_json, output)()` trains one run, writes its record.

Ranks come from submitit (4 tasks on a 4-GPU node) or from torchrun-style env vars
(RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT; `launch.train_local` sets them). This module
is the edge that reads the environment; nothing below it does.

Preemption: submitit calls `checkpoint()` on rank 0 (its USR2 hook) and requeues the job; the
requeued job resumes from the last checkpoint in `<output>.ckpt/`, written collectively every
`train.checkpoint_every` steps and at once when any rank receives SIGUSR1 or SIGTERM (outside
submitit, the job then exits with `Preempted` and a rerun of the same command resumes).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import submitit

from ..allocation import PREEMPTED_EXIT_CODE, allocation_start, details_of
from ..config import mlflow_uri
from ..errors import GgpoError
from ..heartbeat import Heartbeat, write_heartbeat
from ..netutil import free_port
from ..run_record import entry_key, require_valid
from ..runspec import RunSpec
from .config import TrainConfig
from .deepspeed_import import import_deepspeed

log = logging.getLogger(__name__)
# Seconds between two heartbeats (and MLflow writes) at most; every step in between is still logged.
HEARTBEAT_EVERY_SECONDS = 5.0
# Step figures kept in MLflow from the history entry of each step.
_STEP_METRICS = ("loss", "gradient_norm", "retained_groups", "raw_gap", "mean_length", "loop_seconds",
                 "logprob_gap_mean", "logprob_gap_p99", "clip_fraction", "kl")


class Preempted(GgpoError):
    """The job checkpointed on a preemption signal and stopped; rerun it to resume."""

    exit_code = PREEMPTED_EXIT_CODE


def _distributed_env() -> tuple[int, int, int, bool]:
    """(rank, world, local_rank, under_submitit); exports MASTER_* for torch's env:// init."""
    try:
        # overwrite: inside a submitit job its task environment is the truth. Stale RANK/WORLD_SIZE/
        # LOCAL_WORLD_SIZE inherited from the submitting process (an in-process vLLM engine sets
        # LOCAL_WORLD_SIZE) made export() refuse, and every task then trained alone as rank 0 of 1.
        env = submitit.helpers.TorchDistributedEnvironment().export(overwrite=True)
        return env.rank, env.world_size, env.local_rank, True
    except RuntimeError:  # not inside a submitit job (or submitit's debug executor): torchrun-style env
        if "RANK" not in os.environ:  # a lone process: rank 0 of 1, on a free local port
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(free_port()))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        return (int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1")),
                int(os.environ.get("LOCAL_RANK", "0")), False)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def preload() -> None:
    """Import torch, DeepSpeed (on the CPU accelerator where there is no GPU) and the trainer."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import_deepspeed()

    from . import trainer  # noqa: F401


def init_process_group(cuda: bool) -> None:
    """This rank's process group through DeepSpeed: NCCL on GPUs, gloo on CPU (DeepSpeed imported
    by deepspeed_import, which switches off its shared-memory op on CPU)."""
    import_deepspeed(cuda).init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False)


class Progress:
    """Rank 0's live view of the run: the heartbeat in the attempt folder and, when tracking is on,
    the step metrics of the attempt's MLflow run (ggpo_batch/tracking.py), both written after a step
    at most every HEARTBEAT_EVERY_SECONDS and at every phase boundary. From the loop itself, not a
    timer: a job stuck in a collective stops beating, and status flags it hung."""

    def __init__(self, folder: Path, budget_seconds: float, tracking: Any = None) -> None:
        self.folder, self.budget_seconds, self.tracking = folder, budget_seconds, tracking
        self.pending: list[dict[str, Any]] = []
        self.mean_reward: float | None = None
        self.tokens_per_second: float | None = None
        self._written = 0.0

    def step(self, st: Any, mean_reward: float | None, tokens_per_second: float | None) -> None:
        """After a step: its figures are queued for MLflow, the heartbeat written when due."""
        self.mean_reward, self.tokens_per_second = mean_reward, tokens_per_second
        last = st.history[-1] if st.history else {}
        self.pending.append({"step": st.step, **{k: last.get(k) for k in _STEP_METRICS},
                             "mean_reward": mean_reward, "tokens_per_second": tokens_per_second})
        if time.monotonic() - self._written >= HEARTBEAT_EVERY_SECONDS:
            self.beat(st)

    def beat(self, st: Any) -> None:
        """Write the heartbeat now (and the queued step metrics)."""
        hb = Heartbeat(step=st.step, loop_seconds=st.loop_seconds, budget_seconds=self.budget_seconds,
                       mean_reward=self.mean_reward, tokens_per_second=self.tokens_per_second, updated_at=time.time())
        try:
            write_heartbeat(self.folder, hb)
        except OSError as exc:  # a full or read-only disk costs the live view, never the run
            log.warning("heartbeat not written to %s: %s", self.folder, exc)
        self._written = time.monotonic()
        if self.tracking is not None and self.pending:
            self.tracking.log_steps(self.pending)
        self.pending = []

    def end(self, status: str, files: tuple[Path, ...] = ()) -> None:
        """The attempt ended (FINISHED with its record, KILLED on a preemption, FAILED)."""
        if self.tracking is None:
            return
        if status == "FINISHED":
            self.tracking.finish(files)
        else:
            self.tracking.stop(status)


def _step_figures(trainer: Any, tokens_before: int) -> list[float]:
    """This rank's share of the last step's figures, summed over ranks with the stop flag:
    reward sum, trajectories, generated tokens."""
    rewards = [t.reward for t in trainer.evidence[-1].trajectories] if trainer.evidence else []
    return [float(sum(rewards)), float(len(rewards)),
            float(trainer.state.tally["backend_generated_tokens"] - tokens_before)]


class TrainingJob(submitit.helpers.Checkpointable):
    def __init__(self, spec_json: str, output: str) -> None:
        self.spec_json = spec_json
        self.output = output
        self._stop_requested = False

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """submitit's preemption hook (rank 0, inside a signal handler: no collectives possible)."""
        self._stop_requested = True
        return submitit.helpers.DelayedSubmission(TrainingJob(self.spec_json, self.output))

    def _on_signal(self, signum: int, frame: Any) -> None:
        log.warning("signal %s: checkpointing at the end of the batch in flight", signal.Signals(signum).name)
        self._stop_requested = True

    def __call__(self) -> dict[str, Any]:
        t0 = allocation_start()
        rank, world, local_rank, under_submitit = _distributed_env()
        preload()
        import torch
        import torch.distributed as dist

        from .trainer import Trainer

        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{rank} %(name)s %(message)s")
        spec = RunSpec.from_json(self.spec_json)
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
        output, ckpt = Path(self.output), Path(self.output + ".ckpt")
        trainer = Trainer(spec, cfg, rank=rank, world=world, device=device,
                          budget_seconds=spec.loop_budget_seconds)
        progress: Progress | None = None
        try:
            resumed = trainer.load(ckpt)
            # Elapsed time of earlier attempts (up to their checkpoint) stays on the bill.
            t0 -= trainer.state.prior_elapsed_seconds if resumed else 0.0
            if rank == 0:
                from ..tracking import Tracking

                progress = Progress(output.parent, spec.loop_budget_seconds,
                                    Tracking.start(mlflow_uri(), spec, output))
                progress.beat(trainer.state)
            # Opening the MLflow run (a new SQLite store builds its schema: seconds) stays out of the
            # loop: the other ranks wait here, not inside the first step's collectives.
            dist.barrier()
            done = bool(trainer.state.step) and trainer.state.loop_seconds >= spec.loop_budget_seconds
            while not done:
                tokens_before = trainer.state.tally["backend_generated_tokens"]
                done = trainer.step()
                # One reduction: the stop flag and the step's figures (NCCL reduces device tensors only).
                red = torch.tensor([float(self._stop_requested), *_step_figures(trainer, tokens_before)],
                                   dtype=torch.float64, device=device)
                dist.all_reduce(red, op=dist.ReduceOp.SUM)
                stop = float(red[0]) > 0
                if progress is not None:
                    seconds = trainer.state.last_batch_seconds
                    progress.step(trainer.state, float(red[1] / red[2]) if red[2] else None,
                                  float(red[3]) / seconds if seconds > 0 else None)
                periodic = cfg.checkpoint_every and trainer.state.step % cfg.checkpoint_every == 0
                if stop or (periodic and not done):
                    trainer.state.prior_elapsed_seconds = time.time() - t0
                    trainer.save(ckpt)
                if stop and not done:
                    if progress is not None:
                        progress.beat(trainer.state)
                        progress.end("KILLED")
                        progress = None
                    raise Preempted(f"checkpointed at step {trainer.state.step} in {ckpt}; rerun to resume")
            if progress is not None:
                progress.beat(trainer.state)
            digest, policy_sha256 = trainer.export(policy_dir(output))
            rank_digests: list[str | None] = [None] * world
            dist.all_gather_object(rank_digests, digest)  # the ranks must hold the same policy
            training_seconds = time.time() - t0
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
            elapsed = time.time() - t0
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
            if rank == 0:
                require_valid(entry_key(spec.seed, spec.arm.name), record)
                details = {"run_key": spec.run_key, "history": st.history, "evaluation": evaluation,
                           "audit": audit.details(),
                           "resumed": resumed, "world_size": world, "rollout": cfg.rollout,
                           "zero_stage": cfg.zero_stage, "under_submitit": under_submitit,
                           "rank_policy_sha256": rank_digests,
                           # The trained policy as a Hugging Face directory (from_pretrained loads it).
                           "policy_dir": str(policy_dir(output)), "policy_sha256": policy_sha256,
                           "model": {"path": cfg.model.path, "resolved": str(trainer.model_dir),
                                     "dtype": cfg.model.dtype} if cfg.model is not None else "builtin-byte-gpt2",
                           "data": dataclasses.asdict(cfg.data) if cfg.data is not None else "generated"}
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
    return Path(str(record) + ".policy")


def run_with_budget(spec: RunSpec, budget_seconds: float | None) -> RunSpec:
    return spec if budget_seconds is None else replace(spec, loop_budget_seconds=float(budget_seconds))
