"""The docs against the code and against themselves: the generated reference pages are what
`tools/docs/reference.py` makes from the code now; every relative link of README.md and docs/
resolves (file and heading); every section of the README that docs/ replaced has a home there; the
README stays short and keeps its two commands. Each check is shown failing on a planted defect."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.support.paths import REPO

REFERENCE_TOOL = REPO / "tools" / "docs" / "reference.py"
PAGES = ("spec.md", "commands.md", "settings.md", "records.md")

# -- generated reference pages ---------------------------------------------------------------------


def _check(folder: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--dir", str(folder)] if folder is not None else []
    return subprocess.run([sys.executable, str(REFERENCE_TOOL), "--check", *extra], capture_output=True, text=True,
                          timeout=120, check=False, cwd=REPO)


def test_the_reference_pages_are_what_the_code_generates(tmp_path: Path) -> None:
    done = _check()
    assert done.returncode == 0, done.stderr.strip() or done.stdout  # names the page and how to regenerate it
    # Planted: a page edited by hand (a default changed), another missing, a JSON Schema's type changed.
    shutil.copytree(REPO / "docs" / "reference", tmp_path, dirs_exist_ok=True)
    assert {p.name for p in tmp_path.iterdir()} >= set(PAGES)
    spec = tmp_path / "spec.md"
    spec.write_text(spec.read_text().replace("| `group_size` | integer | `4` |", "| `group_size` | integer | `8` |"))
    (tmp_path / "commands.md").unlink()
    db_current = tmp_path / "json" / "db_current.schema.json"
    db_current.write_text(db_current.read_text().replace('"string"', '"integer"', 1))
    done = _check(tmp_path)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3 and all("is stale: run `python tools/docs/reference.py` to regenerate it" in x
                                   for x in lines), done.stderr
    assert {Path(x.split(" is stale")[0]).name for x in lines} == {"spec.md", "commands.md", "db_current.schema.json"}


def test_a_new_option_or_setting_changes_the_generated_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    from ggpo_batch.cli import cli
    from ggpo_batch.contracts import spec_fields
    from tools.docs import commands_md, records_md, settings_md

    before = commands_md.markdown()
    status = cli.get_command(click.Context(cli), "status")
    assert status is not None
    monkeypatch.setattr(status, "params", [*status.params, click.Option(["--colour"], help="A planted option.")])
    assert "| `--colour TEXT` |  | A planted option. |" in commands_md.markdown() != before
    monkeypatch.undo()

    changed = tuple(f if f.key != "train.lr" else type(f)(**{**f.__dict__, "meaning": "Planted."})
                    for f in spec_fields.FIELDS)
    monkeypatch.setattr(spec_fields, "FIELDS", changed)
    assert "| `lr` | number | `0.001` | > 0 | Planted. |" in spec_fields.markdown()

    assert settings_md.problems() == [] and records_md.problems() == []
    read = settings_md.setting_names() | {"GGPO_NEW_SETTING"}
    monkeypatch.setattr(settings_md, "setting_names", lambda: read)
    monkeypatch.setattr(settings_md, "names_in_package", lambda: {"GGPO_SECRET_KNOB"})
    assert settings_md.problems() == [
        "GGPO_NEW_SETTING: read by ggpo_batch/config/settings.py, no meaning in tools/docs/settings_md.py",
        "GGPO_SECRET_KNOB: a GGPO_ name of the package that tools/docs/settings_md.py does not list"]
    with pytest.raises(SystemExit, match="GGPO_NEW_SETTING"):
        settings_md.markdown()
    monkeypatch.setattr(records_md, "details_keys_in_job", lambda: [*records_md.DETAILS, "packing"])
    assert records_md.problems() == [
        "details.packing: written by train/run/job.py, not described in tools/docs/records_md.py"]


# -- links and headings ----------------------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in _FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            base = slug(m.group(1))
            name, n = base, 0
            while name in found:  # a repeated heading: -1, -2, ...
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def broken_links(files: list[Path]) -> list[str]:
    """`file: target (why)` for each relative link whose file or heading does not exist."""
    problems = []
    for md in files:
        for target in _LINK.findall(_prose(md.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path_part, _, anchor = target.partition("#")
            path = (md.parent / path_part).resolve() if path_part else md
            where = f"{md.relative_to(REPO) if md.is_relative_to(REPO) else md}: {target}"
            if not path.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and (path.suffix != ".md" or anchor not in anchors(path)):
                problems.append(f"{where} (no heading #{anchor} there)")
    return problems


def _doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_every_relative_link_of_the_readme_and_docs_resolves(tmp_path: Path) -> None:
    assert broken_links(_doc_files()) == []
    planted = tmp_path / "page.md"
    planted.write_text("[ok](page.md#a-title) ![pic](missing.png) [x](page.md#nowhere) `[code](not/a/link)`\n"
                       "```\n[fenced](not/a/link)\n```\n# A title\n")
    assert broken_links([planted]) == [f"{planted}: missing.png (no such file)",
                                       f"{planted}: page.md#nowhere (no heading #nowhere there)"]


# Every section of the README before it was split into docs/ (round 4: its `##`/`###` headings and the
# bold paragraph titles that served as sections), and where each lives now.
OLD_README_SECTIONS: dict[str, str] = {
    "## The two commands": "README.md#the-two-commands",
    "## Using it": "docs/researcher.md#commands-at-a-glance",
    "**Time limits and checkpoints.**": "docs/researcher.md#time-limits-and-checkpoints",
    "### Watching a run: logs, heartbeat, MLflow": "docs/researcher.md#watching-a-run-logs-heartbeat-mlflow",
    "**Heartbeat.**": "docs/researcher.md#heartbeat",
    "**MLflow**": "docs/researcher.md#mlflow",
    "### Dashboard": "docs/researcher.md#dashboard",
    "**Access.**": "docs/operator.md#dashboard-behind-a-proxy",
    "### Real models and data": "docs/researcher.md#real-models-and-data",
    "**Preflight.**": "docs/researcher.md#preflight",
    "### Multi-node runs and sbatch pacing": "docs/researcher.md#multi-node-runs",
    "(its sbatch pacing paragraph)": "docs/operator.md#sbatch-pacing",
    "## Reading results: `report`": "docs/researcher.md#reading-results-report",
    "**Evaluation after training.**": "docs/researcher.md#evaluation-after-training",
    "**What a run found.**": "docs/researcher.md#what-a-run-found",
    "**Per arm**, **Paired**": "docs/researcher.md#per-arm-and-paired",
    "**Intervals**": "docs/researcher.md#intervals",
    "**Comparability warnings**": "docs/researcher.md#comparability-warnings",
    "**Provenance.**": "docs/researcher.md#provenance",
    "**Learning curves.**": "docs/researcher.md#learning-curves",
    "## Configuration": "docs/reference/settings.md#settings",
    "(its passwords-never-printed paragraph)": "docs/operator.md#secrets",
    "**Reading someone else's ledger.**": "docs/operator.md#reading-someone-elses-ledger",
    "**Limits.**": "docs/limits.md#inputs",
    "(its untrusted files paragraph)": "docs/limits.md#untrusted-files",
    "## Setting it up for a team": "docs/operator.md#postgresql-and-redis-for-a-team",
    "### Settings file": "docs/operator.md#settings-file",
    "### Notifications": "docs/operator.md#notifications",
    "## Setting up for a team": "docs/operator.md#postgresql-and-redis-for-a-team",
    "### Roles and permissions": "docs/operator.md#roles-and-permissions",
    "**Who acted.**": "docs/operator.md#who-acted",
    "**Setting it up.**": "docs/operator.md#creating-the-roles",
    "### Priorities and quotas": "docs/operator.md#priorities-and-quotas",
    "**Who paid.**": "docs/operator.md#who-paid",
    "## How it works": "docs/how-it-works.md#the-lifecycle-and-the-ledger",
    "(its rank-fork paragraph)": "docs/developer.md#local-runs-fork-from-a-warmed-server",
    "**ggpo (group-relative policy optimisation, as ggpo-batch defines it).**": "docs/how-it-works.md#the-ggpo-method",
    "(its stamps table)": "docs/how-it-works.md#stamps-of-a-runs-record",
    "(its top-level table)": "docs/developer.md#layout",
    "**Installed, not checked out.**": "docs/operator.md#installed-not-checked-out",
    "(its module table)": "docs/developer.md#layout",
    "(its nightly schedule paragraph)": "docs/operator.md#the-nightly-schedule",
    "## Figures": "docs/figures.md#measured-figures",
    "(its fault suite table)": "docs/figures.md#the-fault-suite",
    "## GPU": "docs/developer.md#gpu",
}


def homeless(sections: dict[str, str]) -> list[str]:
    """The old sections whose home (file and heading) does not exist."""
    out = []
    for section, home in sections.items():
        file, _, anchor = home.partition("#")
        path = REPO / file
        if not path.exists() or anchor not in anchors(path):
            out.append(f"{section} -> {home}")
    return out


def test_every_section_of_the_old_readme_has_a_home_in_docs() -> None:
    assert homeless(OLD_README_SECTIONS) == []
    assert homeless({"### Dashboard": "docs/researcher.md#the-dashboard", "## GPU": "docs/gpu.md#gpu"}) == [
        "### Dashboard -> docs/researcher.md#the-dashboard", "## GPU -> docs/gpu.md#gpu"]


def test_the_readme_is_short_and_keeps_its_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 150
    blocks = re.findall(r"```sh\n(.*?)```", text, re.DOTALL)
    assert "make demo\n" in blocks and "make test\n" in blocks  # what .ci/run and a new user run
    assert "exec make test" in (REPO / ".ci" / "run").read_text()
    assert "docs/dashboard.png" in text  # the tour's picture (tests/dashboard/test_live.py takes it)
