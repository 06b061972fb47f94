"""`ggpo-batch costs`: GPU-hours booked, attempts and decided not spent, by user, experiment,
queue or month."""

from __future__ import annotations

from datetime import datetime

import click

from ..contracts.accounting import COST_GROUPS
from .app import App, cli, echo_json, pass_reader


@cli.command()
@click.option("--by", "by", type=click.Choice(COST_GROUPS), default="user", show_default=True,
              help="Group by who created the experiment (who is charged), experiment name, queue, or month (UTC).")
@click.option("--since", type=click.DateTime(formats=["%Y-%m-%d"]), metavar="YYYY-MM-DD",
              help="Only what was booked (or decided) on or after this day (UTC).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_reader
def costs(app: App, by: str, since: datetime | None, as_json: bool) -> None:
    """GPU-hours booked, attempts, and GPU-hours decided not spent, per user, experiment, queue or month.

    \b
    Booked: every attempt's GPU-hours (the scheduler's figure, else the job's own); a running attempt
    counts once reconcile books its end. Decided not spent: the estimates of runs decided
    not_reproduced (too expensive), and of such a decision made before its experiment had runs.
    One query over the ledger; reads only (works on a ledger you may not write).

    \b
    --json: {"by", "since", "rows": [{"key", "gpu_hours", "attempts", "decided_not_spent_gpu_hours"}],
    "totals": {"gpu_hours", "attempts", "decided_not_spent_gpu_hours"}}
    """
    from ..reporting.spending import cost_view

    view = cost_view(app.ledger(), by=by, since=since.date() if since else None, default_queue=app.settings.queue)
    if as_json:
        echo_json("costs", view)
        return
    from .tables import print_costs

    print_costs(view)
