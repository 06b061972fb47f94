"""The `ggpo-batch` command line: a thin click layer. Each command parses, calls one library
function, prints. The group and its error contract live in `app`; each *_cmds module registers
its commands on it when the group first looks one of them up (`app.COMMAND_MODULES`), so a
command imports only its own module."""

from __future__ import annotations

from .app import EXIT_UNAVAILABLE, App, cli, echo_json, invoked_command, pass_app

__all__ = ["EXIT_UNAVAILABLE", "App", "cli", "echo_json", "invoked_command", "main", "pass_app"]


def main() -> None:
    cli(prog_name="ggpo-batch")
