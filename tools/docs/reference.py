"""Write the generated reference pages of docs/reference/, or with --check say which are stale.

    python tools/docs/reference.py           # (re)write docs/reference/{spec,commands,settings,records}.md, json/
    python tools/docs/reference.py --check   # exit 1 naming each page that differs from the code

spec.md comes from the spec's field table (ggpo_batch/contracts/spec_fields.py), commands.md from the click
commands and ggpo_batch/errors.py (tools/docs/commands_md.py), settings.md from ggpo_batch/config/settings.py
(tools/docs/settings_md.py), records.md from ggpo_batch/contracts/run_record.py and the keys train/job.py writes
(tools/docs/records_md.py), json/*.schema.json from the recorded types of the `--json` documents
(tools/docs/json_schemas.py). The pages must not depend on the machine: the home folder and the
checkout's path are written as `~` and `ggpo_batch`, and XDG_CONFIG_HOME is ignored.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
HINT = "run `python tools/docs/reference.py` to regenerate it"


def pages() -> dict[str, Callable[[], str]]:
    """Each generated page's file name and its renderer."""
    from ggpo_batch.contracts import spec_fields
    from tools.docs import commands_md, json_schemas, records_md, settings_md

    return {"spec.md": spec_fields.markdown, "commands.md": commands_md.markdown, "settings.md": settings_md.markdown,
            "records.md": records_md.markdown,
            **{name: (lambda text=text: text) for name, text in json_schemas.document_schemas().items()},
            **{name: (lambda text=text: text) for name, text in json_schemas.contract_schemas().items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if a page differs from the code.")
    parser.add_argument("--dir", type=Path, default=REFERENCE, help="Where the pages are (default: docs/reference).")
    args = parser.parse_args(argv)
    stale = []
    for name, render in pages().items():
        path = args.dir / name
        text = render()
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    for path in stale:
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} is stale: {HINT}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    os.environ.pop("XDG_CONFIG_HOME", None)  # the help texts name ~/.config/ggpo-batch, not this machine's
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
