"""Optional MLflow tracking: one MLflow run per attempt, written by rank 0 of the training job.

On when GGPO_MLFLOW_URI names a tracking store (`sqlite:///path/mlflow.db` works with no server;
an `http://` server works too). The MLflow experiment is the ggpo experiment's name; the run is
named `<run key> attempt <n>` and tagged with experiment, version, arm, seed, run key and attempt.
Step metrics are logged as the heartbeat is written (ggpo_batch/contracts/heartbeat.py), the record and its
details as artifacts at the end. The MLflow run id is kept beside the record, so a requeued job
(preempted, then resumed in the same attempt folder) continues its own MLflow run.

mlflow is imported only here and only when tracking is on (the `mlflow` extra). Tracking never
stops nor holds training: its calls run on a thread of their own, a closed port is found in
seconds, a store that does not answer is given up after a bound, any failure switches tracking off
for the attempt with one warning and the reason beside the record (tracking_state), its password
masked.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ...contracts.runspec import RunSpec

log = logging.getLogger(__name__)

# Beside the record (`<attempt folder>/record.json.mlflow_run_id`): the attempt's MLflow run; or, when
# tracking went off, why (`record.json.mlflow_off`).
RUN_ID_SUFFIX = ".mlflow_run_id"
OFF_SUFFIX = ".mlflow_off"
# Tracking never holds training: the store's host is tried for this long; opening the run (importing
# mlflow and, for a new SQLite store, building its schema: ~15 s) is waited for this long before the
# loop, then goes on beside it; its calls are waited for at most this long at the end.
CONNECT_TIMEOUT_SECONDS = 5.0
OPEN_WAIT_SECONDS = 20.0  # then the run is opened beside training
SETTLE_SECONDS = 25.0  # at the end of training, for the open and the step metrics
FINISH_TIMEOUT_SECONDS = 15.0
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


class _Calls:
    """One daemon thread that makes the MLflow calls, in order: a store that hangs (a server that
    accepts and never answers, a database that retries for minutes) holds this thread, never the
    training loop, and dies with the job."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], Any], _Done]] = queue.Queue()
        threading.Thread(target=self._run, name="mlflow-tracking", daemon=True).start()

    def _run(self) -> None:
        while True:
            call, done = self._queue.get()
            try:
                done.value = call()
            except Exception as exc:  # noqa: BLE001  (given to whoever waits; tracking must never stop training)
                done.error = exc
            finally:
                done.set()

    def submit(self, call: Callable[[], Any]) -> _Done:
        done = _Done()
        self._queue.put((call, done))
        return done


class _Done(threading.Event):
    value: Any = None
    error: BaseException | None = None


