"""A run's reward: `[train.task] reward`, one or several summed with `reward_weights`.

Built-ins: `retrieval_qa` (the verifier of qa.py, exactly), `exact_match` and `token_f1` (SQuAD's
normalisation: lower case, no punctuation, no articles), `math` (answer equivalence through the
math-verify library; a completion it cannot parse, or that takes longer than the time limit, scores
0 and is counted in `counts["math_unparsed"]`). A user's `FILE.py:FUNCTION` is called as TRL calls a
reward function: `f(prompts=[...], completions=[...], **columns)` with each data column as a list,
completions as decoded text without the end of turn; it must return one finite number per completion
within `reward_timeout_seconds`, else the run fails (`RewardError`: the file, the row's id, the last
line of the exception).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import re
import signal
import string
import sys
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...errors import GgpoError
from ..task_config import TaskConfig, user_reward
from .items import Item


class MissingFunction(LookupError):
    """A reward file that imports but has no such function."""


class RewardError(GgpoError):
    """A user's reward that raised, hung or returned what is not one finite number per completion."""

    exit_code = 1


def squad_normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and the articles a/an/the removed."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_match(completion: str, item: Item) -> float:
    got = squad_normalize(completion)
    return float(any(got == squad_normalize(g) for g in item.answers))


def token_f1(completion: str, item: Item) -> float:
    """SQuAD's token F1, the best over the gold answers."""
    got = squad_normalize(completion).split()
    best = 0.0
    for gold in item.answers:
        want = squad_normalize(gold).split()
        if not got or not want:
            best = max(best, float(got == want))
            continue
        common = sum((Counter(got) & Counter(want)).values())
        if common:
            p, r = common / len(got), common / len(want)
            best = max(best, 2 * p * r / (p + r))
    return best


class MathReward:
    """Equivalence of the completion's final answer with a gold answer, by math-verify."""

    def __init__(self, timeout_seconds: float) -> None:
        from math_verify import (  # the `math` reward's library: preflight says when it is missing
            parse,
            verify,
        )

        self._parse, self._verify = parse, verify
        self.timeout = max(1, math.ceil(timeout_seconds))
        self.unparsed = 0
        self.counting = True  # off while the audit re-scores what was already counted

    def __call__(self, completion: str, item: Item) -> float:
        # math-verify bounds its time with SIGALRM, which only the main thread may set.
        limit = self.timeout if threading.current_thread() is threading.main_thread() else None
        try:
            got = self._parse(completion, parsing_timeout=limit)
            if not got:
                self.unparsed += int(self.counting)
                return 0.0
            for gold in item.answers:
                want = self._parse(gold if "$" in gold or "\\" in gold else f"${gold}$", parsing_timeout=limit)
                if want and self._verify(want, got, timeout_seconds=limit):
                    return 1.0
        except Exception:  # noqa: BLE001  (its own TimeoutException and sympy's errors: scored 0, counted)
            self.unparsed += int(self.counting)
        return 0.0


