"""tools/gpu/train_qwen05b.py, the GPU check of a Qwen2-0.5B-shaped model, run here with --tiny on the
CPU: it trains through both ZeRO stages, measures every figure it prints, and its probe passes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = [pytest.mark.train, pytest.mark.slow]
SCRIPT = REPO / "tools" / "gpu" / "train_qwen05b.py"


def test_tiny_run_reports_every_figure_for_both_stages():
    out = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--json"], cwd=REPO, capture_output=True, text=True,
                         timeout=400, env=dict(os.environ, OMP_NUM_THREADS="1"), check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["device"] == "cpu" and [r["zero_stage"] for r in report["stages"]] == [2, 3]
    for r in report["stages"]:
        assert r["steps"] == 3 and r["timed_steps"] == 2
        assert r["rollout_tokens_per_second"] > 0 and r["train_tokens_per_second"] > 0
        assert r["train_model_tflops"] > 0 and r["mfu"] is None and r["peak_gpu_memory_gib"] is None  # CPU
        assert len(r["weight_sync_seconds"]) == 3 and all(s > 0 for s in r["weight_sync_seconds"])
        assert r["probe"]["passed"] and r["probe"]["largest_gap"] <= r["probe"]["bound"]
        assert len(r["loss"]) == 3 and all(math.isfinite(x) for x in r["loss"])


def test_bad_stage_is_a_usage_error():
    out = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--stages", "1"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 2 and "--stages" in out.stderr
