"""The root of the `ggpo-batch` command line: the click group, the per-invocation App, and the
error contract (a GgpoError becomes one line on stderr and its exit code; an unreachable service
exit 4). Command modules import from here; `cli/__init__` gathers them."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from importlib import import_module
from typing import Any

import click
from click.exceptions import NoSuchCommand

from ..config.secrets import redact
from ..config.settings import Settings, load_settings
from ..errors import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, GgpoError
from .shell import show_version


class App:
    """Per-invocation state: settings, the ledger's engine and the ledger, opened on first use:
    read-only for a command that only reads (`pass_reader`), else after checking this user may write;
    and who acts (`actor`), established on the ledger's connection."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._engine: Any = None
        self._schema_checked = False
        self._ledger: Any = None
        self._actor: str | None = None
        self.reads_only = False

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings()
        return self._settings

    @property
    def actor(self) -> str:
        """Who this command acts as on the ledger (ggpo_batch/config/identity.py): the PostgreSQL role or
        the OS user, or whom GGPO_USER names where that identity may act for others; refused
        (exit 6) otherwise, before anything is written."""
        if self._actor is None:
            from ..config.identity import resolve

            self._actor = resolve(self.engine(check=False), self.settings).user
        return self._actor

    def close(self) -> None:
        """Close the ledger's connections when the command ends: closing the last connection to a
        WAL SQLite ledger checkpoints it, so the file on disk is whole after every command."""
        if self._engine is not None:
            self._engine.dispose()
        self._engine = self._ledger = None
        self._schema_checked = False

    def engine(self, *, check: bool = True):  # type: ignore[no-untyped-def]
        """The ledger database's engine; with `check`, refused unless its schema is at head (once).
        Core only: a command that reads through it alone does not import the ORM."""
        from ..ledger.db import check_schema, make_engine

        if self._engine is None:
            engine = make_engine(self.settings.db_url, reading=self.reads_only)
            if not self.reads_only:  # refused here (exit 6), before the command does anything
                from ..ledger.read_only import require_writable

                try:
                    require_writable(engine, invoked_command_name())
                except BaseException:
                    engine.dispose()
                    raise
            self._engine = engine
        if check and not self._schema_checked:
            check_schema(self._engine)
            self._schema_checked = True
        return self._engine

    def ledger(self, *, check: bool = True):  # type: ignore[no-untyped-def]
        """The Ledger on `engine(check=check)` (what `ledger.connect` makes)."""
        if self._ledger is None:
            from ..ledger import Ledger

            self._ledger = Ledger(self.engine(check=check))
        return self._ledger


