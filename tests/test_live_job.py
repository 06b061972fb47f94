"""A real training job watched live: the local executor runs a 2-rank DeepSpeed job (gloo, tiny
config) while reconcile brings its heartbeats into the ledger, `status` shows its progress,
`ggpo-batch logs -f` follows its output and stops by itself when the attempt ends, and its MLflow
run (a real local SQLite store) holds its step metrics and record."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from ggpo_batch.cli import cli
from ggpo_batch.config.settings import load_settings
from ggpo_batch.contracts.allocation import attempt_folder, record_path
from ggpo_batch.contracts.heartbeat import read_heartbeat
from ggpo_batch.contracts.runspec import RunSpec
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.executor.local import LocalExecutor
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.ledger.heartbeats import attempt_heartbeat
from ggpo_batch.reporting.status import experiment_status
from tests.support.arms import ARMS
from tests.support.paths import REPO
from tests.support.waiting import preempt_after_step

pytestmark = [pytest.mark.train, pytest.mark.slow]

KEY = "live-v1-7-paired"
BUDGET = 15.0
PROGRESS = re.compile(r"running  step (\d+)  (\d+)/15 s")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # one real job is enough; the ledger's part runs
def test_a_running_job_shows_progress_in_status_logs_and_mlflow(env: dict[str, str], db_url: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("GGPO_REDIS_URL", "memory://")
    monkeypatch.setenv("GGPO_MLFLOW_URI", store)  # the local job inherits the environment, as a Slurm job does
    settings = load_settings()
    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    spec = RunSpec(run_key=KEY, experiment="live", experiment_version=1, method="ggpo", arm=ARMS["paired"], seed=7,
                   gpus=4, loop_budget_seconds=BUDGET, executor="local", profile="default", train={})
    led.create_experiment(name="live", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                          actor="t", runs=[NewRun(run_key=KEY, arm="paired", seed=7, config_hash="c",
                                                  run_spec=spec.to_dict())])
    ex = LocalExecutor(settings.jobs_dir, tasks=2)
    folder = attempt_folder(settings.jobs_dir, KEY, 1)
    led.begin_attempt(KEY, executor="local", gpus=4, actor="t", worker="test")
    led.mark_submitted(KEY, 1, job_id=ex.submit(spec, 1, folder), actor="t")
    follower = subprocess.Popen([sys.executable, "-m", "ggpo_batch.cli", "logs", KEY, "-f", "--rank", "0",
                                 "--stream", "stderr"], cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        seen_steps, status_text = [], None
        deadline = time.monotonic() + 420
        while time.monotonic() < deadline:
            reconcile(led, settings, [], actor="t", executors={"local": ex})
            [exp] = experiment_status(led, attention=False)
            [row] = exp["runs"]
            if row["state"] not in ("submitted", "running"):
                break
            hb = row["heartbeat"]
            if row["state"] == "running" and hb is not None:
                assert not row["hung"]
                seen_steps.append(hb["step"])
                if hb["step"] >= 1 and status_text is None:
                    status_text = CliRunner().invoke(cli, ["status"], catch_exceptions=False).output
            time.sleep(1.0)
        assert row["state"] == "succeeded", row
        # while it ran: heartbeats in the ledger, steps never going back, progress in status
        assert seen_steps and seen_steps == sorted(seen_steps) and max(seen_steps) >= 1, seen_steps
        assert status_text is not None and PROGRESS.search(status_text), status_text
        # the final heartbeat was booked before the attempt settled: the record's step count
        record = json.loads(record_path(folder).read_text())
        steps = record["training"]["counts"]["steps"]
        att = led.get_run(KEY).attempts[-1]
        hb = attempt_heartbeat(att)
        on_disk = read_heartbeat(folder)
        assert hb is not None and on_disk is not None and hb.step == steps == on_disk.step
        assert hb.updated_at == pytest.approx(on_disk.updated_at, abs=1e-5)  # the ledger keeps microseconds
        assert hb.loop_seconds == pytest.approx(record["budget"]["loop_seconds"])
        assert hb.mean_reward is not None and 0.0 <= hb.mean_reward <= 1.0 and hb.tokens_per_second > 0
        # logs -f followed rank 0's log and ended by itself once reconcile booked the end
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert "waiting for it" in err or "step 1 loss" in out  # it may have started after the log did
        assert [int(m) for m in re.findall(r"step (\d+) loss", out)] == list(range(1, steps + 1)), out[-2000:]
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        led.engine.dispose()
    # MLflow: one run for the attempt, named and tagged, every step, the record as an artifact
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    [run] = client.search_runs([client.get_experiment_by_name("live").experiment_id])
    assert run.info.run_name == f"{KEY} attempt 1" and run.info.status == "FINISHED"
    assert (run.data.tags["arm"], run.data.tags["seed"], run.data.tags["experiment"]) == ("paired", "7", "live")
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == list(range(1, steps + 1))
    assert len(client.get_metric_history(run.info.run_id, "mean_reward")) == steps
    assert {"record.json", "record.json.details.json"} <= {a.path for a in client.list_artifacts(run.info.run_id)}


def test_a_preempted_job_resumed_in_its_folder_continues_its_mlflow_run(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGUSR1 checkpoints the job and stops it (a preemption); the rerun in the same attempt folder
    (a requeue) resumes training and the same MLflow run, which ends with every step once."""
    pytest.importorskip("mlflow")

    from mlflow.tracking import MlflowClient

    from ggpo_batch.train.run.job import Preempted
    from ggpo_batch.train.run.launch import train_local
    from ggpo_batch.train.run.tracking import run_id_path

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("GGPO_MLFLOW_URI", store)
    out = tmp_path / "jobs" / KEY / "attempt-1" / "record.json"
    log0 = Path(str(out) + ".rank0.log")

    def spec(budget: float) -> RunSpec:
        return RunSpec(run_key=KEY, experiment="requeued", experiment_version=1, method="ggpo", arm=ARMS["paired"],
                       seed=7, gpus=4, loop_budget_seconds=budget, executor="local", profile="default", train={})

    preempt_after_step(log0, 3, within_s=240)
    with pytest.raises(Preempted):
        train_local(spec(300.0), out, nproc=2, timeout=400)
    client = MlflowClient(tracking_uri=store)
    run_id = run_id_path(out).read_text().strip()
    assert client.get_run(run_id).info.status == "KILLED"
    stopped = read_heartbeat(out.parent)
    assert stopped is not None and stopped.step >= 3
    rec = train_local(spec(stopped.loop_seconds + 2.0), out, nproc=2, timeout=400)  # the requeued job
    steps = rec["training"]["counts"]["steps"]
    assert steps > stopped.step and read_heartbeat(out.parent).step == steps  # type: ignore[union-attr]
    [run] = client.search_runs([client.get_experiment_by_name("requeued").experiment_id])
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    logged = [m.step for m in client.get_metric_history(run_id, "loss")]
    assert sorted(logged) == list(range(1, steps + 1)), logged  # both parts, no step twice
    assert "record.json" in {a.path for a in client.list_artifacts(run_id)}
