"""The settle/retry decision, table-driven over every (scheduler end, run state, retries left).

Pure: Run and Attempt are transient ORM objects (no database), the record folder a temp dir; the
last test books a job that stopped itself through `settle` on both ledgers.
The expectations are written out here, not derived from ggpo_batch.contracts.states, so a change to the
state machine that alters an outcome fails this table.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from ggpo_batch.contracts.allocation import record_path
from ggpo_batch.control.settlement import decide, over_allowance, retries_used
from ggpo_batch.executor.base import JobInfo
from ggpo_batch.ledger.schema import Attempt, Run
from tests.support.paths import SEED_000

# scheduler end -> (attempt state, run state when no retry, is an infrastructure cause)
ENDS = {
    "COMPLETED": ("succeeded", "succeeded", False),
    "FAILED": ("failed", "failed", False),
    "OUT_OF_MEMORY": ("failed", "failed", False),
    "TIMEOUT": ("timeout", "timeout", False),
    "DEADLINE": ("timeout", "timeout", False),
    "CANCELLED": ("cancelled", "cancelled", False),
    "PREEMPTED": ("preempted", "failed", True),
    "NODE_FAIL": ("node_fail", "failed", True),
    "BOOT_FAIL": ("node_fail", "failed", True),
    "LOST": ("lost", "lost", True),
    "SOMETHING_NEW": ("failed", "failed", False),  # an unknown scheduler state is a failure
}
RUN_STATES = ("submitted", "running", "cancelled")
# (retries allowed, infrastructure failures already booked)
ALLOWANCES = ((0, 0), (1, 0), (1, 1), (2, 1), (2, 2))


def _seed_record() -> tuple[str, dict]:
    key, rec = next(iter(json.loads(SEED_000.read_text()).items()))
    return key, rec


def _run(state: str, allowed: int, used: int, seed: int, arm: str) -> tuple[Run, Attempt]:
    run = Run(run_key="exp-v1-1-arm", arm=arm, seed=seed, state=state, retries_allowed=allowed)
    earlier = [Attempt(number=i + 1, state="preempted", gpus=4) for i in range(used)]
    current = Attempt(number=used + 1, state="running", gpus=4)
    run.attempts = [*earlier, current]
    return run, current


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One attempt folder with a valid record (seed 000's first run), one with none."""
    key, rec = _seed_record()
    good = tmp_path_factory.mktemp("with-record")
    record_path(good).write_text(json.dumps(rec))
    return {"with": good, "without": tmp_path_factory.mktemp("without-record")}


CASES = list(itertools.product(ENDS, RUN_STATES, ALLOWANCES, ("with", "without")))


@pytest.mark.parametrize("end,run_state,allowance,record", CASES,
                         ids=[f"{e}-{s}-{a[0]}allowed-{a[1]}used-{r}" for e, s, a, r in CASES])
def test_settle_decision_table(end: str, run_state: str, allowance: tuple[int, int], record: str,
                               folders: dict[str, Path]) -> None:
    _key, rec = _seed_record()
    allowed, used = allowance
    run, att = _run(run_state, allowed, used, rec["seed"], rec["arm"])
    out = decide(run, att, JobInfo(job_id="7", state=end, exit_code="0:0"), folders[record])

    attempt_state, final_run_state, infra = ENDS[end]
    if attempt_state == "succeeded" and record == "without":
        attempt_state, final_run_state = "failed", "failed"  # a job that wrote no record did not succeed
    assert out.attempt_state == attempt_state
    assert (out.record is not None) == (attempt_state == "succeeded")

    if run_state == "cancelled":  # cancelled by a person: booked, never moved, never retried
        assert (out.run_state, out.retry) == (None, False)
    elif end == "CANCELLED" and used > allowed:
        assert (out.run_state, out.retry) == ("failed", False)
    elif infra and used + 1 <= allowed:
        assert (out.run_state, out.retry) == (None, True)
        assert f"infrastructure retry {used + 1}/{allowed}" in (out.reason or "")
    else:
        assert (out.run_state, out.retry) == (final_run_state, False)


