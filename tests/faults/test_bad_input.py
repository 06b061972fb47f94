"""A generated set of malformed specs: each gets one error line naming the file (and the field),
exit code 2, no traceback, and no ledger row."""

from __future__ import annotations

import json
import time
from pathlib import Path

from click.testing import CliRunner

from ggpo_batch.cli import cli

GOOD = {
    "schema": "1",
    "experiment.name": '"bad-input"',
    "experiment.method": '"ggpo"',
    "experiment.seeds": "[1, 2]",
    "experiment.gpus": "4",
    "experiment.loop_budget_seconds": "5",
    "experiment.executor": '"debug"',
    "experiment.max_gpu_hours": "10.0",
    "experiment.retries": "0",
    "overheads.setup_export_seconds": "1",
    "arms.clean.exposure": '"none"',
    "arms.paired.exposure": '"paired"',
    "arms.paired.exposed_items": "2",
    "arms.paired.templates": '["train_direct", "train_role"]',
}
# Values each field must refuse (the field named in the error starts with the key).
INVALID = {
    "schema": ['"1"', "2", "true", "1.0", "-1"],
    "experiment.name": ["1", '""', '"a b"', '"-lead"', '"' + "x" * 65 + '"', "true", '"\u00e9t\u00e9"', '"a/b"'],
    "experiment.method": ['"ppo"', "1", '""', '"GGPO"', "[\"ggpo\"]"],
    "experiment.seeds": ["[]", "[-1]", '["a"]', "[1.5]", "1", "[true]", "[1, 1]", '"1,2"'],
    "experiment.gpus": ["0", "-1", "65", "1.5", '"4"', "true", "100000"],
    "experiment.loop_budget_seconds": ["0", "-1", '"5"', "true", "inf", "nan", "1e12", "-inf"],
    "experiment.executor": ['"k8s"', "1", '""', '"SLURM"'],
    "experiment.max_gpu_hours": ["0", "-1", '"10"', "nan", "inf", "true", "1e300"],
    "experiment.retries": ["-1", "11", "1.5", '"0"', "true"],
    "overheads.setup_export_seconds": ["-1", '"x"', "inf", "true", "1e12"],
    "arms.clean.exposure": ['"x"', "1", "true", '""'],
    "arms.paired.exposed_items": ["0", "-1", "1.5", '"2"', "true", "10000001"],
    "arms.paired.templates": ['"train_direct"', "[1]", '[""]', "[]", '["a", "a"]'],
}
FIELD_FOR = {"arms.paired.exposed_items": "arms.paired", "arms.paired.templates": "arms.paired"}


def _render(fields: dict[str, str]) -> str:
    tables: dict[str, list[str]] = {}
    top = []
    for key, value in fields.items():
        if "." not in key:
            top.append(f"{key} = {value}")
            continue
        table, name = key.rsplit(".", 1)
        tables.setdefault(table, []).append(f"{name} = {value}")
    return "\n".join(top + [f"[{t}]\n" + "\n".join(lines) for t, lines in tables.items()]) + "\n"