class UsageLine(click.UsageError):
    """A usage error shown as one line (click's own takes three: usage, hint, error)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {redact(self.format_message())}", err=True)


def _one_line(exc: click.UsageError) -> UsageLine:
    where = invoked_command_name(exc.ctx)
    message = " ".join(exc.format_message().split())
    return UsageLine(f"{where}: {message} (see `{where} --help`)", exc.ctx)


# The modules of ggpo_batch/cli that register each top-level command (and its subcommands): imported
# only when that command runs (or `--help` lists them all), so `status` does not import what `train`
# or `dashboard` need. tests/test_cli.py checks this map against what the modules register.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "config": ("config_cmds",),  # reads no ledger
    "dashboard": ("dashboard_cmds",),
    "db": ("ledger_cmds",), "status": ("ledger_cmds",),
    "init": ("init_cmds",),
    "ledger": ("ledger_cmds", "report_cmds"),  # `ledger export` is report_cmds'
    "logs": ("logs_cmds",),
    "nightly": ("nightly_cmds",),
    "notifications": ("notify_cmds",),
    "evaluate": ("evaluate_cmds",),
    "enqueue": ("queue_cmds",), "worker": ("queue_cmds",), "cancel": ("queue_cmds",), "retry": ("queue_cmds",),
    "reconcile": ("queue_cmds",), "release": ("queue_cmds",), "canary": ("canary_cmds",),
    "report": ("report_cmds",), "decide": ("report_cmds",),
    "plan": ("plan_cmds",), "advise": ("plan_cmds",),
    "costs": ("cost_cmds",),
    "train": ("train_cmds",),
    "gc": ("gc_cmds",),
}


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMAND_MODULES})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        for module in COMMAND_MODULES.get(cmd_name, ()):
            import_module(f"{__package__}.{module}")  # registers its commands on `cli` (once: then cached)
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                           list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except NoSuchCommand as exc:  # click suggests from the commands imported so far: suggest from all
            raise NoSuchCommand(exc.command_name, possibilities=self.list_commands(ctx), ctx=ctx) from None

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        # Keep the arguments as given: sys.argv is not them when the CLI is called from Python
        # (tests, a scheduler), and provenance records the exact command.
        given = list(args)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except UsageLine:
            raise
        except click.UsageError as exc:
            raise _one_line(exc) from None
        ctx.meta.setdefault("ggpo.argv", given)
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GgpoError as exc:
            # One line per problem: most errors have one; preflight lists every problem it found.
            for line in getattr(exc, "lines", None) or [exc.message]:
                click.echo(f"error: {redact(_line(line))}", err=True)
            ctx.exit(exc.exit_code)
        except UsageLine:
            raise
        except click.UsageError as exc:
            raise _one_line(exc) from None
        except Exception as exc:
            found = _unavailable(exc)
            if found is None:
                raise
            problem, code = found
            click.echo(f"error: {redact(_line(problem))}", err=True)
            ctx.exit(code)




def _line(text: str, limit: int = 2000) -> str:
    """One line: newlines folded, very long text cut."""
    one = " ".join(str(text).split())
    return one if len(one) <= limit else one[:limit] + " ..."


def _first(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _unavailable(exc: Exception) -> tuple[str, int] | None:
    """A one-line message and exit code for a database or Redis failure, else None (a bug: keep the
    traceback). Every ledger call is one transaction, so after any of these nothing was half-written."""
    from sqlalchemy.exc import (
        DatabaseError,
        DataError,
        IntegrityError,
        InterfaceError,
        OperationalError,
    )

    from ..ledger.read_only import write_refused

    if (refused := write_refused(exc)) is not None:  # a write the user may not make: exit 6
        return refused.message, refused.exit_code
    if isinstance(exc, (OperationalError, InterfaceError)):
        return f"the ledger database is unavailable: {_first(exc)}", EXIT_UNAVAILABLE
    if isinstance(exc, DataError):  # a value the limits (ggpo_batch/common/limits.py) should have refused
        return f"the ledger database refused a value, nothing was written: {_first(exc)}", EXIT_BAD_INPUT
    if isinstance(exc, IntegrityError):
        message = (f"a concurrent change to the ledger conflicted with this one, nothing was written; run the "
                   f"command again ({_first(exc)})")
        return message, EXIT_UNAVAILABLE
    if isinstance(exc, DatabaseError):  # SQLite: "file is not a database", "database disk image is malformed"
        message = (f"the ledger database cannot be used: {_first(exc)} (is GGPO_DB_URL a ggpo-batch ledger, and "
                   f"the file intact?)")
        return message, EXIT_UNAVAILABLE
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeout
    except ImportError:  # pragma: no cover
        return None
    if isinstance(exc, (RedisConnectionError, RedisTimeout)):
        return f"Redis is unavailable: {_first(exc)[:300]}", EXIT_UNAVAILABLE
    if isinstance(exc, RedisError):  # a protocol error: another service on that port
        return f"Redis is unavailable: {_first(exc)[:120]} (is GGPO_REDIS_URL a Redis server?)", EXIT_UNAVAILABLE
    return None


def _checked(check: str, *args: Any) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that refuses a value (or each of a repeated option's values) by the limit
    `ggpo_batch.common.limits.<check>`, before it reaches the ledger: one line, exit 2, on both backends.
    (limits is imported when a value is checked: `--help` need not.)"""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        from ..common import limits

        problem_of = getattr(limits, check)
        for v in value if isinstance(value, tuple) else (value,):
            problem = None if v is None else problem_of(v, *args)
            if problem:
                raise click.BadParameter(problem, ctx=ctx, param=param)
        return value

    return callback


# Callbacks for arguments and options that reach the ledger (see ggpo_batch/common/limits.py).
NAME_VALUE = _checked("name_problem")  # an experiment or queue name
RUN_KEY_VALUE = _checked("run_key_problem")
ARM_VALUE = _checked("arm_name_problem")
TEXT_VALUE = _checked("text_problem")  # a reason, a cost basis: stored as text
FINITE_VALUE = _checked("number_problem")
VERSION_VALUE = _checked("version_problem")
COUNT_VALUE = _checked("count_problem")
WORKER_VALUE = _checked("worker_name_problem")


