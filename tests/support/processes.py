"""The CLI in a process of its own, measured (wall time, peak memory) and, where a test needs a file
to be unreadable, without root's power to read any file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import pytest

from tests.support.paths import REPO


def unprivileged(cmd: list[str]) -> list[str]:
    """`cmd`, run so that file permissions hold for it (`unprivileged_prefix`)."""
    return [*unprivileged_prefix(), *cmd]


def unprivileged_prefix() -> tuple[str, ...]:
    """What runs a command so that file permissions hold for it: as root, setpriv without the
    capabilities that let root read any file (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH). Fails in CI
    when that cannot be done (a mode-000 file would be read by root, and the test prove nothing)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        message = "needs setpriv (util-linux) to drop root's file-permission override"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search", "--")


@dataclass
class Measured:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    max_rss_bytes: int


# Runs its arguments as a child and writes the child's peak resident memory (KiB) to the file named
# first. A child of this small launcher: a process forked from the test's own (hundreds of MiB
# resident) would count the test's memory as its own peak (Linux keeps the peak across exec).
_LAUNCHER = ("import os, subprocess, sys\n"
             "p = subprocess.Popen(sys.argv[2:])\n"
             "_, status, usage = os.wait4(p.pid, 0)\n"
             "p.returncode = os.waitstatus_to_exitcode(status)\n"
             "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
             "sys.exit(p.returncode if p.returncode >= 0 else 128 - p.returncode)\n")


def ggpo_measured(args: list[str], env: dict[str, str], *, timeout: float, privileged: bool = True) -> Measured:
    """`ggpo-batch ARGS` in a subprocess: its exit code, output, wall time and peak resident memory
    (its own). Killed, and the test failed, past `timeout` seconds."""
    cmd = [sys.executable, "-m", "ggpo_batch.cli", *args]
    if not privileged:
        cmd = unprivileged(cmd)
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        rss = os.path.join(tmp, "maxrss")
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-S", "-c", _LAUNCHER, rss, *cmd], env=env, cwd=REPO, stdout=out,
                                stderr=err, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            err.seek(0)
            pytest.fail(f"ggpo-batch {' '.join(args)} still running after {timeout} s: "
                        f"{err.read()[-2000:].decode(errors='replace')}")
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        with open(rss) as fh:
            max_rss = int(fh.read()) * 1024
        return Measured(proc.returncode, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"),
                        seconds, max_rss)
