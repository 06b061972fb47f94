"""Round 2's inputs at their limits, each one line naming the file, field and what is wrong, the
documented exit code, nothing written, on SQLite and PostgreSQL:

- a `[train.data]` line nested 100,000 deep, a 5,000-digit number, 1e400 (file, line and field);
  support titles the passages file does not hold (counted and warned; none at all: refused);
- `ledger import` of NaN or Infinity (the record and the field);
- numbers from the environment (GGPO_HUNG_AFTER_SECONDS of inf, 1e400, 1e12...) refused at start-up;
- `report --format md` keeps user text as text: no heading, table, emphasis or HTML of its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggpo_batch.spec import preflight
from ggpo_batch.spec.parse import load_spec
from ggpo_batch.train.task.tiny_hf import build_qa_set
from tests.faults.test_hostile_inputs import (
    assert_refused,
    fingerprint,
    one_record,
    run_cli,
    upgraded,  # noqa: F401  (a fixture)
)
from tests.support.paths import SEED_000

DATA_SPEC = """[experiment]
name = "data-limits"
method = "ggpo"
seeds = [1]
executor = "debug"
loop_budget_seconds = 1
[train.data]
train = "{train}"
eval = "{eval}"
passages = "{passages}"
[arms.clean]
exposure = "none"
"""


@pytest.fixture(scope="module")
def qa(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_qa_set(tmp_path_factory.mktemp("qa"), n_train=20, n_eval=20)


def _spec(tmp_path: Path, qa: dict[str, Path], **files: Path) -> Path:
    path = tmp_path / "data-limits.toml"
    path.write_text(DATA_SPEC.format(**{**{k: str(v) for k, v in qa.items()}, **{k: str(v) for k, v in files.items()}}))
    return path


HOSTILE_VALUES = {
    "nested 100,000 deep": ("[" * 100_000 + "]" * 100_000, "at answers[0][0]", "nested deeper than 32"),
    "5,000-digit number": ("9" * 5000, "at answers", "an integer of 5000 digits"),
    "1e400": ("1e400", "at answers", "the number 1e400 is not finite"),
}


@pytest.mark.parametrize("case", list(HOSTILE_VALUES))
def test_a_data_line_at_the_parsers_limits_is_one_line_naming_file_line_and_field(
        upgraded: dict[str, str], tmp_path: Path, qa: dict[str, Path], case: str) -> None:  # noqa: F811
    value, where, words = HOSTILE_VALUES[case]
    lines = Path(qa["eval"]).read_text().splitlines()
    row = json.loads(lines[2])
    lines[2] = json.dumps({**row, "answers": "__HOSTILE__"}).replace('"__HOSTILE__"', value)
    bad = tmp_path / "eval.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    before = fingerprint(upgraded["GGPO_DB_URL"])
    line = assert_refused(run_cli("enqueue", str(_spec(tmp_path, qa, eval=bad)), "--dry-run"), 2)
    assert f"train.data.eval: {bad}:3: {where}" in line and words in line, line
    assert fingerprint(upgraded["GGPO_DB_URL"]) == before


def test_a_data_line_longer_than_the_limit_is_refused_unread(tmp_path: Path, qa: dict[str, Path]) -> None:
    from ggpo_batch.train.task.qa import DATA_LINE_MAX_BYTES

    bad = tmp_path / "passages.jsonl"
    with open(bad, "wb") as fh:
        fh.write(b'{"title": "t", "text": "' + b"x" * (DATA_LINE_MAX_BYTES + 10) + b'"}\n')
    [problem] = preflight.check(load_spec(_spec(tmp_path, qa, passages=bad))).problems
    assert problem.field == "train.data.passages" and f"{bad}:1: the line is over" in problem.message


def test_support_titles_missing_from_the_passages_are_counted_or_refused(tmp_path: Path, qa: dict[str, Path],
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    passages = [json.loads(x) for x in Path(qa["passages"]).read_text().splitlines()]
    eval_titles = {t for x in Path(qa["eval"]).read_text().splitlines() for t in json.loads(x)["support_titles"]}
    some = tmp_path / "some.jsonl"  # the eval items' passages left out: 20 of the 40 items unsupported
    some.write_text("".join(json.dumps(p) + "\n" for p in passages if p["title"] not in eval_titles))
    report = preflight.check(load_spec(_spec(tmp_path, qa, passages=some)))
    assert report.ok, report.lines()
    assert report.facts["support_titles_missing"] == {"items": 20, "of": 40, "share": 0.5}
    assert "20 of 40 items (50.0%) name a support title that no passage has" in caplog.text
    other = tmp_path / "other.jsonl"  # the passages of another set: not one title matches
    other.write_text(json.dumps({"title": "Elsewhere", "text": "nothing"}) + "\n")
    [problem] = preflight.check(load_spec(_spec(tmp_path, qa, passages=other))).problems
    assert problem.field == "train.data.passages" and "holds none of the support titles its 40 items name" in \
        problem.message
    assert "support_titles_missing" not in preflight.check(load_spec(_spec(tmp_path, qa))).facts


# -- ledger import: NaN and Infinity name their record and field -------------------------------------


@pytest.mark.parametrize(("field", "value", "words"), [
    (("timing", "elapsed_seconds"), "NaN", "NaN is not a finite number"),
    (("budget", "loop_seconds"), "-Infinity", "-Infinity is not a finite number"),
    (("training", "counts", "steps"), "1e400", "the number 1e400 is not finite"),
])
def test_import_of_nan_or_infinity_names_the_record_and_the_field(upgraded: dict[str, str], tmp_path: Path,  # noqa: F811
                                                                  field: tuple[str, ...], value: str,
                                                                  words: str) -> None:
    data = one_record()
    [key] = data
    block = data[key]
    for part in field[:-1]:
        block = block[part]
    block[field[-1]] = "__HOSTILE__"
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data).replace('"__HOSTILE__"', value))
    before = fingerprint(upgraded["GGPO_DB_URL"])
    line = assert_refused(run_cli("ledger", "import", str(path)), 2)
    assert f"{path}: at {key}.{'.'.join(field)}: {words}" in line, line
    assert fingerprint(upgraded["GGPO_DB_URL"]) == before


# -- numbers from the environment ------------------------------------------------------------------


@pytest.mark.parametrize(("variable", "value"), [
    ("GGPO_HUNG_AFTER_SECONDS", "inf"), ("GGPO_HUNG_AFTER_SECONDS", "1e400"), ("GGPO_HUNG_AFTER_SECONDS", "1e12"),
    ("GGPO_HUNG_AFTER_SECONDS", "nan"), ("GGPO_HUNG_AFTER_SECONDS", "0"), ("GGPO_DEFER_SECONDS", "9" * 5000),
    ("GGPO_QUEUE_GPU_QUOTA", "1e3"), ("GGPO_USER_GPU_HOURS_CAP", "inf"), ("GGPO_QUEUE_GPU_HOURS_CAP", "-1"),
    ("GGPO_FAULT_PAUSE", "after_submit=1e400"),
])
def test_numbers_from_the_environment_are_bounded_at_start_up(upgraded: dict[str, str], variable: str,  # noqa: F811
                                                              value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ggpo_batch.ledger import connect

    led = connect(upgraded["GGPO_DB_URL"])
    try:  # a running run, whose silence `status` measures against the hung threshold
        from ggpo_batch.ledger import NewRun

        led.create_experiment(name="envnum", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                              actor="t", runs=[NewRun(run_key="envnum-v1-1-a", arm="a", seed=1, config_hash="c",
                                                      run_spec={})])
        led.begin_attempt("envnum-v1-1-a", executor="local", gpus=4, actor="t", worker="w")
        led.mark_submitted("envnum-v1-1-a", 1, job_id="5", actor="t")
        led.mark_running("envnum-v1-1-a", 1, actor="t")
    finally:
        led.engine.dispose()
    monkeypatch.setenv("GGPO_REDIS_URL", "memory://")
    assert run_cli("status").exit_code == 0
    monkeypatch.setenv(variable, value)
    for args in (["status"], ["status", "--json"]):
        line = assert_refused(run_cli(*args), 2, says=f"error: {variable}=")
        assert "must be" in line and len(line) < 200, line


# -- Markdown that stays Markdown ---------------------------------------------------------------------

HOSTILE_TEXT = ("<script>alert(1)</script> _under_ **bold** [link](http://x.example) | cell | "
                "\n# A heading of its own\n| a | b |\n|---|---|\n`code` &amp; ~~gone~~ ![img](x.png)")


def test_report_md_writes_user_text_as_text(upgraded: dict[str, str], tmp_path: Path,  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from markdown_it import MarkdownIt

    assert run_cli("ledger", "import", str(SEED_000), "--name", "exp_with_under_scores").exit_code == 0
    monkeypatch.setenv("GGPO_USER", "eve_<b>x</b>|#")
    res = run_cli("decide", "exp_with_under_scores", "--not-reproduced", "--reason", HOSTILE_TEXT,
                  "--cost-basis", HOSTILE_TEXT, "--cost-type", "| x |", "--available-budget", "*a* _b_")
    assert res.exit_code == 0, res.output
    out = tmp_path / "a`b\n# heading from the path <i>x.md"
    res = run_cli("report", "exp_with_under_scores", "--format", "md", "-o", str(out))
    assert res.exit_code == 0, res.output
    text = out.read_text()
    html = MarkdownIt("commonmark").enable("table").render(text)
    for tag in ("<script", "<b>", "<i>", "<em>", "<a ", "<del", "<s>", "<code>`"):
        assert tag not in html, (tag, html[:3000])
    assert html.count("<strong>") == text.count("\n**")  # the report's own bold lines (table titles) only
    assert html.count("<img") == len([line for line in text.splitlines() if line.startswith("![")])  # plots only
    headings = [line for line in html.splitlines() if line.startswith(("<h1", "<h2", "<h3"))]
    assert headings[0] == "<h1>Report: exp_with_under_scores v1 (ggpo, import, 4 GPUs/run)</h1>", headings
    assert not any("heading" in h for h in headings), headings
    assert html.count("<table>") == text.count("\n| arm |")  # the report's tables, none from user text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; _under_ **bold** [link](http://x.example) | cell |" in html
    assert "eve_&lt;b&gt;x&lt;/b&gt;|#" in html
    assert "heading from the path &lt;i&gt;x.md" in html  # the quoted command, in one code span
    page = tmp_path / "r.html"
    assert run_cli("report", "exp_with_under_scores", "--format", "html", "-o", str(page)).exit_code == 0
    assert "<script>alert" not in page.read_text() and "&lt;script&gt;alert(1)" in page.read_text()
