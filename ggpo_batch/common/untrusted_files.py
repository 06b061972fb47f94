"""Files read from folders the system does not control: a job's logs in its attempt folder (the job
writes whatever it likes there), a model folder (downloaded, copied, linked by hand).

Such a file is opened only when it is what it claims to be: a regular file (a FIFO would block the
reader, a device never end), reached without leaving the folder it belongs to (a symbolic link to
/etc/shadow is refused, not followed), and read in bounded pieces: whole only up to a size, else
from a chosen offset, block by block. Every refusal is `FileRefused` with a phrase ("is a FIFO, not a
regular file") that the caller puts in its own one-line error naming the file and the field.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

BLOCK_BYTES = 64 << 10  # one read


class FileRefused(Exception):
    """A file that is not read; `problem` is the phrase for the caller's error."""

    def __init__(self, problem: str, *, permission: bool = False, absent: bool = False) -> None:
        super().__init__(problem)
        self.problem = problem
        self.permission = permission  # the system refused to open it (mode 000, not ours)
        self.absent = absent


def kind_of(mode: int) -> str:
    """What a file of `mode` is, in words."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "a file of an unknown kind"


def real_roots(roots: Sequence[str | Path]) -> tuple[Path, ...]:
    """The real paths of the folders a file may be reached in."""
    return tuple(Path(os.path.realpath(r)) for r in roots)


def inside(path: str | Path, roots: Sequence[Path], folder: str) -> Path:
    """The real path of `path` (links followed), refused unless it lies in one of `roots` (real
    paths: `real_roots`); `folder` names them in the refusal ("the attempt folder")."""
    try:
        real = Path(os.path.realpath(path, strict=True))
    except FileNotFoundError:
        if os.path.lexists(path):
            raise FileRefused("is a symbolic link to nothing") from None
        raise FileRefused("no such file", absent=True) from None
    except PermissionError as exc:
        raise FileRefused(f"cannot be reached ({exc.strerror})", permission=True) from None
    except OSError as exc:  # a loop of symbolic links
        raise FileRefused(f"cannot be resolved ({exc.strerror})") from None
    if any(real == root or root in real.parents for root in roots):
        return real
    raise FileRefused(f"is a symbolic link leading outside {folder}; it is not read")


def check_regular(path: str | Path, roots: Sequence[Path], folder: str) -> tuple[Path, os.stat_result]:
    """(real path, stat) of a regular file inside `roots`, without opening it: FileRefused otherwise."""
    real = inside(path, roots, folder)
    try:
        st = os.lstat(real)
    except OSError as exc:
        raise FileRefused(f"cannot be read ({exc.strerror})", permission=isinstance(exc, PermissionError)) from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"is {kind_of(st.st_mode)}, not a regular file; it is not read")
    return real, st


def open_checked(path: str | Path, roots: Sequence[Path], folder: str) -> tuple[int, os.stat_result]:
    """An open descriptor (the caller closes it) of the regular file `path` inside `roots`, and its
    stat. Checked before it is opened (a device is never opened), opened without blocking (a FIFO
    swapped in meanwhile cannot hang it) and not through a link, then checked on the descriptor."""
    real, _ = check_regular(path, roots, folder)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileRefused("no such file", absent=True) from None
    except PermissionError as exc:
        raise FileRefused(f"cannot be read ({exc.strerror})", permission=True) from None
    except OSError as exc:
        raise FileRefused(f"cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"is {kind_of(st.st_mode)}, not a regular file; it is not read")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


@contextmanager
def open_regular(path: str | Path, roots: Sequence[Path], folder: str) -> Iterator[tuple[int, os.stat_result]]:
    """`open_checked`, closed when the block ends."""
    fd, st = open_checked(path, roots, folder)
    try:
        yield fd, st
    finally:
        os.close(fd)


def read_whole(path: str | Path, roots: Sequence[Path], folder: str, *, max_bytes: int) -> bytes:
    """The bytes of a regular file inside `roots` of at most `max_bytes` (checked before reading)."""
    with open_regular(path, roots, folder) as (fd, st):
        if st.st_size > max_bytes:
            raise FileRefused(f"is {st.st_size:,} bytes; at most {max_bytes:,} are read")
        data = read_range(fd, 0, max_bytes + 1)
    if len(data) > max_bytes:  # grew while being read
        raise FileRefused(f"is over {max_bytes:,} bytes; at most {max_bytes:,} are read")
    return data


def read_range(fd: int, start: int, length: int) -> bytes:
    """Up to `length` bytes of `fd` from `start` (fewer at the end of the file)."""
    chunks, pos, end = [], start, start + length
    while pos < end:
        chunk = os.pread(fd, min(BLOCK_BYTES * 16, end - pos), pos)
        if not chunk:
            break
        chunks.append(chunk)
        pos += len(chunk)
    return b"".join(chunks)


def blocks(fd: int, start: int, end: int) -> Iterator[bytes]:
    """The bytes of `fd` from `start` to `end` (or the end of the file), BLOCK_BYTES at a time."""
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(BLOCK_BYTES, end - pos), pos)
        if not chunk:
            return
        yield chunk
        pos += len(chunk)


def line_start(fd: int, size: int, lines: int, *, max_bytes: int | None = None) -> int:
    """Where the last `lines` lines of the first `size` bytes of `fd` begin, found by reading
    backwards block by block: only the bytes from there on are read (plus one block), so the time
    is that of what is shown. A line ends at "\\n", "\\r\\n" or a lone "\\r" (a progress bar
    rewriting its line: what a terminal would show last). With `max_bytes`, at most that many bytes
    from the end, even within a line."""
    floor = 0 if max_bytes is None else max(0, size - max_bytes)
    if lines <= 0:
        return size
    found, end = 0, size
    while end > floor:
        lo = max(floor, end - BLOCK_BYTES)
        chunk = os.pread(fd, end - lo, lo)
        if len(chunk) < end - lo:  # shrank meanwhile: what is left is read again from its end
            end = lo + len(chunk)
            continue
        i, next_end = len(chunk), lo
        nl, cr = chunk.rfind(b"\n", 0, i), chunk.rfind(b"\r", 0, i)
        while max(nl, cr) >= 0:
            j = max(nl, cr)
            after = lo + j + 1
            if chunk[j] == 0x0A and j > 0 and chunk[j - 1] == 0x0D:
                j -= 1  # "\r\n": one line end
            elif chunk[j] == 0x0A and j == 0 and lo > floor and os.pread(fd, 1, lo - 1) == b"\r":
                next_end = lo - 1  # the "\r" of this "\r\n" ends the block before: not a line end of its own
            if after != size:  # the end of the last line is not the start of one
                found += 1
                if found == lines:
                    return after
            i = j
            if nl >= i:
                nl = chunk.rfind(b"\n", 0, i)
            if cr >= i:
                cr = chunk.rfind(b"\r", 0, i)
        end = next_end
    return floor
