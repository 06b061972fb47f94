"""Resume is exact: a run stopped after its second step (steps left to spare, so a quick machine
cannot end the run before the signal lands) and run again equals the uninterrupted run to 1e-6 in
every step's loss, gradient norm and groups, with the same counts and the same final policy;
a resume on another world size is refused; and each piece of state the checkpoint carries is needed
(dropping any one of them, through the save's `omit` test seam, makes the resume differ).

What a checkpoint need not carry, and so no test plants its omission: the curriculum and the sampling
seeds are pure functions of (seed, step, rank) (`test_the_curriculum_is_a_pure_function_of_seed_and_step`;
the sampler's seed is computed from the same three in `Trainer._rollouts`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")

from ggpo_batch.contracts.allocation import details_of
from ggpo_batch.errors import GgpoError
from ggpo_batch.train.audit.checkpoint import META_NAME, PARTS, REFERENCE_NAME
from ggpo_batch.train.run.job import Preempted
from ggpo_batch.train.run.launch import train_local
from tests.support.twins import assert_same_run, step_differences
from tests.support.waiting import preempt_after_step
from tests.train.conftest import make_spec
from tests.train.hf.conftest import one_rank  # noqa: F401 (a fixture: one gloo rank in this process)

pytestmark = [pytest.mark.train, pytest.mark.slow]

def run_pair(tmp_path: Path, spec: Any, *, nproc: int = 2, after_step: int = 2,
             wrong_world: int | None = None) -> tuple[dict, dict, dict, dict]:
    """(twin record, twin details, resumed record, resumed details): the twin runs uninterrupted; the
    other is preempted (SIGUSR1) after `after_step` and run again (first on `wrong_world` ranks, which
    must be refused, when given)."""
    twin_out = tmp_path / "twin" / "record.json"
    twin = train_local(spec, twin_out, nproc=nproc, timeout=600)
    out = tmp_path / "resumed" / "record.json"
    out.parent.mkdir(parents=True)
    preempt_after_step(Path(f"{out}.rank0.log"), after_step, within_s=300)
    with pytest.raises(Preempted):
        train_local(spec, out, nproc=nproc, timeout=600)
    meta = json.loads((Path(f"{out}.ckpt") / META_NAME).read_text())
    assert meta["step"] >= after_step and meta["world_size"] == nproc and meta["parts"] == list(PARTS)
    # ZeRO-2: the reference written once, by rank 0, and read back by every rank
    tag = Path(f"{out}.ckpt") / meta["tag"]
    assert (tag / REFERENCE_NAME).is_file()
    for r in range(nproc):
        import torch

        from ggpo_batch.train.audit import checkpoint_pickle

        loop = torch.load(tag / f"loop_rank{r}.pt", weights_only=False, pickle_module=checkpoint_pickle)
        assert loop["reference"] is None and loop["reference_file"] == REFERENCE_NAME
    if wrong_world is not None:
        with pytest.raises(GgpoError) as refused:
            train_local(spec, out, nproc=wrong_world, timeout=600)
        line = str(refused.value)
        assert "\n" not in line and f"written by {nproc} ranks" in line and f"this job has {wrong_world} rank" in line
        assert json.loads((Path(f"{out}.ckpt") / META_NAME).read_text()) == meta  # the checkpoint untouched
    resumed = train_local(spec, out, nproc=nproc, timeout=600)
    return (twin, json.loads(details_of(twin_out).read_text()), resumed, json.loads(details_of(out).read_text()))


def test_a_preempted_two_rank_run_resumes_exactly_and_refuses_another_world_size(tmp_path: Path) -> None:
    """torch rollouts, ZeRO-2, 2 gloo ranks; about 70 s."""
    spec = make_spec("paired_answer", budget=600.0, max_steps=6, reference_refresh_steps=2)
    twin, td, resumed, rd = run_pair(tmp_path, spec, wrong_world=1)
    assert_same_run(twin, td, resumed, rd, steps=6)
    # The record bills both allocations; each one's share is in the details (the ledger books them apart).
    first, second = rd["allocations"]
    # The signal is sent once rank 0 has logged step 2; the ranks stop at the first step end whose
    # stop flag (summed over them) carries it: step 2's own when rank 1 reached that sum after the
    # signal (a loaded machine; seen in a full run), a later one otherwise.
    assert (first["from_step"], second["to_step"]) == (0, 6) and first["to_step"] == second["from_step"] >= 2
    assert resumed["timing"]["elapsed_seconds"] == pytest.approx(first["elapsed_seconds"] + second["elapsed_seconds"])
    assert rd["allocation_elapsed_seconds"] == second["elapsed_seconds"]
    assert resumed["budget"]["loop_seconds"] == pytest.approx(first["loop_seconds"] + second["loop_seconds"])


# -- each part of the checkpoint is needed: the trainer in this process, one rank ------------------


def _trainer(spec: Any) -> Any:
    import torch

    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.run.trainer import Trainer

    return Trainer(spec, TrainConfig.from_table(spec.train, "<test>"), rank=0, world=1, device=torch.device("cpu"),
                   budget_seconds=spec.loop_budget_seconds)


def _snapshot(trainer: Any) -> dict[str, Any]:
    st = trainer.state
    return {"history": [dict(h) for h in st.history], "totals": trainer.totals(),
            "templates": trainer.template_totals(), "exposed": sorted(st.exposed_items), "aux_seen": sorted(st.aux_seen),
            "evidence_steps": [e.step for e in trainer.evidence], "loop_seconds": st.loop_seconds}


def differences(twin: dict[str, Any], resumed: dict[str, Any], loop_at_save: float,
                loop_at_load: float) -> dict[str, list[str]]:
    """What differs between a resumed trainer and its twin, by the check that finds it."""
    found = {
        "step figures": step_differences(twin["history"], resumed["history"]),
        "record counters": [f"{k}: {twin['totals'][k]} vs {resumed['totals'][k]}" for k in twin["totals"]
                            if twin["totals"][k] != resumed["totals"][k]],
        "exposure": [k for k in ("templates", "exposed", "aux_seen") if twin[k] != resumed[k]],
        "audit evidence": [] if resumed["evidence_steps"] == twin["evidence_steps"] else [str(resumed["evidence_steps"])],
        # the loop budget spans the resume: the loop seconds go on from where they were saved
        "loop seconds": [] if loop_at_load == loop_at_save and all(
            a["loop_seconds"] < b["loop_seconds"] for a, b in zip(resumed["history"], resumed["history"][1:]))
        else [f"saved {loop_at_save}, resumed with {loop_at_load}"],
    }
    found["history"] = [] if [h["step"] for h in resumed["history"]] == list(range(len(twin["history"]))) else \
        [str([h["step"] for h in resumed["history"]])]
    return {k: v for k, v in found.items() if v}


# The check that must catch each omission.
CAUGHT_BY = {"optimizer": "step figures", "reference": "step figures", "counters": "record counters",
             "exposure": "exposure", "loop_seconds": "loop seconds", "history": "history",
             "audit_evidence": "audit evidence"}


@pytest.fixture
def one_thread():  # type: ignore[no-untyped-def]
    """Torch on one thread in this process, as a job's ranks are (OMP_NUM_THREADS=1): on a loaded
    machine its default two threads made these steps ten times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _as_older_release(whole: Path, older: Path) -> None:
    """A copy of the checkpoint `whole` as a release before the shared reference file wrote it: the
    reference inside the rank's own loop file, no reference.pt."""
    import shutil

    import torch

    from ggpo_batch.train.audit import checkpoint_pickle

    shutil.copytree(whole, older)
    tag = older / json.loads((older / META_NAME).read_text())["tag"]
    loop = torch.load(tag / "loop_rank0.pt", weights_only=False, pickle_module=checkpoint_pickle)
    assert loop["reference"] is None and loop.pop("reference_file") == REFERENCE_NAME  # one rank wrote it once
    loop["reference"] = torch.load(tag / REFERENCE_NAME, weights_only=True)
    torch.save(loop, tag / "loop_rank0.pt")
    (tag / REFERENCE_NAME).unlink()


