"""`ggpo-batch logs` of a real Slurm job: submitit's per-rank files in the attempt folder, found from
the ledger's attempt (executor slurm, its job id), every rank of the allocation."""

from __future__ import annotations

import os
import sys

import cloudpickle
import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts.allocation import attempt_folder
from ggpo_batch.executor.base import job_name
from ggpo_batch.executor.slurm import job_comment
from ggpo_batch.ledger import NewRun
from tests.support.slurm import final, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def say_hello() -> int:
    rank = os.environ.get("SLURM_PROCID", "?")
    print(f"hello from rank {rank}", flush=True)
    print(f"rank {rank} complains", file=sys.stderr, flush=True)
    return 0


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the allocation cannot import the tests


def test_logs_shows_every_rank_of_a_slurm_job(executor, ledger, env, tag, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GGPO_REDIS_URL", "memory://")
    key = f"{tag}-v1-1-clean"
    ledger.create_experiment(name=tag, version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                             actor="t", runs=[NewRun(run_key=key, arm="clean", seed=1, config_hash="c", run_spec={})])
    ledger.begin_attempt(key, executor="slurm", gpus=4, actor="t", worker="w")
    folder = attempt_folder(env["GGPO_DATA_DIR"] + "/jobs", key, 1)
    job_id = executor.submit_callable(say_hello, job_name(key, 1), job_comment(key, 1), folder=folder, time=2)
    ledger.mark_submitted(key, 1, job_id=job_id, actor="t")
    assert wait_for(executor, job_id, final, 120).state == "COMPLETED"
    res = CliRunner().invoke(cli, ["logs", key])
    assert res.exit_code == 0, res.output
    for rank in range(executor.profile.tasks_per_node):
        assert f"hello from rank {rank}" in res.output and f"rank {rank} complains" in res.output
        assert f"==> {folder}/{job_id}_{rank}_log.out <==" in res.output
    res = CliRunner().invoke(cli, ["logs", key, "--rank", "2", "--stream", "stdout"])
    assert "hello from rank 2\n" in res.output and "==>" not in res.output  # one file: no header
    assert not [r for r in (0, 1, 3) if f"hello from rank {r}" in res.output] and "complains" not in res.output
