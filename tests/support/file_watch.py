"""Files created under a folder while a block runs, from the kernel (Linux inotify through ctypes): a
file written and deleted again before the block ends is still seen, which a listing afterwards misses.
A folder made meanwhile is watched once its creation event is read (milliseconds): a file made and
deleted inside it before then is missed."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

IN_CREATE, IN_MOVED_TO, IN_ISDIR, IN_NONBLOCK = 0x100, 0x80, 0x40000000, 0o4000
_EVENT = struct.Struct("iIII")


class CreatedFiles:
    """`with CreatedFiles(root) as seen:` ... `seen.paths`: every file created or moved in under `root`
    (subfolders made meanwhile included) while the block ran."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.paths: set[Path] = set()
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._watches: dict[int, Path] = {}
        self._stop = threading.Event()

    def _watch(self, folder: Path) -> None:
        wd = self._libc.inotify_add_watch(self._fd, str(folder).encode(), IN_CREATE | IN_MOVED_TO)
        if wd >= 0:
            self._watches[wd] = folder
        try:
            entries = list(os.scandir(folder))  # what was created before the watch was
        except OSError:  # gone already
            entries = []
        for entry in entries:
            p = Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                self._watch(p)
            else:
                self.paths.add(p)

    def _read(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd], [], [], 0.05)
            if not ready:
                if self._stop.is_set():
                    return
                continue
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                continue
            at = 0
            while at < len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, at)
                name = data[at + _EVENT.size: at + _EVENT.size + size].rstrip(b"\0").decode()
                at += _EVENT.size + size
                if not mask & (IN_CREATE | IN_MOVED_TO):  # IN_IGNORED when a watched folder goes away
                    continue
                path = self._watches.get(wd, self.root) / name
                if mask & IN_ISDIR:
                    self._watch(path)
                else:
                    self.paths.add(path)

    def __enter__(self) -> Self:
        self._fd = self._libc.inotify_init1(IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._watch(self.root)
        self.paths.clear()  # only what the block creates
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        os.close(self._fd)

    def named(self, suffix: str) -> set[Path]:
        return {p for p in self.paths if p.name.endswith(suffix)}
