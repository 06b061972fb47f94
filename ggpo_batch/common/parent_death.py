"""A child process that ends with its parent: the kernel's parent-death signal (Linux)."""

from __future__ import annotations

import signal


def signal_at_parent_death(signum: int = signal.SIGKILL) -> bool:
    """Have the kernel send `signum` to this process when its parent dies; False where it cannot
    (not Linux). The caller checks `os.getppid()` afterwards: a parent that died before the request
    took effect is not signalled for."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(signum), 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False
