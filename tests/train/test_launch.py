"""The local launcher and the rank's process group: a hang says where each rank waits, and a lock
left in the torch extensions folder by a killed rank stalls nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from ggpo_batch.errors import GgpoError
from ggpo_batch.train.run.launch import train_local

pytestmark = pytest.mark.train

# One rank's process group, as a job makes it (ggpo_batch.train.run.job.init_process_group).
ONE_RANK = """
import os
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", DS_ACCELERATOR="cpu")
from ggpo_batch.common.netutil import free_port
os.environ["MASTER_PORT"] = str(free_port())
from ggpo_batch.train.run.job import init_process_group, release_process_group
init_process_group(cuda=False)
release_process_group()
print("process group made")
"""

# torch's process group first, then DeepSpeed's own (what `deepspeed.initialize` in the Trainer
# does when a launcher other than the job made the group, as the colocated-vLLM ranks do).
TORCH_FIRST = """
import os
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", DS_ACCELERATOR="cpu")
from ggpo_batch.common.netutil import free_port
os.environ["MASTER_PORT"] = str(free_port())
import torch.distributed as dist
dist.init_process_group("gloo")
from ggpo_batch.train.policy.deepspeed_import import import_deepspeed
import_deepspeed().init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
dist.destroy_process_group()
print("process group made")
"""


@pytest.mark.parametrize("rank", [ONE_RANK, TORCH_FIRST], ids=["job", "torch-first"])
def test_a_stale_extension_lock_does_not_stall_the_process_group(tmp_path: Path, rank: str):
    # A rank SIGKILLed while DeepSpeed JIT-built its CPU shared-memory op leaves this lock; torch's
    # loader then waits on it for ever (a CI run hung 300 s so). The job's process group needs no op.
    (tmp_path / "deepspeed_shm_comm").mkdir()
    (tmp_path / "deepspeed_shm_comm" / "lock").touch()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", rank], env=env, capture_output=True, text=True, timeout=90,
                          check=False)
    assert proc.returncode == 0 and "process group made" in proc.stdout, proc.stderr[-2000:]
    assert (tmp_path / "deepspeed_shm_comm" / "lock").exists()  # untouched: nothing waited on it
    assert not list((tmp_path / "deepspeed_shm_comm").glob("*.so"))  # and nothing was built


@pytest.mark.slow
def test_a_run_past_its_timeout_names_where_each_rank_is(tmp_path: Path, spec_for):
    with pytest.raises(GgpoError, match="did not finish in 6 s") as err:
        train_local(spec_for("clean", budget=600.0), tmp_path / "r.json", nproc=2, timeout=6)
    text = err.value.message
    # each rank's Python stack (faulthandler, on SIGQUIT), then its log's last lines
    assert "-- rank 0 (" in text and "-- rank 1 (" in text, text
    assert text.count('File "') >= 2, text
