"""`ggpo-batch init`: a folder with an experiment to edit and a profile (ggpo_batch/spec/starter.py)."""

from __future__ import annotations

from pathlib import Path

import click

from ..common.datafiles import search_path
from .app import cli


def _help() -> str:
    """The command's help: names the folders profiles are looked up in (this user's, this host's)."""
    return f"""Write an experiment to edit into FOLDER (default: the current folder).

\b
  FOLDER/experiment.toml          a 2-arm x 2-seed spec that runs as written on this
                                  machine's CPU (local executor, built-in model); its
                                  paths are relative to it
  FOLDER/data/*.jsonl             the small generated QA set it names ([train.data] format)
  FOLDER/profiles/my-cluster.toml a Slurm profile to edit, then to install where profiles
                                  are looked up
  FOLDER/examples/*.toml          the packaged example specs (exposure-5arm: the reference
                                  5-arm x 3-seed experiment; demo-cpu)

\b
A profile named in a spec (and a nightly suite) is looked up in these
folders' profiles/ (suites/), the first found wins:
{chr(10).join(f"  {d.parent}" for d in search_path("profiles"))}

Existing files are not overwritten: exit 2 and nothing written, unless --force.
With --force a link in a file's place is replaced by the file, never written
through; a FIFO, a folder or a linked subfolder there is refused (exit 2, named).

\b
  ggpo-batch init my-exp && cd my-exp
  ggpo-batch db upgrade && ggpo-batch enqueue experiment.toml --dry-run
"""


@cli.command("init", help=_help())
@click.argument("folder", required=False, default=".", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace the files init writes where they exist.")
def init(folder: Path, force: bool) -> None:
    from ..spec.starter import write_starter

    done = write_starter(folder, force=force)
    for path in done.files:
        click.echo(f"wrote {path}")
    click.echo(f"next: ggpo-batch enqueue {done.spec} --dry-run   (edit it first: name, arms, seeds, budget)")