def experiment_at(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int | None]:
    """EXPERIMENT or EXPERIMENT@VERSION (an argument's callback), each part checked like any name or version."""
    from ..common import limits

    name, at, ver = value.partition("@")
    problem = limits.name_problem(name)
    version: int | None = None
    if not problem and at:
        try:
            version = int(ver)
        except ValueError:
            problem = f"{value!r}: the version after '@' must be a whole number"
        else:
            problem = limits.version_problem(version)
    if problem:
        raise click.BadParameter(problem, ctx=ctx, param=param)
    return name, version


def invoked_command() -> str:
    """The exact `ggpo-batch ...` command line of this invocation, shell-quoted."""
    import shlex

    ctx = click.get_current_context(silent=True)
    argv = ctx.find_root().meta.get("ggpo.argv") if ctx is not None else None
    return shlex.join(["ggpo-batch", *(argv if argv is not None else sys.argv[1:])])


pass_app = click.make_pass_decorator(App, ensure=True)


def pass_reader(command: Callable[..., Any]) -> Callable[..., Any]:
    """`pass_app` for a command that only reads the ledger: it is opened read-only, so the command
    works on a ledger this user may not write (ggpo_batch/ledger/read_only.py)."""

    @functools.wraps(command)
    def reader(app: App, *args: Any, **kwargs: Any) -> Any:
        app.reads_only = True
        return command(app, *args, **kwargs)

    callback = pass_app(reader)
    callback.reads_only = True  # type: ignore[attr-defined]  (tests/test_read_only_ledger.py lists them)
    return callback


def invoked_command_name(ctx: click.Context | None = None) -> str:
    """`ggpo-batch SUBCOMMAND` of `ctx` (default: this invocation's), options left out, for messages:
    the program's name, not the one it was called by (a test's runner, python -m)."""
    ctx = ctx or click.get_current_context(silent=True)
    return " ".join(["ggpo-batch", *(ctx.command_path.split()[1:] if ctx is not None else [])])


def echo_json(kind: str, data: Any) -> None:
    """Print `data` as the `kind` document of ggpo_batch/common/schemas.py (with its schema number), its
    secrets masked before it is serialised (ggpo_batch/config/masking.py)."""
    from ..common.schemas import dumps
    from ..config.masking import scrub

    click.echo(dumps(kind, scrub(data)))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=show_version,
              help="Show the version, the commit and the installed versions of torch, DeepSpeed, vLLM, "
                   "transformers, SQLAlchemy and RQ, and exit.")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """Run arm x seed RL post-training experiments on shared GPU clusters, and account for every GPU-hour.

    \b
    Typical flow:
      ggpo-batch db upgrade                      create or migrate the ledger
      ggpo-batch enqueue jobs/exposure-5arm.toml expand arms x seeds, queue them
      ggpo-batch worker                          take runs, allocate, train
      ggpo-batch status                          what ran, what it cost, why
      ggpo-batch evaluate NAME --data F --name S score the trained policies on F again
    \b
    Configuration (environment): GGPO_DB_URL (default: SQLite in the user data dir),
    GGPO_REDIS_URL (default redis://127.0.0.1:6379/0; memory:// runs jobs inline),
    GGPO_DATA_DIR, GGPO_QUEUE, GGPO_QUEUE_GPU_QUOTA. Secrets may come from
    GGPO_DB_URL_FILE / GGPO_REDIS_URL_FILE (mode 0600). The same settings may sit in
    ~/.config/ggpo-batch/config.toml or /etc/ggpo-batch/config.toml (`ggpo-batch config`).
    """
    from ..config.logs import configure_logging
    from ..config.masking import masked_output

    ctx.with_resource(masked_output())  # every byte the command prints: secrets masked (before logging binds stderr)
    # Text or JSON lines (GGPO_LOG_FORMAT / log_format), for this command, and for the worker and the
    # jobs it starts (config/logs.py)
    configure_logging(level=logging.WARNING - 10 * min(verbose, 2), stream=sys.stderr,
                      carry=ctx.invoked_subcommand != "config")  # config shows each setting's own source
    ctx.call_on_close(ctx.ensure_object(App).close)
