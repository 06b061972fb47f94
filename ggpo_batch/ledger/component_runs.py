"""Artifacts and the nightly component runs (one claim per method, tier and night)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select

from ..errors import LedgerError
from .core import LedgerCore
from .schema import (
    Artifact,
    ComponentRun,
    utcnow,
)


class ComponentRecords(LedgerCore):
    """Artifacts (path + sha256) and component-run rows."""

    def record_artifact(self, *, path: str, sha256: str, size_bytes: int, kind: str, run_id: int | None = None,
                        component_run_id: int | None = None) -> Artifact:
        with self.session() as s:
            a = Artifact(path=path, sha256=sha256, size_bytes=size_bytes, kind=kind, run_id=run_id,
                         component_run_id=component_run_id)
            s.add(a)
            return a

    def claim_night(self, *, method: str, tier: str, night: str, actor: str) -> ComponentRun | None:
        """The once-per-night guard: the first caller for (method, tier, night) gets the row, others None."""
        from sqlalchemy.exc import IntegrityError

        try:
            with self.session() as s:
                cr = ComponentRun(method=method, tier=tier, night=night, state="claimed", actor=actor)
                s.add(cr)
                s.flush()
                return cr
        except IntegrityError:
            return None

    def finish_component_run(self, component_run_id: int, *, state: str, record: Mapping[str, Any] | None,
                             seconds: float | None, commit: str | None, dirty: bool | None,
                             error: str | None = None) -> ComponentRun:
        with self.session() as s:
            cr = s.get(ComponentRun, component_run_id, with_for_update=True)
            if cr is None:
                raise LedgerError(f"no component run {component_run_id}")
            if cr.state != "claimed":
                raise LedgerError(f"component run {component_run_id} already {cr.state}")
            cr.state, cr.record, cr.seconds, cr.commit, cr.dirty, cr.error = (
                state, dict(record) if record is not None else None, seconds, commit, dirty, error)
            cr.finished_at = utcnow()
            return cr

    def component_runs(self, *, method: str | None = None, limit: int = 30) -> list[ComponentRun]:
        with self.session() as s:
            q = select(ComponentRun).order_by(ComponentRun.night.desc(), ComponentRun.id.desc()).limit(limit)
            if method is not None:
                q = q.where(ComponentRun.method == method)
            return list(s.scalars(q))

    def artifacts(self, *, run_id: int | None = None, component_run_id: int | None = None) -> list[Artifact]:
        with self.session() as s:
            q = select(Artifact).order_by(Artifact.id)
            if run_id is not None:
                q = q.where(Artifact.run_id == run_id)
            if component_run_id is not None:
                q = q.where(Artifact.component_run_id == component_run_id)
            return list(s.scalars(q))
