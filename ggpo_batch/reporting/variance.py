"""The sigma to plan seeds with: the sd of the paired differences (arm - baseline, per seed) of one
metric, pooled over the ledger's earlier experiments of the same method.

Never plan with the sigma of a 3-seed pilot alone (2 df: sigma anywhere in [0.52 s, 6.28 s]). Each
earlier comparison (experiment version, arm vs its baseline, n seeds) gives an s with n - 1 df; the
pooled s_p^2 = sum df s^2 / sum df, and the experiments and degrees of freedom behind it are named.
The differences are the report's own (`report.experiment_report`), so what counts as a pair has one
home. The newest HISTORY_EXPERIMENTS versions of the method are read (older code is a worse guide,
as for the cost guard's history), or only those named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import LedgerError
from ..ledger import Ledger
from . import power as pw
from .powered import arm_tests
from .report import experiment_report

HISTORY_EXPERIMENTS = 50


@dataclass(frozen=True)
class Sigma:
    """The sd of the paired differences, with where it came from."""

    value: float
    df: int | None  # None: given, not estimated (no uncertainty to plan around)
    source: str  # "ledger" | "given"
    experiments: tuple[str, ...] = field(default_factory=tuple)  # "NAME vV (k comparisons, df D)"

    def as_dict(self) -> dict[str, object]:
        return {"value": self.value, "source": self.source, "df": self.df, "experiments": list(self.experiments)}


def ledger_sigma(ledger: Ledger, *, method: str, metric: str,
                 only: Sequence[tuple[str, int | None]] | None = None,
                 limit: int = HISTORY_EXPERIMENTS) -> Sigma | None:
    """Sigma pooled over the comparisons of `metric` in the ledger's experiments of `method` (the newest
    `limit` versions, or `only` these NAME[@VERSION]); None without a comparison of 2 seeds or more."""
    if only:
        versions = []
        for name, version in only:
            have = ledger.experiments(name)
            if not have:
                raise LedgerError(f"--from {name}: no such experiment in the ledger")
            chosen = [e for e in have if version is None or e.version == version]
            if not chosen:
                raise LedgerError(f"--from {name}@{version}: no such version (versions: "
                                  f"{', '.join(str(e.version) for e in have)})")
            versions += chosen
    else:
        versions = sorted((e for e in ledger.experiments() if e.method == method), key=lambda e: e.id,
                          reverse=True)[:limit]
    groups: list[tuple[float, int]] = []
    named: list[str] = []
    for exp in versions:
        tests = arm_tests(experiment_report(ledger, exp.name, version=exp.version), metric)
        if not tests:
            continue
        mine = [(t.sd, t.n - 1) for t in tests.values()]
        groups += mine
        named.append(f"{exp.name} v{exp.version} ({len(mine)} comparison{'s' if len(mine) != 1 else ''}, "
                     f"{sum(d for _, d in mine)} df)")
    pool = pw.pooled_sd(groups)
    if pool is None:
        return None
    return Sigma(pool[0], pool[1], "ledger", tuple(named))
