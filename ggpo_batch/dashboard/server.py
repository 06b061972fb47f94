"""Serve the dashboard with uvicorn on one address (the bind rule is `access.bind_problem`)."""

from __future__ import annotations

import logging

from ..config.settings import Settings

log = logging.getLogger(__name__)


def serve(settings: Settings, *, host: str, port: int, token: str | None) -> None:
    """Run the dashboard until interrupted (Ctrl-C)."""
    import uvicorn

    from .routes import create_app

    app = create_app(settings, token=token, host=host)
    shown = f"[{host}]" if ":" in host else host
    log.warning("dashboard on http://%s:%d/%s", shown, port, " (token required)" if token else "")
    # No access log: it would print request paths (a ?token= among them) to the terminal.
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, server_header=False,
                proxy_headers=False)
