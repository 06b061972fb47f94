"""Optional MLflow tracking: one MLflow run per attempt, written by rank 0 of the training job.

On when GGPO_MLFLOW_URI names a tracking store (`sqlite:///path/mlflow.db` works with no server;
an `http://` server works too). The MLflow experiment is the ggpo experiment's name; the run is
named `<run key> attempt <n>` and tagged with experiment, version, arm, seed, run key and attempt.
Step metrics are logged as the heartbeat is written (ggpo_batch/heartbeat.py), the record and its
details as artifacts at the end. The MLflow run id is kept beside the record, so a requeued job
(preempted, then resumed in the same attempt folder) continues its own MLflow run.

mlflow is imported only here and only when tracking is on (the `mlflow` extra). Tracking never
stops training: an unreachable store or a missing package is logged and tracking goes off.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .runspec import RunSpec

log = logging.getLogger(__name__)

# Beside the record (`<attempt folder>/record.json.mlflow_run_id`): the attempt's MLflow run.
RUN_ID_SUFFIX = ".mlflow_run_id"
_ATTEMPT_FOLDER = re.compile(r"^attempt-(\d+)$")
_BATCH = 1000  # MLflow's most metrics in one log_batch


def run_id_path(record: Path) -> Path:
    """Where the job writing `record` keeps its MLflow run id."""
    return Path(str(record) + RUN_ID_SUFFIX)


def attempt_number(folder: Path) -> int | None:
    """The attempt number of an attempt folder (`.../attempt-3` -> 3); None for any other folder."""
    m = _ATTEMPT_FOLDER.match(Path(folder).name)
    return int(m.group(1)) if m else None


def mlflow_run_name(run_key: str, attempt: int | None) -> str:
    """`<run key> attempt <n>` (just the run key outside the queue, e.g. `ggpo-batch train`)."""
    return run_key if attempt is None else f"{run_key} attempt {attempt}"


def run_tags(spec: RunSpec, attempt: int | None) -> dict[str, str]:
    tags = {"experiment": spec.experiment, "experiment_version": str(spec.experiment_version), "arm": spec.arm.name,
            "seed": str(spec.seed), "run_key": spec.run_key, "method": spec.method, "executor": spec.executor}
    if attempt is not None:
        tags["attempt"] = str(attempt)
    return tags


def _artifact_location(uri: str, experiment: str) -> str | None:
    """A SQLite store keeps its artifacts in a folder beside the database file (MLflow's default,
    ./mlruns of whatever folder the job runs in, would scatter them); a server decides for itself."""
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri[len("sqlite:///"):].split("?", 1)[0])
    return (db.parent / "mlflow-artifacts" / experiment).resolve().as_uri()


class Tracking:
    """The MLflow run of one attempt. Every method logs and switches tracking off on any failure."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client: Any = client
        self.run_id = run_id

    @classmethod
    def start(cls, uri: str | None, spec: RunSpec, record: Path) -> Tracking | None:
        """Open the attempt's MLflow run, or resume it (its id beside `record`); None when off."""
        if not uri:
            return None
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            log.error("GGPO_MLFLOW_URI is set but mlflow is not installed (pip install 'ggpo-batch[mlflow]'): "
                      "this attempt is not tracked")
            return None
        try:
            client = MlflowClient(tracking_uri=uri)
            resumed = _resume(client, run_id_path(record))
            if resumed is not None:
                log.info("MLflow: continuing run %s", resumed)
                return cls(client, resumed)
            attempt = attempt_number(Path(record).parent)
            run = client.create_run(_experiment_id(client, spec.experiment, uri),
                                    run_name=mlflow_run_name(spec.run_key, attempt), tags=run_tags(spec, attempt))
            run_id = run.info.run_id
            path = run_id_path(record)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            tmp.write_text(run_id + "\n")
            os.replace(tmp, path)
            from mlflow.entities import Param

            client.log_batch(run_id, params=[Param("loop_budget_seconds", str(spec.loop_budget_seconds)),
                                             Param("gpus", str(spec.gpus)), Param("exposure", spec.arm.exposure)])
            log.info("MLflow: run %s (%s)", run_id, mlflow_run_name(spec.run_key, attempt))
            return cls(client, run_id)
        except Exception as exc:  # noqa: BLE001  (tracking must never stop a training run)
            log.warning("MLflow tracking off for this attempt: %s", _first_line(exc))
            return None

    def log_steps(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Log step metrics: each row has "step" and numbers (None and non-finite values left out)."""
        if self.client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(v), now, int(row["step"])) for row in rows for key, v in row.items()
                   if key != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        for i in range(0, len(metrics), _BATCH):
            self._call("log_batch", self.run_id, metrics=metrics[i:i + _BATCH])

    def finish(self, files: Iterable[Path]) -> None:
        """The attempt ended with its record: log `files` (record, details) as artifacts, mark it FINISHED."""
        for f in files:
            if Path(f).exists():
                self._call("log_artifact", self.run_id, str(f))
        self.stop("FINISHED")

    def stop(self, status: str) -> None:
        """End the MLflow run as `status` (KILLED on a preemption: a resumed job sets it RUNNING again)."""
        self._call("set_terminated", self.run_id, status=status)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> None:
        if self.client is None:
            return
        try:
            getattr(self.client, method)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (tracking must never stop a training run)
            log.warning("MLflow %s failed, tracking off for this attempt: %s", method, _first_line(exc))
            self.client = None


def _resume(client: Any, id_file: Path) -> str | None:
    """The run id kept in `id_file`, set RUNNING again; None if there is none or the store lost it."""
    try:
        run_id = id_file.read_text().strip()
    except OSError:
        return None
    if not run_id:
        return None
    from mlflow.exceptions import MlflowException

    try:
        client.get_run(run_id)
    except MlflowException:
        log.warning("MLflow run %s (from %s) is not in the store: starting a new one", run_id, id_file)
        return None
    client.update_run(run_id, status="RUNNING")
    return run_id


def _experiment_id(client: Any, name: str, uri: str) -> str:
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    try:
        return str(client.create_experiment(name, artifact_location=_artifact_location(uri, name)))
    except MlflowException:  # another job created it meanwhile
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]
