"""Priorities and one person's GPU quota on the real dev Slurm, with a real worker and real jobs."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.executor.sacct import run_command
from ggpo_batch.spec.parse import load_spec
from tests.support.specs import write_spec

pytestmark = [pytest.mark.slurm, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]


def _nice(job_id: str) -> int:
    out = run_command(["scontrol", "show", "job", job_id])
    return int(re.search(r"\bNice=(-?\d+)", out).group(1))  # type: ignore[union-attr]


def test_two_users_mixed_priorities_highest_first_and_one_run_each_in_flight(
        dev_cluster, ledger, settings, worker_env, tmp_path: Path, tag: str) -> None:  # type: ignore[no-untyped-def]
    """alice enqueues a low run, then a normal one; bob then a high one. With GGPO_USER_GPU_QUOTA=4 (one
    4-GPU run per person in flight) one burst worker sbatches bob's high run first, then alice's
    normal one, and defers her low one (her quota, not the queue's: bob's run went) until her normal
    run has ended; the low run reaches Slurm with the dev profile's `--nice=1000`. Every run succeeds."""
    from ggpo_batch.control.worker import run_worker

    # the dev profiles' nodes hold 4 GPUs each: only the user quota keeps alice's two runs apart
    settings = dataclasses.replace(settings, user_gpu_quota=4, defer_seconds=1)
    keys = {}
    for who, label, priority in (("alice", "lo", "low"), ("alice", "mid", "normal"), ("bob", "hi", "high")):
        spec = load_spec(write_spec(tmp_path, f"{label}-{tag}", seeds=[1], profile="dev-cluster-1task"))
        keys[label] = enqueue_spec(ledger, settings, spec, actor=who, priority=priority).runs[0].run_key
    run_worker(settings, [settings.queue], burst=True, reconcile_interval=5, settle_timeout=200)
    runs = {label: ledger.get_run(key) for label, key in keys.items()}
    assert {label: (r.state, r.priority) for label, r in runs.items()} == {
        "lo": ("succeeded", "low"), "mid": ("succeeded", "normal"), "hi": ("succeeded", "high")}, \
        {label: r.cause for label, r in runs.items()}
    first = {label: r.attempts[0] for label, r in runs.items()}
    assert all(len(r.attempts) == 1 for r in runs.values())  # deferred, never failed: no extra attempt
    assert first["hi"].submitted_at < first["mid"].submitted_at < first["lo"].submitted_at
    assert first["lo"].submitted_at >= first["mid"].ended_at  # alice never had two runs in flight
    deferrals = [e.reason for e in ledger.events(run_key=keys["lo"]) if e.reason and "deferred" in e.reason]
    assert deferrals and all("user alice: 4 GPUs in flight + 4 > quota 4" in d for d in deferrals)
    assert not any("deferred" in (e.reason or "") for e in ledger.events(run_key=keys["hi"]))
    assert {label: _nice(a.job_id) for label, a in first.items()} == {"lo": 1000, "mid": 0, "hi": 0}
