"""The `ggpo-batch` command line: a thin click layer. Each command parses, calls one library
function, prints. The group and its error contract live in `app`; each *_cmds module registers
its commands on it when imported here."""

from __future__ import annotations

from . import (
    dashboard_cmds,  # noqa: F401
    ledger_cmds,  # noqa: F401  (registers commands)
    logs_cmds,  # noqa: F401
    nightly_cmds,  # noqa: F401
    queue_cmds,  # noqa: F401
    report_cmds,  # noqa: F401
    train_cmds,  # noqa: F401
)
from .app import EXIT_UNAVAILABLE, App, cli, echo_json, invoked_command, pass_app

__all__ = ["EXIT_UNAVAILABLE", "App", "cli", "echo_json", "invoked_command", "main", "pass_app"]


def main() -> None:
    cli(prog_name="ggpo-batch")
