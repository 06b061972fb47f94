"""Progress of long CLI work: a live bar on a terminal (rich), plain lines otherwise, nothing at all
unless a command asked for it.

Library code (the inline queue, the worker, the importer, reconcile's wait) reports through
`task()`; only the CLI turns a display on (`shown()`), on stderr, so `--json` output on stdout
stays clean and tests, jobs and workers without a display pay nothing. A task may `watch` an
attempt folder: the run's heartbeat (step, loop seconds of the budget) is read from it while the
task waits, so a run that takes an hour shows where it is.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ..contracts.heartbeat import progress_text, read_heartbeat

PLAIN_INTERVAL_S = 30.0  # a plain line at most this often while nothing else happens
LIVE_INTERVAL_S = 1.0


class Task:
    """One piece of long work: `total` units (None: unknown), a current note, an optional watched folder."""

    def __init__(self, display: _Display | None, description: str, total: int | None) -> None:
        self._display, self.description, self.total = display, description, total
        self.begun = False  # on the display yet (a task shown only after a delay is not, at first)
        self.done = 0
        self.note_text = ""
        self.since = time.monotonic()
        self.watched: Path | None = None

    def advance(self, n: int = 1, note: str | None = None) -> None:
        """`n` more units done; shown at once with `note` (else the current note)."""
        self.done += n
        if note is not None:
            self._set(note)
        if self._display is not None and self.begun:
            self._display.changed(self, line=self.note_text or "done")

    def note(self, text: str, *, show: bool = True) -> None:
        """What the task is doing now; `show=False` keeps it for the next line instead of printing it."""
        self._set(text)
        if show and self._display is not None and self.begun:
            self._display.changed(self, line=text)

    def _set(self, text: str) -> None:
        self.note_text, self.since = text, time.monotonic()

    def watch(self, folder: Path | None) -> None:
        """Show the heartbeat written in `folder` (an attempt folder) while this task waits."""
        self.watched = folder

    def status_text(self) -> str:
        """The note, and the watched run's heartbeat (or, before its first one, how long it has waited)."""
        beat = heartbeat_text(self.watched) if self.watched is not None else ""
        if self.watched is not None and not beat:
            beat = f"(no heartbeat yet, {time.monotonic() - self.since:.0f} s)"
        return " ".join(p for p in (self.note_text, beat) if p)


def heartbeat_text(folder: Path) -> str:
    """`step 41  1830/2700 s` from an attempt folder's heartbeat; empty before the first one."""
    hb = read_heartbeat(folder)
    return progress_text(hb.to_dict()) if hb is not None else ""


class _Display:
    """Open tasks, the deferred ones shown when due, and a ticker thread that calls `tick()` every
    half second while the display is on."""

    TICK_S = 0.5

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.tasks: list[Task] = []  # every open task, shown or not yet
        self._due: dict[int, float] = {}  # id(task) -> when a deferred task is shown
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._run_ticker, name="ggpo-progress", daemon=True)

    def start(self) -> None:
        self._ticker.start()

    def _run_ticker(self) -> None:
        while not self._stop.wait(self.TICK_S):
            self.show_due()
            self.tick()

    def open(self, task: Task, after: float) -> None:
        with self._lock:
            self.tasks.append(task)
            if after > 0:
                self._due[id(task)] = time.monotonic() + after
            else:
                self._show(task)

    def _show(self, task: Task) -> None:
        task.begun = True
        self.begin(task)

    def show_due(self) -> None:
        """Show the deferred tasks whose delay has passed (called by the display's ticker)."""
        with self._lock:
            now = time.monotonic()
            for task in list(self.tasks):
                due = self._due.get(id(task))
                if due is not None and due <= now:
                    del self._due[id(task)]
                    self._show(task)

    def close_task(self, task: Task) -> None:
        with self._lock:
            self._due.pop(id(task), None)
            self.tasks.remove(task)
            if task.begun:
                self.end(task)

    def begin(self, task: Task) -> None:
        pass

    def end(self, task: Task) -> None:
        pass

    def changed(self, task: Task, line: str | None) -> None:  # pragma: no cover - overridden
        pass

    def tick(self) -> None:
        pass

    def close(self) -> None:
        self._stop.set()


class _Plain(_Display):
    """Not a terminal (CI logs, `| tee`): a line per event, and the watched heartbeat now and then."""

    def __init__(self, stream: IO[str], interval: float = PLAIN_INTERVAL_S) -> None:
        super().__init__(stream)
        self.interval = interval
        self._last = time.monotonic()
        self.start()

    def _emit(self, task: Task, text: str) -> None:
        count = f" {task.done}/{task.total}" if task.total is not None else (f" {task.done}" if task.done else "")
        print(f"{task.description}{count}: {text}" if text else f"{task.description}{count}",
              file=self.stream, flush=True)
        self._last = time.monotonic()

    def begin(self, task: Task) -> None:
        self._emit(task, task.status_text() or "started")

    def changed(self, task: Task, line: str | None) -> None:
        if line:
            self._emit(task, line)

    def tick(self) -> None:
        if time.monotonic() - self._last < self.interval:
            return
        for task in list(self.tasks):
            if task.begun and (task.watched is not None or task.note_text):
                self._emit(task, task.status_text())


class _Live(_Display):
    """A terminal: one rich bar per task, redrawn every second (the heartbeat read on each redraw)."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from ..config.masking import layout_stream

        self.bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("{task.fields[status]}"),
                             console=Console(file=layout_stream(stream)), refresh_per_second=1 / LIVE_INTERVAL_S, transient=False)
        self.ids: dict[int, Any] = {}
        self.bars.start()
        self.start()

    def begin(self, task: Task) -> None:
        self.ids[id(task)] = self.bars.add_task(task.description, total=task.total, status="")
        self._update(task)

    def end(self, task: Task) -> None:
        self._update(task)

    def _update(self, task: Task) -> None:
        tid = self.ids.get(id(task))
        if tid is not None:
            self.bars.update(tid, completed=task.done, status=task.status_text())

    def changed(self, task: Task, line: str | None) -> None:
        self._update(task)

    def tick(self) -> None:
        for task in list(self.tasks):
            if task.begun:
                self._update(task)

    def close(self) -> None:
        super().close()
        self.bars.stop()


_display: _Display | None = None


@contextmanager
def shown(stream: IO[str] | None = None, *, live: bool | None = None) -> Iterator[None]:
    """Turn the display on for the duration of a command: live bars when `stream` (stderr by
    default) is a terminal, plain lines otherwise."""
    global _display
    stream = stream or sys.stderr
    if live is None:
        live = stream.isatty()
    previous, _display = _display, (_Live(stream) if live else _Plain(stream))
    try:
        yield
    finally:
        _display.close()
        _display = previous


def current() -> Task | None:
    """The innermost open task, for code deep in a task's work to add what it knows."""
    return _display.tasks[-1] if _display is not None and _display.tasks else None


@contextmanager
def task(description: str, total: int | None = None, *, after: float = 0.0) -> Iterator[Task]:
    """Report a piece of long work; silent unless a command turned the display on. With `after`,
    it shows only once it has taken that many seconds: quick work (a refused file) prints nothing
    beside its own answer."""
    t = Task(_display, description, total)
    display = _display
    if display is not None:
        display.open(t, after)
    try:
        yield t
    finally:
        if display is not None:
            display.close_task(t)
