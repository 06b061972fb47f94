"""DeepSpeed as every rank imports it (ggpo_batch/train/policy/deepspeed_import.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytest.importorskip("deepspeed")

pytestmark = pytest.mark.train



def test_a_rank_started_as_its_own_interpreter_reaches_its_zero_engine_without_torch_inductor():
    """DeepSpeed's ZeRO-2 engine imports its Muon optimizer, which compiled three functions as it
    loaded and so imported torch._inductor in every rank: about 1 CPU-second each
    (tools/bench/fresh_rank_imports.py). The Muon module is still loaded (DeepSpeed asks whether the
    optimizer is its class), uncompiled; fails with `_import_uncompiled` as a plain import."""
    script = ("import sys\nfrom tools.bench.rank_time_imports import rank_start\nrank_start()\n"
              "print(sorted(m for m in sys.modules if m.startswith(('torch._inductor.compile_fx', "
              "'deepspeed.runtime.zero.muon.muon_optimizer'))))\n")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "['deepspeed.runtime.zero.muon.muon_optimizer']"
