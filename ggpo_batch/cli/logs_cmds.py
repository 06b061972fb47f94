"""`ggpo-batch logs`: an attempt's job output (ggpo_batch/joblogs.py), whole, a tail, or followed."""

from __future__ import annotations

import sys

import click

from .app import COUNT_VALUE, RUN_KEY_VALUE, App, cli, echo_json, pass_reader


@cli.command()
@click.argument("run_key", callback=RUN_KEY_VALUE)
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
    Exit codes: 0 shown; 2 no such run, attempt or rank; 5 the attempt has no log (yet): it is
    queued, still being submitted or waiting for its allocation (with -f: waited for instead).
    \b
      ggpo-batch logs exposure-5arm-v1-20261012-paired -n 50
      ggpo-batch logs exposure-5arm-v1-20261012-paired --attempt 2 --rank 3 -f
    """
    from ..joblogs import NoLog, attempt_logs, attempt_running, pick_attempt, tail_text
    from ..joblogs import follow as follow_files

    led = app.ledger()
    jobs_dir = app.settings.jobs_dir
    run = led.get_run(run_key)
    att = pick_attempt(run, attempt)
    streams = ("stdout", "stderr") if stream == "both" else (stream,)

    def current():  # type: ignore[no-untyped-def]
        return tuple(f for f in attempt_logs(jobs_dir, run, att, rank).files if f.stream in streams)

    if as_json:
        echo_json("logs", attempt_logs(jobs_dir, run, att, rank).to_dict())
        return
    if not follow:
        files = current()
        for f in files:
            text = tail_text(f.path, lines)
            _header(f.path, len(files))
            click.echo(text, nl=bool(text) and not text.endswith("\n"))
        return

    def files_now():  # type: ignore[no-untyped-def]
        try:
            return current()
        except NoLog:
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
    for f in first if lines is not None else ():
        _header(f.path, many)
        click.echo(tail_text(f.path, lines), nl=False)
    shown = None
    for f, text in follow_files(files_now, running, start_at_end=lines is not None):
        if f.path != shown:
            _header(f.path, many)
            shown = f.path
        click.echo(text, nl=False)
        sys.stdout.flush()


def _header(path: object, n: int) -> None:
    if n > 1:
        click.echo(f"==> {path} <==")