def test_every_part_of_the_checkpoint_is_needed_for_an_exact_resume(tmp_path: Path, one_rank: None,  # noqa: F811
                                                                    one_thread: None) -> None:
    """One trainer runs 6 steps; another runs 3, saves a checkpoint whole and once without each part;
    a fresh trainer resumes from each and runs the other 3. The whole checkpoint resumes to the twin;
    each omission is caught (by the check CAUGHT_BY names). About 20 s."""
    assert set(CAUGHT_BY) == set(PARTS)
    spec = make_spec("paired_answer", budget=600.0, reference_refresh_steps=2, kl_coef=0.2, lr=0.01)
    twin = _trainer(spec)
    for _ in range(6):
        twin.step()
    expected = _snapshot(twin)
    twin.close()
    stopped = _trainer(spec)
    for _ in range(3):
        stopped.step()
    loop_at_save = stopped.state.loop_seconds
    for omit in ("", *PARTS):
        stopped.save(tmp_path / (omit or "whole"), omit=(omit,) if omit else ())
    stopped.close()
    _as_older_release(tmp_path / "whole", tmp_path / "older")
    seen = {}
    for omit in ("", "older", *PARTS):
        resumed = _trainer(spec)
        assert resumed.load(tmp_path / (omit or "whole")) is not None
        loop_at_load = resumed.state.loop_seconds
        for _ in range(3):
            resumed.step()
        seen[omit] = differences(expected, _snapshot(resumed), loop_at_save, loop_at_load)
        resumed.close()
    assert seen[""] == {}, seen[""]
    assert seen["older"] == {}, seen["older"]  # a checkpoint written before the shared reference file
    for part in PARTS:
        assert CAUGHT_BY[part] in seen[part], (part, seen[part])
    print("\n" + "\n".join(f"omit {p}: caught by {', '.join(sorted(seen[p]))}" for p in PARTS))


def test_the_curriculum_is_a_pure_function_of_seed_and_step() -> None:
    """Why a checkpoint carries no curriculum or sampler state: asked in any order, by any rank,
    two curricula of one seed give every step the same groups (and another seed other ones)."""
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.task.curriculum import Curriculum
    from ggpo_batch.train.task.qa import load
    from tests.support.arms import ARMS

    cfg = TrainConfig()
    data = load(cfg)

    def groups(seed: int, steps: list[int]) -> dict[int, list]:
        c = Curriculum(ARMS["random_answer"], data, group_size=cfg.group_size, prompts_per_step=cfg.prompts_per_step,
                       exposures_per_step=cfg.exposures_per_step, seed=seed)
        return {s: [[(i.item_id, t) for i, t in g.parts] for g in c.step_groups(s)] for s in steps}

    forward, backward = groups(7, list(range(8))), groups(7, list(reversed(range(8))))
    assert forward == backward
    assert groups(8, list(range(8))) != forward
