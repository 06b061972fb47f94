"""`ggpo-batch notifications`: the outbox's undelivered notifications and each sink's health
(ggpo_batch/notify/view.py)."""

from __future__ import annotations

import click

from .app import COUNT_VALUE, App, cli, echo_json, pass_reader


@cli.command()
@click.option("--all", "everything", is_flag=True, help="Delivered notifications too, not only those pending or failed.")
@click.option("--limit", "-n", default=50, show_default=True, type=click.IntRange(0, None), callback=COUNT_VALUE,
              help="At most this many notifications, newest first.")
@click.option("--json", "as_json", is_flag=True, help="As JSON.")
@pass_reader
def notifications(app: App, everything: bool, limit: int, as_json: bool) -> None:
    """Show the notifications not delivered yet (or given up on), and each sink's state: a sink
    whose deliveries keep failing is dead or misconfigured (its last error says which).

    \b
    Notifications (a run failed, lost or hung; an experiment finished; a cost decision; a nightly
    metric moved or a night missed) are written to the ledger's outbox when they happen and sent
    by reconcile (every worker runs it) to the webhooks and e-mail set by GGPO_NOTIFY_* or the
    [notify] table of a settings file (`ggpo-batch config` shows them). A failed delivery is
    tried again with growing pauses, up to GGPO_NOTIFY_GIVE_UP_SECONDS (a day) after the event.
    """
    from ..notify.view import notifications_view

    data = notifications_view(app.ledger(), app.settings.notify, everything=everything, limit=limit)
    if as_json:
        echo_json("notifications", data)
        return
    counts = data["counts"]
    click.echo(f"{counts['pending']} notification(s) pending, {counts['failed_deliveries']} delivery(ies) given up")
    if not data["sinks"]:
        click.echo("no sink configured: notifications are recorded, not sent (GGPO_NOTIFY_*, `ggpo-batch config`)")
    for s in data["sinks"]:
        state = f"{s['delivered']} delivered, {s['retrying']} retrying, {s['failed']} failed"
        extra = f"; last error: {s['last_error']}" if s["last_error"] else ""
        extra += f"; next try {s['next_try_at']}" if s["next_try_at"] else ""
        gone = "" if s["configured"] else " (no longer configured)"
        click.echo(f"sink {s['name']}{gone}: {state}{extra}")
    for n in data["notifications"]:
        where = ", ".join(f"{d['sink']} {d['state']} x{d['tries']}" for d in n["deliveries"]) or "not tried yet"
        click.echo(f"{n['created_at']}  {n['kind']:<19}  {n['subject']}  [{where}]")
