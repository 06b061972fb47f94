"""What the shell asks of `ggpo-batch` besides commands: `--version` (the commit and the libraries,
ggpo_batch/reporting/installed.py) and the completion of experiment names and run keys from the
ledger (click's `shell_complete`, ggpo_batch/reporting/completion.py; docs/researcher.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..config.settings import load_settings


def show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """The callback of the top-level `--version` (eager: it prints and exits before any command)."""
    if not value or ctx.resilient_parsing:
        return
    from ..reporting.installed import version_lines

    for line in version_lines():
        click.echo(line)
    ctx.exit()


def _ledger_completion(what: str) -> Callable[[click.Context, click.Parameter, str], list[Any]]:
    """A click `shell_complete` for an argument or option naming `what` ("experiment" or "run_key"):
    the ledger's values that start with what was typed, read-only (ggpo_batch/reporting/completion.py)."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        from click.shell_completion import CompletionItem

        from ..reporting.completion import ledger_names

        try:
            db_url = load_settings().db_url
        except Exception:  # noqa: BLE001  settings that do not load: nothing to complete, no error in the shell
            return []
        return [CompletionItem(name) for name in ledger_names(db_url, what, incomplete)]

    return complete


# `shell_complete=` for arguments and options that name an experiment or a run (docs/researcher.md#version-and-shell-completion).
COMPLETE_EXPERIMENT = _ledger_completion("experiment")
COMPLETE_RUN_KEY = _ledger_completion("run_key")
