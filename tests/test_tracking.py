"""MLflow tracking (ggpo_batch/train/run/tracking.py) against a real local SQLite store, read back with
MlflowClient: one run per attempt, named and tagged, step metrics, the record as an artifact, and a
requeued attempt continuing its own run. A real training job with tracking on: tests/test_live_job.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient

from ggpo_batch.contracts.runspec import RunSpec
from ggpo_batch.train.run.tracking import Tracking, attempt_number, mlflow_run_name, run_id_path
from tests.support.arms import ARMS
from tests.support.paths import REPO


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One store for the module, its schema built here (seconds; more on a loaded machine), so that
    each test's `Tracking.start` opens its run within the job's wait (tracking.OPEN_WAIT_SECONDS)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()
    return uri


def _spec(experiment: str, arm: str = "paired", seed: int = 7) -> RunSpec:
    return RunSpec(run_key=f"{experiment}-v1-{seed}-{arm}", experiment=experiment, experiment_version=1, method="ggpo",
                   arm=ARMS[arm], seed=seed, gpus=4, loop_budget_seconds=6.0, executor="local", profile="default",
                   train={})


def _runs(store: str, experiment: str) -> list:  # type: ignore[type-arg]
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id])


def _record(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / "record.json"
    record.write_text(json.dumps({"arm": "paired", "seed": 7}))
    return record


def test_one_run_per_attempt_named_tagged_with_steps_and_the_record(store: str, tmp_path: Path) -> None:
    spec = _spec("trk-one")
    record = _record(tmp_path / spec.run_key / "attempt-2")
    t = Tracking.start(store, spec, record)
    assert t is not None and run_id_path(record).read_text().strip() == t.run_id
    t.log_steps([{"step": 1, "loss": 0.5, "mean_reward": 0.25, "tokens_per_second": 100.0, "gradient_norm": None},
                 {"step": 2, "loss": 0.4, "mean_reward": float("nan"), "tokens_per_second": 120.0}])
    t.finish([record, tmp_path / "absent.json"])
    [run] = _runs(store, "trk-one")
    assert run.info.run_name == f"{spec.run_key} attempt 2" and run.info.status == "FINISHED"
    tags = run.data.tags
    assert (tags["experiment"], tags["arm"], tags["seed"], tags["attempt"], tags["run_key"]) == (
        "trk-one", "paired", "7", "2", spec.run_key)
    client = MlflowClient(tracking_uri=store)
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(1, 0.5), (2, 0.4)]
    # NaN and None are not values: left out, not logged as 0
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "mean_reward")] == [(1, 0.25)]
    assert "gradient_norm" not in run.data.metrics
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["record.json"]
    # the artifacts sit beside the SQLite store, not in ./mlruns of whatever folder the job ran in
    assert client.get_experiment_by_name("trk-one").artifact_location.startswith(
        Path(store[len("sqlite:///"):]).parent.resolve().as_uri())


def test_a_requeued_attempt_continues_its_own_run(store: str, tmp_path: Path) -> None:
    spec = _spec("trk-requeue")
    record = _record(tmp_path / "attempt-1")
    first = Tracking.start(store, spec, record)
    assert first is not None
    first.log_steps([{"step": s, "loss": 1.0 / s} for s in (1, 2, 3)])
    first.stop("KILLED")  # preempted: the job checkpointed and stopped
    assert _runs(store, "trk-requeue")[0].info.status == "KILLED"
    again = Tracking.start(store, spec, record)  # the requeued job, same attempt folder
    assert again is not None and again.run_id == first.run_id
    assert _runs(store, "trk-requeue")[0].info.status == "RUNNING"
    again.log_steps([{"step": s, "loss": 1.0 / s} for s in (4, 5)])
    again.finish([record])
    [run] = _runs(store, "trk-requeue")
    history = MlflowClient(tracking_uri=store).get_metric_history(run.info.run_id, "loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4, 5] and run.info.status == "FINISHED"


def test_without_the_kept_run_id_a_requeue_would_split_the_run(store: str, tmp_path: Path) -> None:
    """The planted defect the test above guards against: lose the id file and a second run appears."""
    spec = _spec("trk-split")
    record = _record(tmp_path / "attempt-1")
    Tracking.start(store, spec, record).stop("KILLED")  # type: ignore[union-attr]
    run_id_path(record).unlink()
    Tracking.start(store, spec, record).finish([record])  # type: ignore[union-attr]
    assert len(_runs(store, "trk-split")) == 2


def test_a_run_id_the_store_lost_starts_a_new_run(store: str, tmp_path: Path) -> None:
    spec = _spec("trk-lost")
    record = _record(tmp_path / "attempt-1")
    run_id_path(record).write_text("0123456789abcdef0123456789abcdef\n")
    t = Tracking.start(store, spec, record)
    assert t is not None and t.run_id != "0123456789abcdef0123456789abcdef"
    assert run_id_path(record).read_text().strip() == t.run_id


def test_tracking_off_or_unusable_never_stops_the_job(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = _spec("trk-off")
    record = _record(tmp_path / "attempt-1")
    assert Tracking.start(None, spec, record) is None and not run_id_path(record).exists()
    # a store that cannot be opened: a warning in the job's log, no exception, no tracking (MLflow retries
    # it for a minute and a half: the job waits for it at most its bounds, tests/test_tracking_never_holds.py)
    (tmp_path / "file").write_text("x")
    t = Tracking.start(f"sqlite:///{tmp_path / 'file' / 'mlflow.db'}", spec, record)
    if t is not None:
        t.settle(5.0)
        assert t.off
    assert "MLflow tracking off" in caplog.text


def test_names() -> None:
    assert attempt_number(Path("/jobs/e-v1-7-clean/attempt-12")) == 12
    assert attempt_number(Path("/tmp/out")) is None
    assert mlflow_run_name("e-v1-7-clean", 3) == "e-v1-7-clean attempt 3"
    assert mlflow_run_name("e-v1-7-clean", None) == "e-v1-7-clean"


def test_the_package_works_without_importing_mlflow() -> None:
    probe = ("import sys; import ggpo_batch.cli, ggpo_batch.train.run.tracking, ggpo_batch.train.run.job, ggpo_batch.control.reconcile; "
             "print('mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"
