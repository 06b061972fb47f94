"""Who paid: GPU-hours booked, attempts and GPU-hours decided not spent, grouped by user,
experiment, queue or month. The one library call behind `ggpo-batch costs` and the dashboard's
cost page; the figures come from one query (`Ledger.cost_rows`).

- booked GPU-hours: every attempt's figure, the scheduler's (AllocTRES gres/gpu x ElapsedRaw) where
  it has one, else the job's own; an attempt still running counts 0 until reconcile books it;
- attempts: every attempt, whatever it became (a retry's cost is visible);
- decided not spent: the estimates of runs decided `not_reproduced` (what `status` and `report`
  call decided not spent), and of a not-reproduced decision made before its experiment had runs.

A user is who created the experiment (on a team ledger their database role: who is charged, not
the service that submitted); a month is when an attempt was booked (its end; its start while it
runs), when a run was decided, or when a decision was made (UTC).
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from typing import Any

from ..contracts.accounting import COST_GROUPS
from ..ledger import Ledger


def cost_view(ledger: Ledger, *, by: str, since: date | None = None, default_queue: str) -> dict[str, Any]:
    """The cost table (the `costs` JSON document's fields): one row per group, then the totals."""
    start = datetime(since.year, since.month, since.day, tzinfo=UTC) if since is not None else None
    rows = ledger.cost_rows(by, since=start, default_queue=default_queue)
    out = [{"key": r.key, "gpu_hours": r.gpu_hours, "attempts": r.attempts,
            "decided_not_spent_gpu_hours": r.decided_not_spent_gpu_hours} for r in rows]
    totals = {"gpu_hours": math.fsum(r.gpu_hours for r in rows), "attempts": sum(r.attempts for r in rows),
              "decided_not_spent_gpu_hours": math.fsum(r.decided_not_spent_gpu_hours for r in rows)}
    return {"by": by, "since": since.isoformat() if since is not None else None, "rows": out, "totals": totals}


__all__ = ["COST_GROUPS", "cost_view"]
