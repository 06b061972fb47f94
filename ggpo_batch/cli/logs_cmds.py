"""`ggpo-batch logs`: an attempt's job output (ggpo_batch/reporting/joblogs.py), whole, a tail, or followed."""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..common.printable import LineEnds
from ..errors import GgpoError
from .app import COUNT_VALUE, RUN_KEY_VALUE, App, cli, echo_json, pass_reader
from .shell import COMPLETE_RUN_KEY

if TYPE_CHECKING:
    from ..reporting.joblogs import LogFile


@cli.command()
@click.argument("run_key", callback=RUN_KEY_VALUE, shell_complete=COMPLETE_RUN_KEY)
@click.option("--attempt", "-a", type=click.IntRange(1, None), help="Attempt number (default: the last).")
@click.option("--rank", "-r", type=click.IntRange(0, None),
              help="Only this rank (submitit task) of the job [default: every rank with a log].")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing what the job writes until its attempt ends (as reconcile books it); waits for "
                   "the log of a job that has not started yet.")
@click.option("--lines", "-n", type=click.IntRange(0, None), callback=COUNT_VALUE,
              help="Only the last N lines of each file (with -f: then follow).")
@click.option("--stream", type=click.Choice(["both", "stdout", "stderr"]), default="both", show_default=True,
              help="Which of the job's outputs (training progress is logged on stderr).")
@click.option("--json", "as_json", is_flag=True, help="The attempt's log files (paths, sizes) as JSON, no content.")
@pass_reader
def logs(app: App, run_key: str, attempt: int | None, rank: int | None, follow: bool, lines: int | None,
         stream: str, as_json: bool) -> None:
    """Print the stdout and stderr of RUN_KEY's job (its last attempt, or --attempt N), as `status` names it.

    \b
    Each rank's files are shown under a `==> path <==` header, stdout then stderr. The Slurm and local
    executors' files are submitit's (<job id>_<rank>_log.out/.err in the attempt folder); a debug
    attempt ran inside its worker, whose own log has its output.
    \b
    A log is the job's file, not ours: it is streamed whatever its size, -n reads it from the end (a
    progress bar's "\r" ends a line, as on a terminal, and is shown as one), and a file that is a link leading out of the
    attempt folder, a FIFO or a device is refused, each with one line naming it.
    \b
    Exit codes: 0 shown; 2 no such run, attempt or rank, or a log file refused (the others are
    shown); 5 the attempt has no log (yet): it is queued, still being submitted or waiting for its
    allocation (with -f: waited for instead); 6 a log file this user may not read.
    \b
      ggpo-batch logs exposure-5arm-v1-20261012-paired -n 50
      ggpo-batch logs exposure-5arm-v1-20261012-paired --attempt 2 --rank 3 -f
    """
    from ..common.untrusted_files import FileRefused, real_roots
    from ..reporting.joblogs import NoLog, attempt_logs, attempt_running, job_folder, pick_attempt, read_text, refusal
    from ..reporting.joblogs import follow as follow_files

    led = app.ledger()
    jobs_dir = app.settings.jobs_dir
    run = led.get_run(run_key)
    att = pick_attempt(run, attempt)
    streams = ("stdout", "stderr") if stream == "both" else (stream,)
    refused: list[GgpoError] = []

    def found():  # type: ignore[no-untyped-def]
        return attempt_logs(jobs_dir, run, att, rank)

    def current():  # type: ignore[no-untyped-def]
        return tuple(f for f in found().files if f.stream in streams)

    def refuse(f: LogFile, exc: FileRefused) -> None:  # one line each, on stderr; the others are still shown
        error = refusal(f.path, exc)
        if all(e.message != error.message for e in refused):
            refused.append(error)
            click.echo(f"error: {error.message}", err=True)

    def show(f: LogFile, roots: Sequence[Path]) -> None:
        ended, as_lines = True, LineEnds()
        try:
            for text in read_text(f.path, roots, lines):
                text = as_lines(text)
                click.echo(text, nl=False)
                ended = text.endswith("\n") if text else ended
        except FileRefused as exc:
            if not exc.absent:
                refuse(f, exc)
        if not ended:
            click.echo("")

    if as_json:
        echo_json("logs", found().to_dict())
        return
    if not follow:
        logs_now = found()
        files = tuple(f for f in logs_now.files if f.stream in streams)
        for f in files:
            _header(f.path, len(files))
            show(f, logs_now.roots)
        _exit(refused)
        return

    def files_now():  # type: ignore[no-untyped-def]
        try:
            return current()
        except GgpoError:  # no log yet, or no more (deleted): a bad rank was refused before following
            return ()

    def running() -> bool:
        nonlocal run, att
        run = led.get_run(run_key)
        att = next(a for a in run.attempts if a.number == att.number)
        return attempt_running(att, run)

    first = files_now()
    if not first:
        try:
            current()
        except NoLog as exc:
            click.echo(f"{exc.message}; waiting for it (Ctrl-C stops)", err=True)
    many = 1 if rank is not None and stream != "both" else 2  # headers unless one file can be followed
    roots = real_roots([job_folder(jobs_dir, run, att)])
    for f in first if lines is not None else ():
        _header(f.path, many)
        show(f, roots)
    shown, as_lines = None, defaultdict(LineEnds)
    for f, text in follow_files(files_now, running, roots=lambda: roots, start_at_end=lines is not None,
                                refused=refuse):
        if f.path != shown:
            _header(f.path, many)
            shown = f.path
        click.echo(as_lines[f.path](text), nl=False)
        sys.stdout.flush()
    _exit(refused)


def _exit(refused: list[GgpoError]) -> None:
    """Exit with the code of the first refused file (its line was printed where it was met)."""
    if refused:
        click.get_current_context().exit(refused[0].exit_code)


def _header(path: object, n: int) -> None:
    if n > 1:
        click.echo(f"==> {path} <==")
