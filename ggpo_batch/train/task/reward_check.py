"""Preflight's check of a user's reward file: a reward is code, so it is imported and called in a child
process bounded in time (as a chat template is rendered, pretrained/template_sandbox.py), on two rows
of the data with their gold answers as completions, exactly as the job will call it
(`rewards.Rewards`). What is wrong comes back as one line: the file is missing, does not import,
lacks the function, takes the wrong arguments, returns anything but one finite number per
completion, or does not return in time.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from .items import Item
from .rewards import MissingFunction, check_scores, last_line, load_user_function, user_kwargs

# Preflight's time limit for importing the file and making one call, whatever the spec's per-call limit.
PREFLIGHT_SECONDS_MAX = 60.0


def check_user_reward(file: str, function: str, rows: Sequence[Item], *, seconds: float) -> str | None:
    """What is wrong with reward `file:function` called on `rows` (None: it works)."""
    if not Path(file).is_file():
        return "is absent from this machine" if not Path(file).exists() else "is not a regular file"
    limit = min(seconds, PREFLIGHT_SECONDS_MAX)
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(file, function, list(rows), writer), daemon=True)
    child.start()
    writer.close()
    try:
        if not reader.poll(limit):
            return f"did not return within {limit:g} s (importing it and scoring {len(rows)} rows): a loop without end?"
        try:
            return reader.recv()
        except EOFError:
            return "the process that imported it died (it called exit, or crashed the interpreter)"
    finally:
        if child.is_alive() and child.pid is not None:
            os.kill(child.pid, signal.SIGKILL)
        child.join()
        reader.close()


def _child(file: str, function: str, rows: list[Item], writer) -> None:  # type: ignore[no-untyped-def]
    try:
        result = _problem(file, function, rows)
    except BaseException as exc:  # noqa: BLE001  (anything the user's code raises is the answer)
        result = f"raised {last_line(exc)}"
    try:
        writer.send(result)
    finally:
        writer.close()
        os._exit(0)  # no atexit handlers of the parent's libraries in the fork


def _problem(file: str, function: str, rows: list[Item]) -> str | None:
    try:
        fn = load_user_function(file, function)
    except MissingFunction:
        return f"has no function {function!r}"
    except BaseException as exc:  # noqa: BLE001
        return f"does not import: {last_line(exc)}"
    prompts = [it.prompt_value() for it in rows]
    completions = [it.answer for it in rows]
    kwargs = user_kwargs(rows)
    try:
        inspect.signature(fn).bind(prompts, completions, **kwargs)
    except TypeError as exc:
        return (f"has the wrong signature {function}{_signature(fn)}: called as {function}(prompts, completions, "
                f"**columns) with columns {', '.join(sorted(kwargs))}: {exc}")
    except ValueError:
        pass  # a builtin without a signature: the call says
    try:
        got = fn(prompts, completions, **kwargs)
    except BaseException as exc:  # noqa: BLE001
        return f"raised on {len(rows)} rows with their gold answers as completions: {last_line(exc)}"
    problem = check_scores(got, len(rows))
    return None if problem is None else f"{problem} (called on {len(rows)} rows with their gold answers)"


def _signature(fn: object) -> str:
    try:
        return str(inspect.signature(fn))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "(...)"
