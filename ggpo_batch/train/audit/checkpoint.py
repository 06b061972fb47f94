"""A run's resumable checkpoint: what it carries, how it is written so that a job killed while saving
leaves the previous checkpoint whole, and what a resume checks first (the world it was written by).

Layout of the folder: one `step<N>/` per save (DeepSpeed's engine files; each rank's `loop_rank<r>.pt`:
loop state, audit evidence, and under ZeRO-3 its reference weights; under ZeRO-0/1/2 the reference
once, rank 0's `reference.pt`, which every rank reads), and `checkpoint.json`, written by
rank 0 after every rank has saved: the commit point. It names the complete save and carries the
job's own bookkeeping (the allocations that produced it). Older `step<N>/` folders go after it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from ...errors import GgpoError

if TYPE_CHECKING:
    from .audit import StepEvidence

log = logging.getLogger(__name__)

FORMAT = 1
META_NAME = "checkpoint.json"
# What a checkpoint carries besides the model's weights and the step, each needed for a resume to
# equal the uninterrupted run (tests/train/test_resume.py drops each in turn and sees it fail):
# the optimizer's moments, the reference policy (refreshed every K steps), the record's counters
# (token counts, costs), the exposure bookkeeping (templates, exposed items, aux answers used),
# the loop seconds spent against the budget, the per-step history, and the audit's evidence.
# What a checkpoint need not carry: sampling seeds and the curriculum are pure functions of
# (seed, step, rank).
REFERENCE_NAME = "reference.pt"  # the reference written once by rank 0 (ZeRO-0/1/2), in the step's folder
PARTS = ("optimizer", "reference", "counters", "exposure", "loop_seconds", "history", "audit_evidence")


@dataclass
class LoopState:
    """Everything a resumed job needs to continue the loop exactly where it stopped (per rank)."""

    step: int = 0
    loop_seconds: float = 0.0
    last_batch_seconds: float = 0.0
    tally: Counter = field(default_factory=Counter)  # local counts, costs and aux sources
    templates: Counter = field(default_factory=Counter)
    aux_seen: set = field(default_factory=set)
    history: list = field(default_factory=list)
    exposed_items: set = field(default_factory=set)  # ids of items this rank trained in an exposure group


class Checkpointed(Protocol):
    """What a checkpoint saves and restores of a trainer (run/trainer.py's Trainer is one)."""

    engine: Any  # the DeepSpeed engine: its own checkpoint holds the weights and the optimizer
    state: LoopState
    evidence: list[StepEvidence]
    reference: Any  # the frozen reference policy (policy/reference.py): its state_dict is saved
    rank: int
    world: int


class WorldSizeChanged(GgpoError):
    """The checkpoint was written by another number of ranks or nodes than this job has."""


def _tag(step: int) -> str:
    return f"step{step}"


def read_meta(folder: Path) -> dict[str, Any] | None:
    """The committed checkpoint's description (None when the folder holds no complete checkpoint)."""
    try:
        meta = json.loads((Path(folder) / META_NAME).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise GgpoError(f"{Path(folder) / META_NAME}: checkpoint description unreadable: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise GgpoError(f"{Path(folder) / META_NAME}: not a checkpoint of format {FORMAT}")
    return meta


def _without(state: LoopState, omit: Iterable[str]) -> LoopState:
    """`state` with the parts named in `omit` as a fresh job has them."""
    dropped: dict[str, Any] = {}
    if "counters" in omit:
        dropped["tally"] = Counter()
    if "exposure" in omit:
        dropped.update(templates=Counter(), exposed_items=set(), aux_seen=set())
    if "loop_seconds" in omit:
        dropped.update(loop_seconds=0.0, last_batch_seconds=0.0)
    if "history" in omit:
        dropped["history"] = []
    return dataclasses.replace(state, **dropped) if dropped else state


def save(trainer: Checkpointed, folder: Path, *, meta: Mapping[str, Any] | None = None, nodes: int = 1,
         omit: Iterable[str] = ()) -> None:
    """Write a checkpoint of `trainer` (collective: every rank calls it), with `meta` in its
    description. `omit` is a test seam: the parts named are not carried (see PARTS)."""
    omit = set(omit)
    if omit - set(PARTS):
        raise ValueError(f"unknown checkpoint parts {sorted(omit - set(PARTS))} (known: {', '.join(PARTS)})")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tag = _tag(trainer.state.step)
    trainer.engine.save_checkpoint(str(folder), tag=tag, save_latest=False)
    # The reference: under ZeRO-0/1/2 every rank holds the same whole copy, so rank 0 writes it once
    # (REFERENCE_NAME) and every rank reads that file back: a 1.7B model's save was four identical
    # 3.4 GB copies (38 GB with the rest, 28 GB with one), inside the time limit's signal window.
    # Under ZeRO-3 each rank's state_dict gathers the whole weights anyway: it stays in its own file.
    shared = "reference" not in omit and trainer.reference.zero_stage < 3
    if shared and trainer.rank == 0:
        torch.save(trainer.reference.state_dict(), folder / tag / REFERENCE_NAME)
    own = None if "reference" in omit or shared else trainer.reference.state_dict()
    torch.save({"state": _without(trainer.state, omit),
                "evidence": [] if "audit_evidence" in omit else trainer.evidence,
                "reference": own, "reference_file": REFERENCE_NAME if shared else None},
               folder / tag / f"loop_rank{trainer.rank}.pt")
    dist.barrier()  # every rank's files are written before the description names them
    if trainer.rank == 0:
        desc = {"format": FORMAT, "tag": tag, "step": trainer.state.step, "world_size": trainer.world, "nodes": nodes,
                "parts": [p for p in PARTS if p not in omit], **(meta or {})}
        tmp = folder / f".{META_NAME}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(desc, indent=2) + "\n")
        os.replace(tmp, folder / META_NAME)
        for old in folder.glob("step*"):
            if old.is_dir() and old.name != tag:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def amend_last_allocation(folder: Path, share: Mapping[str, Any]) -> None:
    """Replace the last allocation in the committed checkpoint's account with `share` (rank 0, after
    the save): the allocation's seconds through the save itself, which its time-limit note repeats."""
    folder = Path(folder)
    meta = read_meta(folder)
    if meta is None or not meta.get("allocations"):
        return
    meta["allocations"][-1] = dict(share)
    tmp = folder / f".{META_NAME}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, folder / META_NAME)


def load(trainer: Checkpointed, folder: Path, *, nodes: int = 1) -> dict[str, Any] | None:
    """Resume `trainer` from the checkpoint in `folder` (collective); its description, or None when
    there is none. A checkpoint of another world size is refused (WorldSizeChanged), naming both."""
    folder = Path(folder)
    meta = read_meta(folder)
    if meta is None:
        if (folder / "loop_rank0.pt").exists():
            log.warning("%s holds a checkpoint of an older release (no %s): not resumed", folder, META_NAME)
        return None
    if (meta["world_size"], meta.get("nodes", 1)) != (trainer.world, nodes):
        raise WorldSizeChanged(
            f"{folder}: the checkpoint was written by {meta['world_size']} ranks on {meta.get('nodes', 1)} node(s), "
            f"this job has {trainer.world} rank(s) on {nodes} node(s): resuming on another world size is refused "
            f"(resume it on {meta['world_size']} ranks, or remove the checkpoint to start the run again)")
    parts = set(meta["parts"])
    optimizer = "optimizer" in parts
    trainer.engine.load_checkpoint(str(folder), tag=meta["tag"], load_optimizer_states=optimizer,
                                   load_lr_scheduler_states=optimizer)
    from . import checkpoint_pickle  # classes pickled under their paths before a move

    saved = torch.load(folder / meta["tag"] / f"loop_rank{trainer.rank}.pt", weights_only=False,
                       pickle_module=checkpoint_pickle)
    trainer.state, trainer.evidence = saved["state"], saved["evidence"]
    if saved["reference"] is not None:  # a rank's own copy (ZeRO-3, or a checkpoint from before the shared file)
        trainer.reference.load_state_dict(saved["reference"])
    elif saved.get("reference_file"):
        trainer.reference.load_state_dict(torch.load(folder / meta["tag"] / saved["reference_file"],
                                                     map_location="cpu", weights_only=True, mmap=True))
    return meta