def test_a_requeue_past_the_allowance_is_cancelled_and_fails_the_run(folders: dict[str, Path]) -> None:
    _key, rec = _seed_record()
    run, att = _run("running", 1, 2, rec["seed"], rec["arm"])  # Slurm requeued twice, spec allows one
    assert retries_used(run) == 2 and over_allowance(run)
    out = decide(run, att, JobInfo(job_id="7", state="CANCELLED"), folders["without"])
    assert out.run_state == "failed" and "past the spec's retries = 1" in (out.reason or "")


def test_a_record_for_another_run_is_refused(folders: dict[str, Path], tmp_path: Path) -> None:
    _key, rec = _seed_record()
    shutil.copy(record_path(folders["with"]), record_path(tmp_path))
    run, att = _run("running", 0, 0, rec["seed"] + 1, rec["arm"])
    out = decide(run, att, JobInfo(job_id="7", state="COMPLETED"), tmp_path)
    assert out.attempt_state == "failed" and out.record is None
    assert "result record invalid" in (out.reason or "")


def test_a_job_that_stopped_itself_fails_with_its_reason_and_is_never_retried(tmp_path: Path) -> None:
    """A failed weight-sync probe (train/run/weight_sync.py stop_if_failed) writes stopped.json: the run
    fails with that reason, a training failure, even with retries left."""
    from ggpo_batch.contracts.allocation import stopped_path

    run, att = _run("running", 2, 0, 1, "clean")
    stopped_path(tmp_path).write_text(json.dumps({"reason": "weight-sync probe: rank 1: the baseline failed",
                                                  "step": 0}))
    out = decide(run, att, JobInfo(job_id="7", state="FAILED", exit_code="1:0"), tmp_path)
    assert (out.attempt_state, out.run_state, out.retry, out.continues) == ("failed", "failed", False, False)
    assert out.reason == "FAILED (exit 1:0): weight-sync probe: rank 1: the baseline failed"
    stopped_path(tmp_path).write_text("not json")
    assert decide(run, att, JobInfo(job_id="7", state="FAILED", exit_code="1:0"), tmp_path).reason == "FAILED (exit 1:0)"


@pytest.mark.redis
def test_a_stopped_run_is_booked_failed_with_its_reason_and_gpu_hours(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """On both ledgers: the attempt of a job that stopped on its weight-sync probe ends failed, the run
    failed with the probe's reason as its cause (retries = 2 left unused: a training failure), the
    allocation's GPU-hours booked from the scheduler's seconds."""
    from ggpo_batch.contracts.allocation import stopped_path
    from ggpo_batch.control.settlement import settle
    from ggpo_batch.ledger import NewRun

    ledger.create_experiment(name="s", version=1, method="ggpo", source="spec", spec_hash="x", spec={}, gpus=4,
                             actor="t", runs=[NewRun(run_key="s-v1-1-x", arm="clean", seed=1, config_hash="h",
                                                     run_spec={}, retries_allowed=2)])
    att = ledger.begin_attempt("s-v1-1-x", executor="slurm", gpus=4, actor="t", worker="w")
    ledger.mark_submitted("s-v1-1-x", att.number, job_id="5", actor="t")
    stopped_path(tmp_path).write_text(json.dumps({"reason": "weight-sync probe: rank 2: the baseline failed: ...",
                                                  "step": 0}))
    run = ledger.get_run("s-v1-1-x")
    out = settle(ledger, run, run.attempts[0], JobInfo("5", "FAILED", elapsed_seconds=90.0, alloc_gpus=4,
                                                       exit_code="1:0"), tmp_path, actor="t", settings=settings)
    assert not out.requeued
    run = ledger.get_run("s-v1-1-x")
    assert run.state == "failed" and run.cause == "FAILED (exit 1:0): weight-sync probe: rank 2: the baseline failed: ..."
    [booked] = run.attempts
    assert booked.state == "failed" and booked.gpu_hours_job == pytest.approx(4 * 90.0 / 3600)
