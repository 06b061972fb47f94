"""docs/reference/commands.md from the click commands themselves: every command and subcommand of
`ggpo_batch.cli.cli` with its usage, its help as `--help` prints it, each option with its default,
and the exit codes (`ggpo_batch.errors.EXIT_CODES`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ggpo_batch.cli import cli
from ggpo_batch.common.datafiles import PACKAGE_DIR
from ggpo_batch.errors import EXIT_CODES

WIDTH = 100  # the help's width on the page (the CLI's own max_content_width)
GENERATED = ("<!-- Generated from the click commands (ggpo_batch/cli/) and ggpo_batch/errors.py by "
             "`python tools/docs/reference.py`; tests/test_docs.py fails when it is stale. -->")


def commands() -> Iterator[tuple[str, click.Command, click.Context]]:
    """(`ggpo-batch a b`, the command, its context) for the root and every command under it, depth first."""
    root = click.Context(cli, info_name="ggpo-batch", terminal_width=WIDTH, max_content_width=WIDTH)
    yield from _walk(cli, root)


def _walk(command: click.Command, ctx: click.Context) -> Iterator[tuple[str, click.Command, click.Context]]:
    yield ctx.command_path, command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, click.Context(sub, info_name=name, parent=ctx))


def _help(command: click.Command, ctx: click.Context) -> str:
    formatter = ctx.make_formatter()
    command.format_usage(ctx, formatter)
    command.format_help_text(ctx, formatter)
    if isinstance(command, click.Group):
        command.format_commands(ctx, formatter)
    return _portable("\n".join(line.rstrip() for line in formatter.getvalue().rstrip().splitlines()))


def _portable(text: str) -> str:
    """Help text without this machine's paths: the installed package's folder as `ggpo_batch`, the
    home folder as `~` (reference.py runs without XDG_CONFIG_HOME)."""
    return text.replace(str(PACKAGE_DIR.parent) + "/", "").replace(str(Path.home()) + "/", "~/")


def _default(param: click.Parameter) -> str:
    value: Any = param.to_info_dict().get("default")
    if isinstance(param, click.Option) and param.is_flag and not param.secondary_opts:
        return "on" if value else ""
    if value is None or value == () or value == "" or value is False:
        return ""
    if isinstance(value, (list, tuple)):
        value = ",".join(map(str, value))
    return f"`{_portable(str(value))}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _options(command: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option) or param.hidden or "--help" in param.opts:
            continue
        record = param.get_help_record(ctx)
        names = record[0] if record else ", ".join(param.opts)
        rows.append(f"| `{_cell(names)}` | {_default(param)} | {_cell(_portable(param.help or ''))} |")
    if not rows:
        return []
    return ["| option | default | meaning |", "| --- | --- | --- |", *rows, ""]


def _summary(command: click.Command) -> str:
    return _cell(command.get_short_help_str(limit=WIDTH))


def markdown() -> str:
    """The page: exit codes, an index, then each command."""
    found = list(commands())
    lines = ["# Command reference", "", GENERATED, "",
             ("Every command of `ggpo-batch`, as its `--help` prints it (`-h` works too), with each option's "
             "default. Options that take a value show it in capitals or as a choice `[a|b]`."), "",
             "## Exit codes", "", "Every command ends with one of these:", "", "| code | meaning |", "| --- | --- |"]
    lines += [f"| {code} | {_cell(meaning)} |" for code, meaning in EXIT_CODES.items()]
    lines += ["", "## Commands", ""]
    lines += [f"- [`{path}`](#{_slug(path)}): {_summary(command)}" for path, command, _ in found[1:]]
    lines.append("")
    for path, command, ctx in found:
        lines += [f"## {path}", "", "```text", _help(command, ctx), "```", ""]
        lines += _options(command, ctx)
    return "\n".join(lines)


def _slug(heading: str) -> str:
    return heading.lower().replace(" ", "-")
