"""The CI check of the wheel (issue 31): `pip wheel .` installed into a fresh venv outside the
checkout works as a new user's install would, with nothing read from the checkout."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

import ggpo_batch
from tests.dashboard.server import Dashboard, get
from tests.support.paths import REPO
from tests.support.wheel import UNMET_REQUIREMENTS, build_wheel, fresh_venv

# What the package reads at run time; each must be in the wheel.
PACKAGED = ("ggpo_batch/ledger/migrations/env.py", "ggpo_batch/ledger/migrations/script.py.mako",
            "ggpo_batch/ledger/migrations/versions/0001_initial_ledger_schema.py", "ggpo_batch/data/profiles/default.toml",
            "ggpo_batch/data/suites/nightly-cpu.toml", "ggpo_batch/data/examples/demo-cpu.toml",
            "ggpo_batch/data/examples/exposure-5arm.toml", "ggpo_batch/data/starter/experiment.toml",
            "ggpo_batch/dashboard/templates/base.html", "ggpo_batch/dashboard/static/dashboard.js")


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.train
def test_the_wheel_installed_outside_the_checkout_runs_the_whole_flow(tmp_path: Path, redis_url: str) -> None:
    """Build the wheel, install it into a fresh venv in a temporary folder, and from there (cwd
    outside the checkout, no PYTHONPATH): the image's smoke check, `db upgrade`, `enqueue --dry-run`
    of a packaged example, `init`, `enqueue` + `worker --burst` of a debug-executor run to
    `succeeded`, `nightly`, `report`, and `dashboard` serving its pages.

    What is reused, and why: installing the `train` and `dashboard` extras from the index means
    torch 2.13.0 (the CPU build, as tools/install.sh installs it), DeepSpeed and transformers:
    minutes and the network each time, too slow for `make test` and not offline-robust. So the wheel
    is installed with --no-deps, and the venv's path then reaches this environment's site-packages
    (a .pth line, added after the install so pip sees an empty venv). Whether those dependencies
    meet the wheel's own requirements for base + train + dashboard is checked from the installed
    wheel's metadata (UNMET_REQUIREMENTS); the package itself (its files, data, entry point, imports)
    comes only from the wheel: `ggpo_batch.__file__` must be in the fresh venv. The image's pip
    steps themselves, with real downloads, are tools/check/dockerfile.py's."""
    t0 = time.monotonic()
    wheel = build_wheel(tmp_path / "build")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(PACKAGED) <= names, sorted(set(PACKAGED) - names)
    assert not [n for n in names if n.startswith(("tests/", "tools/", "jobs/", "migrations/"))]
    venv = fresh_venv(tmp_path, wheel)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith(("GGPO_", "XDG_CONFIG"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", GGPO_DATA_DIR=str(tmp_path / "data"),
               GGPO_REDIS_URL=redis_url, GGPO_USER="tester", GGPO_QUEUE="wheelq",
               XDG_CONFIG_HOME=str(tmp_path / "config"))
    seconds: dict[str, float] = {"build and install": time.monotonic() - t0}

    def run(name: str, *argv: str, timeout: float = 120) -> str:
        t = time.monotonic()
        done = subprocess.run(list(argv), cwd=work, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        seconds[name] = time.monotonic() - t
        assert done.returncode == 0, f"{shlex.join(argv)} exited {done.returncode}:\n{done.stdout[-2000:]}\n" \
                                     f"{done.stderr[-3000:]}"
        return done.stdout

    python = str(venv / "bin" / "python")
    where = run("import", python, "-c", "import ggpo_batch, ggpo_batch.common.datafiles as d; "
                "print(ggpo_batch.__file__); print(d.MIGRATIONS_DIR)").split()
    assert all(Path(p).is_relative_to(venv) for p in where), where
    assert not any(Path(p).is_relative_to(REPO) for p in where)
    needs = json.loads(run("requirements", python, "-c", UNMET_REQUIREMENTS, "train", "dashboard"))
    assert Path(needs["metadata"]).is_relative_to(venv) and needs["unmet"] == [], needs

    assert "5 of 5 checks passed" in run("smoke", python, "-m", "ggpo_batch.smoke")
    cli = str(venv / "bin" / "ggpo-batch")
    run("db upgrade", cli, "db", "upgrade")
    example = next(venv.glob("lib/python3*/site-packages/ggpo_batch/data/examples/demo-cpu.toml"))
    assert "preflight: ok" in run("enqueue --dry-run", cli, "enqueue", str(example), "--dry-run")
    run("init", cli, "init", "proj")
    spec = work / "proj" / "experiment.toml"
    text = spec.read_text()
    for old, new in (('executor = "local"', 'executor = "debug"'), ("seeds = [1, 2]", "seeds = [1]"),
                     ("loop_budget_seconds = 6 ", "loop_budget_seconds = 1 ")):
        assert old in text
        text = text.replace(old, new, 1)
    spec.write_text(text)
    run("enqueue", cli, "enqueue", "proj/experiment.toml")
    run("worker --burst", cli, "worker", "--burst", "--reconcile-interval", "5", timeout=300)
    [exp] = json.loads(run("status", cli, "status", "--json", "-e", "my-experiment"))["experiments"]
    assert exp["totals"]["states"] == {"succeeded": 2}
    # Each run's provenance names the installed wheel, not a checkout (run_provenance.py).
    rows = json.loads(run("status --runs", cli, "status", "--runs", "--json", "-e", "my-experiment"))
    codes = [r["provenance"]["code"] for r in rows["experiments"][0]["runs"]]
    assert len(codes) == 2 and codes[0] == codes[1], codes
    assert codes[0]["source"] == "wheel" and codes[0]["commit"] is None and codes[0]["version"] == ggpo_batch.__version__
    assert len(codes[0]["installed_sha256"] or "") == 64, codes[0]

    [night] = json.loads(run("nightly", cli, "nightly", "--seeds", "42", "--json"))["nights"]
    assert night["ran"], night
    record = json.loads(Path(night["artifact"]).read_text())
    provenance = record["provenance"]
    assert provenance["commit"] is None and provenance["uncommitted_source_at_cpu_run"] is None  # not a checkout
    sources = provenance["executed_source_sha256"]
    assert "ggpo_batch/train/policy/ggpo.py" in sources
    assert "ggpo_batch/data/suites/nightly-cpu.toml" in sources  # the packaged suite, keyed like the modules

    report = json.loads(run("report", cli, "report", "my-experiment", "--json"))
    assert set(report["arms"]) == {"clean", "paired"}

    t = time.monotonic()
    dash = Dashboard(env, tmp_path / "dashboard.log", program=(cli,), cwd=work)
    try:
        status, page = get(dash.url + "/")
        assert status == 200 and "my-experiment" in page
        status, body = get(dash.url + "/api/status")
        assert status == 200 and json.loads(body)["experiments"][0]["experiment"] == "my-experiment"
        assert get(dash.url + "/nightly")[0] == 200
        assert get(dash.url + "/static/dashboard.css")[0] == 200
    finally:
        dash.stop()
    seconds["dashboard"] = time.monotonic() - t
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()) + f"; total {time.monotonic() - t0:.1f}")

