"""A chat template is code from a model folder: preflight renders it in a child process bounded in
time and output, so a template that loops 10^10 times (or prints gigabytes) is refused in one line
naming `train.model.path` instead of keeping `enqueue --dry-run` busy without end.

The child is forked (it inherits the loaded tokenizer; nothing is pickled but the text back), sends
at most `MAX_CHARS + 1` characters of the rendering through a pipe, and is killed at `SECONDS`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable

SECONDS = 10.0  # a plain template renders one prompt in milliseconds
MAX_CHARS = 1 << 20  # a prompt is a few hundred characters


class Bounded:
    """`render(question)` run in a child under the bounds; `runaway` holds the refusal once a
    rendering ran past them (render then raises RuntimeError with the same text)."""

    def __init__(self, render: Callable[[str], str], *, seconds: float | None = None,
                 max_chars: int | None = None) -> None:
        self._render = render
        self.seconds = SECONDS if seconds is None else seconds
        self.max_chars = MAX_CHARS if max_chars is None else max_chars
        self.runaway: str | None = None

    def __call__(self, question: str) -> str:
        ctx = multiprocessing.get_context("fork")
        reader, writer = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child, args=(self._render, question, writer, self.max_chars), daemon=True)
        child.start()
        writer.close()
        try:
            if not reader.poll(self.seconds):
                self.runaway = (f"the chat template did not render one prompt within {self.seconds:g} s "
                                f"(a template is code: loops without end?)")
                raise RuntimeError(self.runaway)
            try:
                ok, text = reader.recv()
            except EOFError:
                raise RuntimeError("the chat template's renderer died") from None
        finally:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signal.SIGKILL)
            child.join()
            reader.close()
        if not ok:
            raise text  # the template's own error (raise_exception, a bad keyword value), as rendered here
        if len(text) > self.max_chars:
            self.runaway = f"the chat template renders one prompt to more than {self.max_chars:,} characters"
            raise RuntimeError(self.runaway)
        return text


def _child(render: Callable[[str], str], question: str, writer, max_chars: int) -> None:  # type: ignore[no-untyped-def]
    try:
        result = (True, render(question)[: max_chars + 1])
    except Exception as exc:  # noqa: BLE001  (re-raised by the parent as the template's own error)
        result = (False, exc)
    try:
        writer.send(result)
    except Exception:  # noqa: BLE001  (an exception that does not pickle)
        exc = result[1]
        writer.send((False, RuntimeError(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")))
    writer.close()
    os._exit(0)  # no atexit handlers of the parent's libraries in the fork
