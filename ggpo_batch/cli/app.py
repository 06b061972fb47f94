"""The root of the `ggpo-batch` command line: the click group, the per-invocation App, and the
error contract (a GgpoError becomes one line on stderr and its exit code; an unreachable service
exit 4). Command modules import from here; `cli/__init__` gathers them."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click

from ..config import Settings, load_settings, redact
from ..errors import GgpoError


class App:
    """Per-invocation state: settings and the ledger, opened on first use."""

    def __init__(self) -> None:
        self._settings: Settings | None = None
        self._ledger: Any = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings()
        return self._settings

    def ledger(self, *, check: bool = True):  # type: ignore[no-untyped-def]
        if self._ledger is None:
            from ..ledger import connect

            self._ledger = connect(self.settings.db_url, check=check)
        return self._ledger


class _Group(click.Group):
    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        # Keep the arguments as given: sys.argv is not them when the CLI is called from Python
        # (tests, a scheduler), and provenance records the exact command.
        given = list(args)
        ctx = super().make_context(info_name, args, parent=parent, **extra)
        ctx.meta.setdefault("ggpo.argv", given)
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GgpoError as exc:
            click.echo(f"error: {redact(exc.message)}", err=True)
            ctx.exit(exc.exit_code)
        except Exception as exc:
            problem = _unavailable(exc)
            if problem is None:
                raise
            click.echo(f"error: {redact(problem)}", err=True)
            ctx.exit(EXIT_UNAVAILABLE)


EXIT_UNAVAILABLE = 4  # a service (database, Redis, Slurm) could not be reached; try again later


def _unavailable(exc: Exception) -> str | None:
    """A one-line message for a service that could not be reached, else None (a bug: keep the traceback)."""
    from sqlalchemy.exc import OperationalError

    if isinstance(exc, OperationalError):
        first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc).splitlines()[0]
        return f"the ledger database is unavailable: {first}"
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeout
    except ImportError:  # pragma: no cover
        return None
    if isinstance(exc, (RedisConnectionError, RedisTimeout)):
        return f"Redis is unavailable: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    return None


def invoked_command() -> str:
    """The exact `ggpo-batch ...` command line of this invocation, shell-quoted."""
    import shlex

    ctx = click.get_current_context(silent=True)
    argv = ctx.find_root().meta.get("ggpo.argv") if ctx is not None else None
    return shlex.join(["ggpo-batch", *(argv if argv is not None else sys.argv[1:])])


pass_app = click.make_pass_decorator(App, ensure=True)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.version_option(package_name="ggpo-batch")
@click.pass_context
def cli(ctx: click.Context, verbose: int) -> None:
    """Run arm x seed RL post-training experiments on shared GPU clusters, and account for every GPU-hour.

    \b
    Typical flow:
      ggpo-batch db upgrade                      create or migrate the ledger
      ggpo-batch enqueue jobs/exposure-5arm.toml expand arms x seeds, queue them
      ggpo-batch worker                          take runs, allocate, train
      ggpo-batch status                          what ran, what it cost, why
    \b
    Configuration (environment): GGPO_DB_URL (default: SQLite in the user data dir),
    GGPO_REDIS_URL (default redis://127.0.0.1:6379/0; memory:// runs jobs inline),
    GGPO_DATA_DIR, GGPO_QUEUE, GGPO_QUEUE_GPU_QUOTA. Secrets may come from
    GGPO_DB_URL_FILE / GGPO_REDIS_URL_FILE (mode 0600).
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    ctx.ensure_object(App)
