"""`ggpo-batch dashboard`: parse, check the bind rule, serve (ggpo_batch/dashboard)."""

from __future__ import annotations

import click

from .app import App, cli, pass_reader


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but a loopback address needs GGPO_DASHBOARD_TOKEN.")
@click.option("--port", default=8265, show_default=True, type=click.IntRange(1, 65535), help="Port to listen on.")
@pass_reader
def dashboard(app: App, host: str, port: int) -> None:
    """A read-only web view of the ledger: experiments with runs by state and GPU-hours spent,
    estimated and decided not spent; an experiment's live run table (state, attempts, heartbeat)
    and its report's tables and plots; a run's attempts, events and log tails; the nightly
    component history; and /api/status, the same JSON as `status --json`. Pages refresh by
    themselves. /metrics: the ledger's figures for Prometheus (runs per state and queue, active
    attempts, GPU-hours, the outbox, the last reconcile's age); /healthz: 200 or 503 (open without
    the token).

    \b
    Access: 127.0.0.1 by default (reach it from elsewhere with `ssh -L 8265:127.0.0.1:8265`).
    With GGPO_DASHBOARD_TOKEN set (16+ characters, e.g. `openssl rand -hex 24`) every request
    must carry it: `Authorization: Bearer TOKEN`, or open http://HOST:PORT/?token=TOKEN once in
    a browser (a cookie keeps it; the token leaves the address bar). A non-loopback --host
    without the token is refused (exit 2). No page shows a password or the token.
    \b
    Needs the dashboard extra: pip install 'ggpo-batch[dashboard]'.
    """
    from ..config.settings import dashboard_token
    from ..errors import GgpoError

    token = dashboard_token()
    try:
        from ..dashboard.access import bind_problem
        from ..dashboard.server import serve
    except ImportError as exc:
        raise GgpoError(f"the dashboard needs the dashboard extra ({exc.name} is missing): "
                        f"pip install 'ggpo-batch[dashboard]'") from None
    problem = bind_problem(host, token)
    if problem:
        raise click.UsageError(problem)
    serve(app.settings, host=host, port=port, token=token)