def load_user_function(file: str, function: str) -> Callable[..., Any]:
    """The function `function` of the Python file `file`, imported as a module of its own."""
    name = "ggpo_user_reward_" + hashlib.sha256(file.encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise MissingFunction(f"has no function {function!r}")
    return fn


def file_sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def reward_files(task: TaskConfig | None) -> dict[str, str]:
    """{file: sha256} of each user reward file (its provenance); {} for built-ins only."""
    out = {}
    for file, _fn in (task.user_files if task is not None else ()):
        try:
            out[file] = file_sha256(file)
        except OSError:
            out[file] = "unreadable"
    return out


def last_line(exc: BaseException) -> str:
    """The exception's type and the last line of its message (a traceback's last line, named)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}".strip()[:300]


def call_bounded(fn: Callable[..., Any], seconds: float, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, TimeoutError past `seconds`. In the main thread (a rank's trainer) by SIGALRM,
    so the call runs where a reward that bounds its own time with SIGALRM (math-verify, as TRL's accuracy
    reward uses it) may; elsewhere in a thread of its own, left behind when it hangs (the run fails on it)."""
    if threading.current_thread() is threading.main_thread():
        return _alarm_bounded(fn, seconds, *args, **kwargs)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001  (handed to the caller)
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True, name="user-reward")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TimeoutError(f"did not return within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Expired(BaseException):
    """Raised into the reward by the alarm; a BaseException, so `except Exception` in it does not swallow it."""


def _alarm_bounded(fn: Callable[..., Any], seconds: float, *args: Any, **kwargs: Any) -> Any:
    def expire(signum: int, frame: Any) -> None:
        raise _Expired

    before = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn(*args, **kwargs)
    except _Expired:
        raise TimeoutError(f"did not return within {seconds:g} s") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def check_scores(value: Any, n: int) -> str | None:
    """What is wrong with a reward function's return for `n` completions (None: a list of n finite floats)."""
    if not isinstance(value, (list, tuple)):
        return f"returned {type(value).__name__}, not a list of numbers"
    if len(value) != n:
        return f"returned {len(value)} numbers for {n} completions"
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"returned {type(v).__name__} at [{i}], not a number"
        if not math.isfinite(v):
            return f"returned {v} at [{i}], not a finite number"
    return None


def user_kwargs(items: Sequence[Item]) -> dict[str, list[Any]]:
    """The data columns as TRL gives them: one list per column, one entry per completion."""
    rows = [it.reward_columns() for it in items]
    keys = sorted({k for r in rows for k in r} - {"prompts", "completions"})
    return {k: [r.get(k) for r in rows] for k in keys}


class Rewards:
    """The configured rewards, summed with their weights, over a batch of (item, completion)."""

    def __init__(self, task: TaskConfig | None) -> None:
        from . import qa

        self.task = task or TaskConfig()
        self._math: MathReward | None = None
        self._parts: list[tuple[str, float, Callable[..., list[float]]]] = []
        for name, weight in zip(self.task.rewards, self.task.weights):
            self._parts.append((name, weight, self._make(name, qa.score)))

    def _make(self, name: str, verifier: Callable[[str, Item], float]) -> Callable[..., list[float]]:
        per_item: Callable[[str, Item], float] | None = {
            "retrieval_qa": verifier, "exact_match": exact_match, "token_f1": token_f1}.get(name)
        if name == "math":
            self._math = per_item = MathReward(self.task.reward_timeout_seconds)
        if per_item is not None:
            one = per_item
            return lambda items, completions: [one(c, it) for it, c in zip(items, completions)]
        u = user_reward(name)
        assert u is not None, name  # TaskConfig refused anything else
        return self._user(*u)

    def _user(self, file: str, function: str) -> Callable[..., list[float]]:
        try:
            fn = load_user_function(file, function)
        except BaseException as exc:  # noqa: BLE001  (the file's own error, named in the run's reason)
            raise RewardError(f"reward {file}:{function}: cannot be loaded: {last_line(exc)}") from None
        seconds = self.task.reward_timeout_seconds

        def call(items: Sequence[Item], completions: list[str]) -> list[float]:
            first = items[0].item_id if items else "-"
            where = f"reward {file}:{function}, row {first!r}" + (f" (a call of {len(items)})" if len(items) > 1 else "")
            try:
                got = call_bounded(fn, seconds, [it.prompt_value() for it in items], list(completions),
                                   **user_kwargs(items))
            except BaseException as exc:  # noqa: BLE001
                raise RewardError(f"{where}: {last_line(exc)}") from None
            problem = check_scores(got, len(items))
            if problem is not None:
                bad = next((i for i, v in enumerate(got) if isinstance(v, float) and not math.isfinite(v)), None) \
                    if isinstance(got, (list, tuple)) and len(got) == len(items) else None
                at = f"reward {file}:{function}, row {items[bad].item_id!r}" if bad is not None else where
                raise RewardError(f"{at}: {problem}")
            return [float(v) for v in got]

        return call

    def __call__(self, items: Sequence[Item], completions: Sequence[str], *, count: bool = True) -> list[float]:
        """The weighted sum of the rewards of each completion; `count=False` when re-scoring (the audit)."""
        if not items:
            return []
        if self._math is not None:
            self._math.counting = count
        total = [0.0] * len(items)
        for _name, weight, part in self._parts:
            for i, v in enumerate(part(items, list(completions))):
                total[i] += weight * v
        return total

    def counts(self) -> dict[str, int]:
        """What the record counts: completions math-verify could not parse in time."""
        return {"math_unparsed": self._math.unparsed} if self._math is not None else {}


def score_trajectories(trajectories: Sequence[Any], rewards: Rewards | None) -> None:
    """Each trajectory's reward from its answer: `rewards` (the run's), or the retrieval verifier."""
    from .qa import score

    if rewards is None:
        for t in trajectories:
            t.reward = score(t.answer, t.item)
        return
    for t, r in zip(trajectories, rewards([t.item for t in trajectories], [t.answer for t in trajectories])):
        t.reward = r