def _cases() -> list[tuple[str, str, str | None]]:
    """(case id, file text, field the error must name) — at least 100 of them."""
    cases: list[tuple[str, str, str | None]] = []
    for key, values in INVALID.items():
        for i, bad in enumerate(values):
            cases.append((f"{key}={i}", _render(dict(GOOD, **{key: bad})), FIELD_FOR.get(key, key)))
    for key in ("experiment.name", "experiment.method", "experiment.seeds"):
        fields = {k: v for k, v in GOOD.items() if k != key}
        cases.append((f"missing-{key}", _render(fields), key))
    cases += [
        ("duplicate-seeds", _render(dict(GOOD, **{"experiment.seeds": "[3, 3]"})), "experiment.seeds"),
        ("negative-budget", _render(dict(GOOD, **{"experiment.loop_budget_seconds": "-60"})),
         "experiment.loop_budget_seconds"),
        ("zero-budget", _render(dict(GOOD, **{"experiment.loop_budget_seconds": "0"})), "experiment.loop_budget_seconds"),
        ("huge-budget", _render(dict(GOOD, **{"experiment.loop_budget_seconds": "1e12"})),
         "experiment.loop_budget_seconds"),
        ("huge-gpus", _render(dict(GOOD, **{"experiment.gpus": "100000"})), "experiment.gpus"),
        ("nan-cap", _render(dict(GOOD, **{"experiment.max_gpu_hours": "nan"})), "experiment.max_gpu_hours"),
        ("inf-cap", _render(dict(GOOD, **{"experiment.max_gpu_hours": "inf"})), "experiment.max_gpu_hours"),
        ("unicode-name", _render(dict(GOOD, **{"experiment.name": '"\u5b9e\u9a8c"'})), "experiment.name"),
        ("shell-name", _render(dict(GOOD, **{"experiment.name": '"x; rm -rf / $(id)"'})), "experiment.name"),
        ("newline-name", _render(dict(GOOD, **{"experiment.name": '"a\\nb"'})), "experiment.name"),
        ("quote-arm", _render(dict(GOOD, **{'arms."o\'neil".exposure': '"none"'})), "arms.o'neil"),
        ("unknown-exposure", _render(dict(GOOD, **{"arms.clean.exposure": '"leaked"'})), "arms.clean.exposure"),
        ("none-with-items", _render(dict(GOOD, **{"arms.clean.exposed_items": "3"})), "arms.clean"),
        ("paired-no-templates", _render(dict(GOOD, **{"arms.paired.templates": "[]"})), "arms.paired"),
        ("dup-templates", _render(dict(GOOD, **{"arms.paired.templates": '["a", "a"]'})), "arms.paired.templates"),
        ("unknown-top", _render(dict(GOOD, colour='"red"')), "colour"),
        ("unknown-field", _render(dict(GOOD, **{"experiment.colour": '"red"'})), "experiment.colour"),
        ("bad-schema", _render(dict(GOOD, schema="7")), "schema"),
        ("no-arms", _render({k: v for k, v in GOOD.items() if not k.startswith("arms.")}), "arms"),
        ("too-many-seeds", _render(dict(GOOD, **{"experiment.seeds": "[" + ",".join(map(str, range(1001))) + "]"})),
         "experiment.seeds"),
        ("toml-syntax", "[experiment\nname = ", None),
        ("toml-dup-key", "[experiment]\nname = 'a'\nname = 'b'\n", None),
        ("not-a-table", "experiment = 3\n", "experiment"),
        ("arms-not-table", _render(GOOD) + "\n", None),
    ]
    return cases


CASES = _cases()


def test_there_are_at_least_100_cases() -> None:
    assert len(CASES) >= 100


def test_every_malformed_spec_is_one_line_exit_2_no_ledger_row(env: dict[str, str], tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    t0 = time.perf_counter()
    checked = 0
    for i, (case, text, field) in enumerate(CASES):
        path = tmp_path / f"case{i}.toml"
        path.write_text(text, encoding="utf-8")
        if case == "arms-not-table":  # valid spec, but ask for an arm it does not have
            res = runner.invoke(cli, ["enqueue", str(path), "--arms", "nope", "--dry-run"], catch_exceptions=False)
            field = "arms"
        else:
            res = runner.invoke(cli, ["enqueue", str(path)], catch_exceptions=False)
        out = res.output.strip()
        assert res.exit_code == 2, (case, res.exit_code, out)
        assert "Traceback" not in out and out.count("\n") == 0, (case, out)
        assert out.startswith(f"error: {path}"), (case, out)
        if field:
            assert f": {field}" in out, (case, field, out)
        checked += 1
    for special, make in (("missing", lambda p: None), ("directory", lambda p: p.mkdir()),
                          ("empty", lambda p: p.write_text("")), ("binary", lambda p: p.write_bytes(b"\x00\xff\xfe"))):
        path = tmp_path / f"special-{special}.toml"
        make(path)
        res = runner.invoke(cli, ["enqueue", str(path)], catch_exceptions=False)
        assert res.exit_code == 2 and res.output.count("\n") == 1 and str(path) in res.output, (special, res.output)
        checked += 1
    status = runner.invoke(cli, ["status", "--json"], catch_exceptions=False)
    assert json.loads(status.output)["experiments"] == []
    print(f"\n{checked} malformed specs: all exit 2, one line, no traceback, no ledger row "
          f"({(time.perf_counter() - t0) / checked * 1000:.1f} ms each)")
