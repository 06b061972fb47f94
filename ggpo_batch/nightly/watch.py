"""Watch what a block of code opens and connects to, through Python's audit hooks (PEP 578).

Execution checks use it to prove a negative by observation rather than by assertion: that an
oversized corpus was refused without being opened, and that no pretrained checkpoint was loaded
and no network connection made while the tier ran.
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".gguf")


@dataclass
class Observed:
    opened: list[str] = field(default_factory=list)
    connections: list[str] = field(default_factory=list)

    def opened_path(self, path: os.PathLike | str) -> bool:
        target = os.path.realpath(path)
        return any(os.path.realpath(p) == target for p in self.opened)

    def checkpoints_opened(self) -> list[str]:
        return [p for p in self.opened if p.lower().endswith(CHECKPOINT_SUFFIXES)]


_active: contextvars.ContextVar[tuple[Observed, ...]] = contextvars.ContextVar("ggpo_watch", default=())
_installed: list[bool] = []  # audit hooks cannot be removed: install exactly one per process


def _hook(event: str, args: tuple[Any, ...]) -> None:
    watchers = _active.get()
    if not watchers:
        return
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        for w in watchers:
            w.opened.append(path)
    elif event == "socket.connect" and len(args) > 1:
        for w in watchers:
            w.connections.append(repr(args[1]))


@contextmanager
def watching() -> Iterator[Observed]:
    """Record file opens and socket connects made by this thread/context inside the block."""
    if not _installed:
        sys.addaudithook(_hook)
        _installed.append(True)
    observed = Observed()
    token = _active.set(_active.get() + (observed,))
    try:
        yield observed
    finally:
        _active.reset(token)
