"""Running a command as a user who may not write what file permissions say it may not: as
root, without the capabilities that let root ignore them (a non-root user needs nothing)."""

from __future__ import annotations

import os
import shutil

import pytest

DROPPED = "-dac_override,-dac_read_search,-fowner"


def unprivileged_prefix() -> list[str]:
    """The command prefix (empty unless root). Without setpriv a root test cannot make a file
    read-only to itself: it fails in CI (where it runs as root) rather than skipping silently."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        message = "running as root needs setpriv (util-linux) to drop root's file-permission override"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return [setpriv, f"--inh-caps={DROPPED}", f"--bounding-set={DROPPED}"]
