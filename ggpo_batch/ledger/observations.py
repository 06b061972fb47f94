"""What a job recorded of itself, booked with its attempt's end: the attempt's provenance
(ggpo_batch/contracts/provenance.py) and the run's learning curve (ggpo_batch/contracts/curve.py), and their reads.

Settlement hands an `Observations` to `mark_finished` / `settle_attempt`, which write it in the
transaction that ends the attempt: the provenance row of the attempt, and the run's curve points in
one bulk insert (replacing those an earlier attempt of the run booked: a resumed run's history holds
the earlier steps too). Reads are by experiment or by run, a few queries whatever the count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, insert, select

from ..contracts.curve import FIGURES
from .core import LedgerCore
from .schema import AttemptProvenance, CurvePoint, Run

_PROV, _POINTS = AttemptProvenance.__table__, CurvePoint.__table__
_CHUNK = 500  # ids per IN list


@dataclass(frozen=True)
class Observations:
    """An attempt's provenance document (without its distributions list, which comes apart) and
    the run's curve points ({"step", *curve.FIGURES}); None: nothing to book."""

    provenance: Mapping[str, Any] | None = None
    distributions: Sequence[str] | None = None
    curve: Sequence[Mapping[str, Any]] | None = None

    def write(self, conn: Connection, run_id: int, attempt_id: int) -> None:
        """Book them on `conn`, inside the transaction that ends the attempt."""
        if self.provenance is not None:
            conn.execute(delete(_PROV).where(_PROV.c.attempt_id == attempt_id))
            conn.execute(insert(_PROV), {"attempt_id": attempt_id, "run_id": run_id, "document": dict(self.provenance),
                                         "distributions": {"names": list(self.distributions)}
                                         if self.distributions is not None else None})
        if self.curve:
            conn.execute(delete(_POINTS).where(_POINTS.c.run_id == run_id))
            conn.execute(insert(_POINTS), [{"run_id": run_id, "attempt_id": attempt_id, "step": p["step"],
                                            **{f: p.get(f) for f in FIGURES}} for p in self.curve])


def _chunks(ids: Iterable[int]) -> Iterable[list[int]]:
    ids = sorted(set(ids))
    for i in range(0, len(ids), _CHUNK):
        yield ids[i:i + _CHUNK]


class ObservationRecords(LedgerCore):
    """Reads of provenance and learning curves."""

    def latest_provenance(self, run_ids: Iterable[int]) -> dict[int, tuple[int, dict[str, Any]]]:
        """Run id -> (attempt id, document) of each run's latest attempt that has a provenance."""
        out: dict[int, tuple[int, dict[str, Any]]] = {}
        with self.reading() as conn:
            for ids in _chunks(run_ids):
                for att, run, doc in conn.execute(select(_PROV.c.attempt_id, _PROV.c.run_id, _PROV.c.document)
                                                  .where(_PROV.c.run_id.in_(ids)).order_by(_PROV.c.attempt_id)):
                    out[run] = (att, doc)
        return out

    def attempt_provenance(self, attempt_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
        """Attempt id -> its provenance document, for the attempts that have one."""
        out: dict[int, dict[str, Any]] = {}
        with self.reading() as conn:
            for ids in _chunks(attempt_ids):
                out.update((att, doc) for att, doc in conn.execute(select(_PROV.c.attempt_id, _PROV.c.document)
                                                                   .where(_PROV.c.attempt_id.in_(ids))))
        return out

    def distributions(self, attempt_ids: Iterable[int]) -> dict[int, list[str]]:
        """Attempt id -> the `name==version` of every distribution installed where it ran."""
        out: dict[int, list[str]] = {}
        with self.reading() as conn:
            for ids in _chunks(attempt_ids):
                for att, listed in conn.execute(select(_PROV.c.attempt_id, _PROV.c.distributions)
                                                .where(_PROV.c.attempt_id.in_(ids))):
                    if isinstance(listed, dict) and isinstance(listed.get("names"), list):
                        out[att] = [str(n) for n in listed["names"]]
        return out

    def curves(self, experiment_id: int, figures: Sequence[str] = FIGURES,
               run_ids: Iterable[int] | None = None) -> dict[int, dict[str, list[Any]]]:
        """Run id -> its curve as columns ({"step": [...], figure: [...]}, in step order), for the
        runs of one experiment version (or only `run_ids` of it) that have one."""
        unknown = set(figures) - set(FIGURES)
        if unknown:
            raise ValueError(f"not curve figures: {sorted(unknown)}")
        cols = [_POINTS.c.run_id, _POINTS.c.step, *(_POINTS.c[f] for f in figures)]
        q = (select(*cols).join_from(_POINTS, Run.__table__, Run.__table__.c.id == _POINTS.c.run_id)
             .where(Run.__table__.c.experiment_id == experiment_id))
        if run_ids is not None:
            q = q.where(_POINTS.c.run_id.in_(sorted(set(run_ids))))
        out: dict[int, dict[str, list[Any]]] = {}
        names = ("step", *figures)
        with self.reading() as conn:
            for row in conn.execute(q.order_by(_POINTS.c.run_id, _POINTS.c.step)):
                columns = out.get(row[0])
                if columns is None:
                    columns = out[row[0]] = {n: [] for n in names}
                for name, value in zip(names, row[1:]):
                    columns[name].append(value)
        return out