class Tracking:
    """The MLflow run of one attempt. Its calls run on their own thread (`_Calls`): opening the run is
    waited for at most OPEN_WAIT_SECONDS (then it goes on beside training), a step's metrics are
    handed over without waiting, and `settle` (before the details are written) and the end wait at
    most SETTLE_SECONDS and FINISH_TIMEOUT_SECONDS. On any failure or when a bound is passed tracking
    goes off for the attempt: one warning in the job's log, and the reason beside the record
    (`off_path`), the URI's password masked."""

    def __init__(self, client: Any, run_id: str | None, calls: _Calls | None = None,
                 record: Path | None = None) -> None:
        self.client: Any = client
        self.run_id = run_id
        self._calls = calls
        self._record = record
        self._last: _Done | None = None  # the last call handed to the thread
        self._off_lock = threading.Lock()
        self.off = False

    @classmethod
    def start(cls, uri: str | None, spec: RunSpec, record: Path) -> Tracking | None:
        """Open the attempt's MLflow run, or resume it (its id beside `record`); None when off."""
        if not uri:
            return None
        problem = _unreachable(uri)
        if problem:
            _off(record, problem)
            return None
        # MLflow's own retries would log a warning each (a database store: ten, over a minute and a half);
        # this module says once why tracking is off
        logging.getLogger("mlflow").setLevel(logging.ERROR)
        t = cls(None, None, _Calls(), record)
        done = t._submit(lambda: t._open(uri, spec, record))
        if done.wait(OPEN_WAIT_SECONDS) and (t.off or done.error is not None):
            return None
        return t

    def _open(self, uri: str, spec: RunSpec, record: Path) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            self.switch_off("GGPO_MLFLOW_URI is set but mlflow is not installed (pip install 'ggpo-batch[mlflow]')")
            return
        try:
            self.client, self.run_id = _open(MlflowClient(tracking_uri=uri), uri, spec, record)
        except Exception as exc:
            self.switch_off(_first_line(exc))
            raise

    def log_steps(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Log step metrics: each row has "step" and numbers (None and non-finite values left out).
        Handed to the tracking thread: the step does not wait for the store."""
        if self.off:
            return
        now = int(time.time() * 1000)
        values = [(key, float(v), now, int(row["step"])) for row in rows for key, v in row.items()
                  if key != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]

        def log_batch(client: Any) -> None:  # mlflow is imported on the tracking thread, once the run is open
            from mlflow.entities import Metric

            metrics = [Metric(*v) for v in values]
            for i in range(0, len(metrics), _BATCH):
                client.log_batch(self.run_id, metrics=metrics[i:i + _BATCH])

        self._call("log_batch", log_batch)

    def settle(self, seconds: float | None = None) -> None:
        """Wait at most `seconds` (SETTLE_SECONDS) for the calls handed over so far, a run still being
        opened included; tracking goes off if they are not done, so that what the job writes next
        (its details) says for sure whether the attempt was tracked."""
        self._wait(SETTLE_SECONDS if seconds is None else seconds, "by the end of training")

    def finish(self, files: Iterable[Path]) -> None:
        """The attempt ended with its record: log `files` (record, details) as artifacts, mark it FINISHED."""
        for f in files:
            if Path(f).exists():
                self._call("log_artifact", lambda client, path=str(f): client.log_artifact(self.run_id, path))
        self.stop("FINISHED")

    def stop(self, status: str) -> None:
        """End the MLflow run as `status` (KILLED on a preemption: a resumed job sets it RUNNING again),
        waiting at most FINISH_TIMEOUT_SECONDS for the calls before it."""
        self._call("set_terminated", lambda client: client.set_terminated(self.run_id, status=status))
        self._wait(FINISH_TIMEOUT_SECONDS, "at the end")

    def switch_off(self, reason: str) -> None:
        """Tracking off for the rest of the attempt (said once)."""
        with self._off_lock:
            if self.off:
                return
            self.off, self.client = True, None
        _off(self._record, reason)

    def _wait(self, seconds: float, when: str) -> None:
        if self.off or self._last is None:
            return
        if not self._last.wait(seconds):
            self.switch_off(f"the tracking store did not answer in {seconds:g} s {when}")

    def _submit(self, call: Callable[[], Any]) -> _Done:
        assert self._calls is not None
        self._last = self._calls.submit(call)
        return self._last

    def _call(self, name: str, use: Callable[[Any], Any]) -> None:
        """`use(client)` on the tracking thread, once the run is open; `name` says what failed."""
        if self.off:
            return

        def call() -> None:
            client = self.client
            if self.off or client is None:  # went off, or never opened, while this call waited
                return
            try:
                use(client)
            except Exception as exc:  # noqa: BLE001  (tracking must never stop a training run)
                self.switch_off(f"{name} failed: {_first_line(exc)}")

        if self._calls is None:  # made directly around a client: in this thread
            call()
        else:
            self._submit(call)


def _open(client: Any, uri: str, spec: RunSpec, record: Path) -> tuple[Any, str]:
    """(client, run id) of the attempt's MLflow run: resumed from the id beside `record`, or new."""
    resumed = _resume(client, run_id_path(record))
    if resumed is not None:
        log.info("MLflow: continuing run %s", resumed)
        return client, resumed
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
    return client, run_id


# Default ports of the stores a URI may name with a host: refused at once instead of after MLflow's retries.
_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306, "mssql": 1433}


def _unreachable(uri: str) -> str | None:
    """Why the store's host cannot be reached (a closed port), or None (reached, or no host: SQLite)."""
    import socket
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(uri)
        scheme = parts.scheme.split("+", 1)[0].lower()
        host, port = parts.hostname, parts.port or _PORTS.get(scheme)
    except ValueError:
        return None  # MLflow says what is wrong with it
    if not host or not port:
        return None
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS):
            return None
    except OSError as exc:
        return f"cannot connect to {host}:{port} ({exc.strerror or type(exc).__name__})"


def off_path(record: Path) -> Path:
    """Where a job writes why tracking went off for its attempt (beside its record)."""
    return Path(str(record) + OFF_SUFFIX)


def _off(record: Path | None, reason: str) -> None:
    """Tracking off for this attempt: one warning, and the reason beside the record (masked)."""
    from ...config.secrets import redact

    reason = redact(reason)
    log.warning("MLflow tracking off for this attempt: %s", reason)
    if record is None:
        return
    try:
        path = off_path(record)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(reason + "\n")
    except OSError:
        pass


def tracking_state(record: Path) -> dict[str, Any]:
    """How the attempt writing `record` was tracked: {"state": "on", "run_id"}, {"state": "off",
    "reason"} or {"state": "none"} (no GGPO_MLFLOW_URI), from the files beside it."""
    for path, state, key in ((off_path(record), "off", "reason"), (run_id_path(record), "on", "run_id")):
        try:
            return {"state": state, key: path.read_text().strip()}
        except OSError:
            continue
    return {"state": "none"}


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
