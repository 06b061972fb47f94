"""Comparability of an experiment's runs by what they ran: `code_differs`, `environment_differs` and
`hardware_differs`, beside fairness.py's warnings, each naming the fields that differ and which runs
have which value (run_provenance.COMPARED: node names and times may differ, a commit may not).

Compared over the runs the report compares (succeeded, audit passed) that have a provenance, across
arms and seeds alike; runs without one (imported, or older than provenance) are counted in a note.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..contracts.provenance import COMPARED
from .fairness import warning

KINDS = {"code": "code_differs", "environment": "environment_differs", "hardware": "hardware_differs"}
_LABELS = {"uncommitted_sha256": "uncommitted changes", "installed_sha256": "installed files",
           "wheel_sha256": "wheel", "distributions_sha256": "installed distributions", "image_digest": "image",
           "accelerator_memory_gib": "accelerator memory (GiB)", "accelerators": "accelerators per node",
           "cpu": "CPU", "reward_sha256": "reward files"}
_HASHES = ("commit", "uncommitted_sha256", "reward_sha256", "installed_sha256", "wheel_sha256", "distributions_sha256",
           "image_digest")
_RUNS_NAMED = 8  # runs named per value at most
_DISTRIBUTIONS_NAMED = 8

Rows = Mapping[str, Sequence[Mapping[str, Any]]]
Distributions = Callable[[Iterable[int]], Mapping[int, Sequence[str]]]


def _compared(by_arm: Rows) -> list[tuple[str, Mapping[str, Any]]]:
    return [(arm, r) for arm in sorted(by_arm) for r in by_arm[arm] if "steps" in r and r.get("provenance")]


def provenance_warnings(by_arm: Rows, distributions: Distributions | None = None) -> list[dict[str, Any]]:
    """One warning per section (code, environment, hardware) whose compared fields are not the same
    for every compared run. Rows carry "provenance" (the document) and "provenance_attempt" (its
    attempt id); `distributions(attempt ids)` names the distributions that differ, when given."""
    rows = _compared(by_arm)
    out = []
    for section, kind in KINDS.items():
        groups: dict[tuple[Any, ...], list[tuple[str, Mapping[str, Any]]]] = defaultdict(list)
        for arm, r in rows:
            part = r["provenance"].get(section) or {}
            groups[tuple(part.get(f) for f in COMPARED[section])].append((arm, r))
        if len(groups) < 2:
            continue
        keys = list(groups)
        fields = [f for i, f in enumerate(COMPARED[section]) if len({k[i] for k in keys}) > 1]
        parts = []
        for f in fields:
            i = COMPARED[section].index(f)
            values: dict[Any, list[tuple[str, Mapping[str, Any]]]] = defaultdict(list)
            for k in keys:
                values[k[i]] += groups[k]
            # In the order of the first run (arm, seed) that has each value: a reader sees seed 1's first.
            ordered = sorted(values.items(), key=lambda x: min((a, r["seed"]) for a, r in x[1]))
            text = " vs ".join(f"{_show(f, v)} ({_runs(rs)})" for v, rs in ordered)
            if f == "distributions_sha256" and distributions is not None:
                text += _which_distributions(dict(ordered), distributions)
            parts.append(f"{_LABELS.get(f, f)}: {text}")
        largest = max(keys, key=lambda k: len(groups[k]))
        arms = sorted({a for k in keys if k != largest for a, _ in groups[k]})
        out.append(warning(kind, arms, f"{section} differs between runs: " + "; ".join(parts)))
    return out


def provenance_notes(by_arm: Rows) -> list[str]:
    """A note when some compared runs have a provenance and others have none."""
    ok = [r for rows in by_arm.values() for r in rows if "steps" in r]
    known = [r for r in ok if r.get("provenance")]
    if known and len(known) < len(ok):
        return [(f"{len(ok) - len(known)} of {len(ok)} comparable runs have no provenance (imported, or run before "
                 f"provenance was recorded): their code, environment and hardware are not compared")]
    return []


def _show(field: str, value: Any) -> str:
    if value is None:
        return "none"
    if field in _HASHES and isinstance(value, str):
        return value.removeprefix("sha256:")[:12]
    return str(value)


def _runs(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    by_arm: dict[str, list[int]] = defaultdict(list)
    for arm, r in rows:
        by_arm[arm].append(r["seed"])
    named, text = 0, []
    for arm in sorted(by_arm):
        seeds = sorted(by_arm[arm])
        shown = seeds[:max(1, _RUNS_NAMED - named)]
        named += len(shown)
        more = f" and {len(seeds) - len(shown)} more" if len(shown) < len(seeds) else ""
        text.append(f"{arm} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, shown))}{more}")
    return "; ".join(text)


def _which_distributions(values: Mapping[Any, Sequence[tuple[str, Mapping[str, Any]]]],
                         distributions: Distributions) -> str:
    """` (numpy 2.1.0 / 2.1.3, ...)`: the distributions whose versions differ between the groups."""
    first = {v: rs[0][1].get("provenance_attempt") for v, rs in values.items()}
    listed = distributions([a for a in first.values() if a is not None])
    versions: list[dict[str, str]] = []
    for att in first.values():
        names = listed.get(att) if att is not None else None
        if names is None:
            return ""
        versions.append(dict(n.partition("==")[::2] for n in names))
    every = sorted(set().union(*versions))
    differ = [n for n in every if len({v.get(n) for v in versions}) > 1]
    if not differ:
        return ""
    shown = [f"{n} {' / '.join(v.get(n) or 'absent' for v in versions)}" for n in differ[:_DISTRIBUTIONS_NAMED]]
    more = f", and {len(differ) - len(shown)} more" if len(differ) > len(shown) else ""
    return f" ({', '.join(shown)}{more})"

