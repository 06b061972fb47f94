"""One arm of the example jobs/math-cpu.toml through `ggpo-batch enqueue --arms A --seeds 1`, the real
worker (its reconcile cycles) and the dev Slurm: the shipped spec, rewritten only where a test must (the
executor and its profile, the GPUs a node of that profile gives, a unique name, data built here, a
shorter loop). The run succeeds with a validated record; Slurm's GPU-hours (sacct) are booked on it; its
provenance carries the sha256 of the spec's relative format reward file, which the job read from its
allocation; its details count the `math` reward's unparsed completions; `report --json` shows the arm."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from ggpo_batch.contracts.allocation import attempt_folder, details_path
from ggpo_batch.contracts.run_record import TRAINING_STATUS_VALIDATED
from tests.support.paths import JOBS
from tests.support.slurm import cancel_tagged, sacct_gpu_hours

pytest.importorskip("deepspeed")
pytest.importorskip("pyarrow")
pytest.importorskip("math_verify")
pytestmark = [pytest.mark.slurm, pytest.mark.redis, pytest.mark.train, pytest.mark.slow]

ARM = "kl_coef_0p0__lr_0p001"  # the sweep's first point: the baseline


def _spec(tmp_path: Path, name: str) -> Path:
    """jobs/math-cpu.toml with only what this test must change; each replacement must hit."""
    text = (JOBS / "math-cpu.toml").read_text()
    for old, new in ((r'name = "math-cpu"', f'name = "{name}"'),  # Slurm finds a job by name: unique per test
                     (r'executor = "local"', 'executor = "slurm"\nprofile = "dev-cluster-1task"'),
                     (r"gpus = 1 .*", "gpus = 4"),  # a run takes a whole node of the profile
                     (r"loop_budget_seconds = 6", "loop_budget_seconds = 1"),
                     (r"eval_size = 16", "eval_size = 4"),
                     (r"\.\./out/math-cpu/", "data/")):
        text, n = re.subn(old, new, text)
        assert n, f"jobs/math-cpu.toml no longer has {old!r}: update this test"
    (tmp_path / "rewards").mkdir()
    shutil.copy(JOBS / "rewards" / "format.py", tmp_path / "rewards" / "format.py")
    (tmp_path / "math.toml").write_text(text)
    return tmp_path / "math.toml"


def test_one_arm_of_math_cpu_runs_on_the_dev_slurm(  # type: ignore[no-untyped-def]
        dev_cluster, ledger, settings, worker_env, tmp_path: Path, tag: str) -> None:
    from click.testing import CliRunner

    from ggpo_batch.cli import cli
    from ggpo_batch.control.worker import run_worker
    from ggpo_batch.train.task.arithmetic import write

    name = f"math-cpu-{tag}"
    spec = _spec(tmp_path, name)
    write(tmp_path / "data", n_train=16, n_eval=4)
    res = CliRunner().invoke(cli, ["enqueue", str(spec), "--arms", ARM, "--seeds", "1", "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert [(r["arm"], r["seed"]) for r in json.loads(res.output)["runs"]] == [(ARM, 1)]
    try:
        run_worker(settings, [settings.queue], burst=True, reconcile_interval=5, settle_timeout=300)
    finally:
        cancel_tagged(tag)
    key = f"{name}-v1-1-{ARM}"
    run = ledger.get_run(key)
    (att,) = run.attempts
    assert run.state == "succeeded" and att.executor == "slurm", (run.cause, att.state, att.reason)
    assert run.result["training"]["status"] == TRAINING_STATUS_VALIDATED, run.result
    assert [att.gpu_hours_scheduler] == pytest.approx(sacct_gpu_hours(att.job_id))
    assert att.gpu_hours_scheduler > 0
    details = json.loads(details_path(attempt_folder(settings.jobs_dir, key, att.number)).read_text())
    fmt = tmp_path / "rewards" / "format.py"
    assert details["reward"]["rewards"] == ["math", f"{fmt}:score"]
    assert details["reward"]["math_unparsed"] > 0  # a byte model's completions are rarely math
    assert details["under_submitit"] and details["evaluation"]["items"] == 4
    sha = hashlib.sha256(fmt.read_bytes()).hexdigest()
    assert details["provenance"]["code"]["reward_files"] == [f"{sha}  {fmt}"]
    [(_, booked)] = ledger.latest_provenance([run.id]).values()  # and as the ledger booked it
    assert booked["code"]["reward_files"] == [f"{sha}  {fmt}"]
    rep = CliRunner().invoke(cli, ["report", name, "--json"], catch_exceptions=False)
    assert rep.exit_code == 0, rep.output
    doc = json.loads(rep.output)
    assert (doc["baseline"], list(doc["arms"])) == (ARM, [ARM])
    assert doc["arms"][ARM]["per_seed"]["1"]["state"] == "succeeded"
    assert doc["arms"][ARM]["outcome"]["eval_reward"]["n"] == 1
    assert doc["totals"]["spent_gpu_hours"] == pytest.approx(att.gpu_hours_scheduler)
