"""Comparability warnings on real runs with planted differences: the two seeds of one experiment
run from two commits of a throwaway git checkout of the package, each through `enqueue` -> `worker
--burst` -> the local executor, on "hardware" that a fake `nvidia-smi` on the worker's PATH names
differently (the probe the job runs on a GPU node, a real program), in "images" whose digests
differ (GGPO_IMAGE_DIGEST). `report` warns code_differs, environment_differs and hardware_differs,
each naming the values and the runs; `status --runs --json` shows each run's provenance as its job
wrote it. A fair experiment stays silent: tests/dashboard/test_curves.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ggpo_batch.contracts.allocation import attempt_folder, details_path
from ggpo_batch.contracts.provenance import read_provenance, split_distributions
from tests.dashboard.server import cli_env, ggpo
from tests.support.provenance import commit, fake_nvidia_smi, head, package_checkout
from tests.support.workers import run_burst_worker

pytestmark = [pytest.mark.redis, pytest.mark.train, pytest.mark.slow]

SPEC = """
schema = 1
[experiment]
name = "planted"
method = "ggpo"
seeds = [1, 2]
gpus = 1
loop_budget_seconds = 2
executor = "local"
max_gpu_hours = 1.0
[overheads]
setup_export_seconds = 20
audit_seconds = 2
evaluation_seconds = 5
[train]
eval_size = 2
[arms.clean]
exposure = "none"
"""


def test_runs_from_two_commits_on_two_accelerators_in_two_images_are_flagged(tmp_path: Path, redis_url: str) -> None:
    checkout = package_checkout(tmp_path / "checkout")
    data = tmp_path / "data"
    env = cli_env(GGPO_DB_URL=f"sqlite:///{tmp_path / 'ledger.sqlite3'}", GGPO_REDIS_URL=redis_url,
                  GGPO_DATA_DIR=str(data), GGPO_USER="tester", GGPO_QUEUE="provq", GGPO_DEFER_SECONDS="1",
                  GIT_CONFIG_GLOBAL=str(tmp_path / "gitconfig"))
    env["PYTHONPATH"] = str(checkout)  # the package of the checkout, not of this one
    spec = tmp_path / "planted.toml"
    spec.write_text(SPEC)
    assert ggpo(env, "db", "upgrade").returncode == 0
    commits, accelerators, images = [head(checkout)], ["FAKE-GPU-A 80GB", "FAKE-GPU-B 40GB"], ["sha256:" + "a" * 64,
                                                                                      "sha256:" + "b" * 64]
    for seed in (1, 2):
        if seed == 2:  # the second seed runs a changed package, committed
            module = checkout / "ggpo_batch" / "contracts" / "outcome.py"
            module.write_text(module.read_text() + "\n# changed between the two runs\n")
            commits.append(commit(checkout, "a change between the runs"))
        smi = fake_nvidia_smi(tmp_path / f"bin{seed}", accelerators[seed - 1], count=1,
                              memory_mib=81920 // seed, driver=f"55{seed}.10")
        run_env = {**env, "PATH": f"{smi.parent}{os.pathsep}{env['PATH']}", "GGPO_IMAGE_DIGEST": images[seed - 1]}
        done = ggpo(run_env, "enqueue", str(spec), "--seeds", str(seed), timeout=300)
        assert done.returncode == 0, done.stderr
        worker = run_burst_worker(["--queue", "provq", "--reconcile-interval", "5"], run_env, timeout=400,
                                  cwd=checkout)
        assert worker.returncode == 0, worker.stderr.decode()[-3000:]

    status = json.loads(ggpo(env, "status", "--runs", "--json", "-e", "planted").stdout)
    rows = {r["seed"]: r for r in status["experiments"][0]["runs"]}
    assert {s: r["state"] for s, r in rows.items()} == {1: "succeeded", 2: "succeeded"}
    for seed, row in rows.items():
        prov = row["provenance"]
        assert prov["code"]["source"] == "checkout" and prov["code"]["commit"] == commits[seed - 1]
        assert prov["code"]["uncommitted_sha256"] is None
        assert prov["hardware"]["accelerator"] == accelerators[seed - 1] and prov["hardware"]["accelerators"] == 1
        assert prov["environment"]["image_digest"] == images[seed - 1]
        # What the ledger holds is what the job wrote, in its folder and in its details.
        folder = attempt_folder(data / "jobs", row["run_key"], 1)
        written = read_provenance(folder)
        assert written is not None and split_distributions(written)[0] == prov
        details = json.loads(details_path(folder).read_text())
        assert details["provenance"]["code"] == prov["code"] and details["provenance"]["hardware"]["accelerator"] == \
            accelerators[seed - 1]

    report = json.loads(ggpo(env, "report", "planted", "--json").stdout)
    warnings = {w["kind"]: w["message"] for w in report["warnings"]}
    assert {"code_differs", "environment_differs", "hardware_differs"} <= set(warnings), report["warnings"]
    assert f"commit: {commits[0][:12]} (clean seed 1) vs {commits[1][:12]} (clean seed 2)" in warnings["code_differs"]
    assert "FAKE-GPU-A 80GB (clean seed 1) vs FAKE-GPU-B 40GB (clean seed 2)" in warnings["hardware_differs"]
    assert "driver: 551.10 (clean seed 1) vs 552.10 (clean seed 2)" in warnings["hardware_differs"]
    assert f"image: {'a' * 12} (clean seed 1) vs {'b' * 12} (clean seed 2)" in warnings["environment_differs"]
    text = ggpo(env, "report", "planted").stdout
    assert "code differs between runs" in text and "hardware differs between runs" in text

