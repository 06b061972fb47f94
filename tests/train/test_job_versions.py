"""The training job checks its allocation's libraries at its start (ggpo_batch/train/versions.py): a
too-old transformers (a planted dist-info first on the ranks' path) ends a real local run at once,
before the process group or any training, with that cause."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from ggpo_batch.errors import GgpoError
from ggpo_batch.train.run.launch import train_local
from tests.test_versions import plant

pytestmark = [pytest.mark.train, pytest.mark.slow]  # a fresh fork server for the planted path: its imports


def test_a_too_old_library_on_the_allocation_fails_the_run_at_its_start(tmp_path: Path, spec_for, monkeypatch):  # type: ignore[no-untyped-def]
    root = plant(tmp_path / "site", "transformers", "4.45.0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    out = tmp_path / "run" / "record.json"
    with pytest.raises(GgpoError) as err:
        train_local(spec_for("clean", budget=30.0), out, nproc=2, timeout=300)
    message = err.value.message
    assert "training rank 0 exited 2" in message
    assert ": transformers 4.45.0 is installed; the code needs transformers >= 4.56.0" in message
    assert "error: the allocation (" in message
    assert not out.exists() and not Path(f"{out}.ckpt").exists()
    for rank in (0, 1):  # each rank stopped at the check: no process group, no step
        log = out.with_name(f"record.json.rank{rank}.log").read_text()
        assert "transformers 4.45.0 is installed" in log and "step" not in log and "rank0" not in log, log[-2000:]
