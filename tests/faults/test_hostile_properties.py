"""Property-based: hostile values for every command argument, environment variable, results-file
field and spec field, each run against a SQLite and a PostgreSQL ledger side by side.

For every generated case, on each backend: exit code in {0, 2, 3, 4}, no traceback, one line on
stderr when refused (at most one otherwise), the ledger unchanged when refused (2 or 4); and both
backends give the same exit code, the same line and the same change to the ledger.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from ggpo_batch.cli import cli
from tests.support.paths import SEED_000
from tests.support.services import flushed_redis, redis_test_db, wipe_pg

TABLES = ("experiments", "runs", "attempts", "events", "decisions")
EXAMPLES = int(os.environ.get("GGPO_HOSTILE_EXAMPLES", "40"))
CHECK = settings(max_examples=EXAMPLES, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                        HealthCheck.data_too_large, HealthCheck.large_base_example])

GOOD_SPEC: dict[str, str] = {
    "schema": "1",
    "experiment.name": '"prop"',
    "experiment.method": '"ggpo"',
    "experiment.description": '"a spec"',
    "experiment.seeds": "[1, 2]",
    "experiment.gpus": "4",
    "experiment.loop_budget_seconds": "5",
    "experiment.executor": '"debug"',
    "experiment.max_gpu_hours": "10.0",
    "experiment.retries": "0",
    "overheads.setup_export_seconds": "1",
    "train.aux_coef": "1.0",
    "train.max_steps": "0",
    "arms.clean.exposure": '"none"',
    "arms.paired.exposure": '"paired"',
    "arms.paired.exposed_items": "2",
    "arms.paired.templates": '["train_direct", "train_role"]',
}

# -- strategies -----------------------------------------------------------------------------------

# What a command argument or an environment variable can hold: any text but NUL, an undecodable
# byte arriving as a lone surrogate (Python's surrogateescape).
_arg_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00") | \
    st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF)
EDGE_TEXT = ["", " ", "-", "_", "a" * 64, "a" * 65, "a" * 128, "a" * 129, "a" * 201, "x" * 10_001, "\u00e9t\u00e9",
             "a b", "a/b", "../../etc/passwd", "a\nb", "a\tb", "$(id)", "a;b", "clean", "seed000", "base",
             "base-v1-1-clean", "seed000-v1-20261012-clean", "prop-v1-1-clean", "\udcff", "ok\udc80"]
arg_text = st.one_of(st.sampled_from(EDGE_TEXT), st.text(_arg_chars, max_size=80),
                     st.text(st.sampled_from("aZ0_-."), min_size=60, max_size=210))
numbers = st.one_of(st.integers(min_value=-(2**80), max_value=2**80), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from(["nan", "inf", "-inf", "1e999", "9" * 5000, "0x10", "1_000", ""]))


def as_arg(v: Any) -> str:
    return v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v)


OK = ["--not-reproduced", "--reason", "review", "--cost-basis", "paper"]
COMMANDS = [
    lambda v: ["decide", v, *OK],
    lambda v: ["decide", "okname", "--not-reproduced", "--reason", v, "--cost-basis", "paper"],
    lambda v: ["decide", "okname", *OK, "--cost-type", v, "--available-budget", v],
    lambda v: ["status", "-e", v],
    lambda v: ["status", "-s", v],
    lambda v: ["report", v],
    lambda v: ["report", "seed000", "--baseline", v],
    lambda v: ["cancel", v],
    lambda v: ["cancel", "-e", v],
    lambda v: ["cancel", "base-v1-1-clean", "--reason", v],
    lambda v: ["retry", v, "--reason", "again"],
    lambda v: ["retry", "base-v1-1-clean", "--reason", v],
    lambda v: ["ledger", "import", str(SEED_000), "--name", v],
    lambda v: ["ledger", "import", str(SEED_000), "--name", "seed000", "--method", v],
    lambda v: ["ledger", "export", "--format", "json", "-e", v],
    lambda v: ["enqueue", "{spec}", "--dry-run", "--queue", v],
    lambda v: ["enqueue", "{spec}", "--dry-run", "--arms", v],
    lambda v: ["enqueue", "{spec}", "--dry-run", "--seeds", v],
    lambda v: ["enqueue", "{spec}", "--queue", v],
    lambda v: ["reconcile", "--queue", v],
]
NUMBER_COMMANDS = [
    lambda n: ["decide", "okname", *OK, "--estimated-gpu-hours", n],
    lambda n: ["report", "seed000", "--version", n],
    lambda n: ["status", "--limit", n],
    lambda n: ["enqueue", "{spec}", "--dry-run", "--seeds", n],
    lambda n: ["reconcile", "--timeout", n],
]
ENV_COMMANDS = {
    "GGPO_USER": ["decide", "okname", *OK],
    "GGPO_QUEUE": ["status"],
    "GGPO_QUEUE_GPU_QUOTA": ["status"],
    "GGPO_USER_GPU_HOURS_CAP": ["enqueue", "{spec}", "--dry-run"],
}

# Any JSON value, including what JSON allows and the ledger must refuse.
_any_text = st.text(st.characters(), max_size=40) | st.sampled_from(["\x00", "a\x00b", "\ud800", "x" * 70_000])
_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
                       st.floats(allow_nan=True, allow_infinity=True), _any_text)
json_values = st.recursive(_json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(_any_text, c, max_size=3),
                           max_leaves=8)
RAW_JSON = ["[" * 100_000 + "]" * 100_000, '{"a":' * 5_000 + "1" + "}" * 5_000, "9" * 5000, "-" + "9" * 30, "1e999",
            "-1e999", "NaN", "Infinity", '"\\ud800"', '"\\u0000"', "[" * 40 + "]" * 40]
RECORD_PATHS = [("seed",), ("arm",), ("training", "status"), ("training", "counts", "steps"),
                ("training", "cost_limitations"), ("budget", "budget_seconds"), ("budget", "loop_seconds"),
                ("budget", "exposure_templates"), ("budget", "limitation"), ("timing", "gpus"),
                ("timing", "elapsed_seconds"), ("timing", "arm"), ("extra",), ("training", "counts", "extra")]

# Any TOML value a spec field can be given.


def toml_string(s: str) -> str:
    out = []
    for c in s:
        if c in '"\\' or ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF:
            out.append(f"\\u{ord(c):04x}" if c not in '"\\' else "\\" + c)
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def toml_float(f: float) -> str:
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    r = repr(f)
    return r if any(c in r for c in ".e") else r + ".0"


toml_values = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(toml_float),
    _any_text.map(toml_string),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.sampled_from(["[1, 2]", "[]", "[[[[1]]]]", "1979-05-27T07:32:00Z", "{ a = 1 }", '["a", 1]', "9" * 5000,
                    "[" * 3000 + "]" * 3000, "[" + ", ".join(str(i) for i in range(1001)) + "]", "0.0", "-0.0",
                    "1e-320"]),
)


def render_spec(fields: dict[str, str], arm_name: str | None = None) -> str:
    tables: dict[str, list[str]] = {}
    top = []
    for key, value in fields.items():
        if "." not in key:
            top.append(f"{key} = {value}")
            continue
        table, name = key.rsplit(".", 1)
        if arm_name is not None and table == "arms.clean":
            table = f"arms.{toml_string(arm_name)}"
        tables.setdefault(table, []).append(f"{name} = {value}")
    return "\n".join(top + [f"[{t}]\n" + "\n".join(lines) for t, lines in tables.items()]) + "\n"


# -- the two ledgers ----------------------------------------------------------------------------------


class Backends:
    """A SQLite and a PostgreSQL ledger, each with an imported experiment and a queued one, run
    side by side: the same command on both, compared."""

    def __init__(self, root: Path, pg_url: str, redis_url: str) -> None:
        self.root = root
        self.urls = {"sqlite": f"sqlite:///{root / 'sqlite' / 'ledger.sqlite3'}", "postgresql": pg_url}
        self.redis_url = redis_url
        self.spec = root / "spec.toml"
        self.cases = 0
        self.seconds = 0.0
        self.outcomes: dict[int, int] = {}

    def env(self, backend: str, extra: dict[str, str] | None = None) -> dict[str, str | None]:
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("GGPO_")}
        env.update({"GGPO_DB_URL": self.urls[backend], "GGPO_DATA_DIR": str(self.root / backend),
                    "GGPO_USER": "tester", "GGPO_REDIS_URL": self.redis_url,
                    "GGPO_QUEUE": "hq-sqlite" if backend == "sqlite" else "hq-postgresql"})
        env.update(extra or {})
        return env

    def fingerprint(self, backend: str) -> dict[str, int]:
        engine = create_engine(self.urls[backend].replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            with engine.connect() as conn:
                return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}
        finally:
            engine.dispose()

    def normalise(self, backend: str, line: str) -> str:
        for k, v in (("<ledger>", self.urls[backend]), ("<data>", str(self.root / backend)),
                     ("<queue>", f"hq-{backend}")):
            line = line.replace(v, k)
        return line.replace(self.urls[backend].replace("sqlite:///", "sqlite:////").replace("////", "///"), "<ledger>")

    def run(self, args: list[str], extra_env: dict[str, str] | None = None) -> None:
        """Run `args` on both ledgers; assert the contract on each and that they agree."""
        args = [str(self.spec) if a == "{spec}" else a for a in args]
        t0 = time.perf_counter()
        seen = {}
        for backend in ("sqlite", "postgresql"):
            before = self.fingerprint(backend)
            res = CliRunner(env=self.env(backend, extra_env)).invoke(cli, args, catch_exceptions=True)
            _dispose_engines()
            after = self.fingerprint(backend)
            where = (backend, args, extra_env)
            assert res.exception is None or isinstance(res.exception, SystemExit), (where, repr(res.exception),
                                                                                    res.output[-3000:])
            assert res.exit_code in (0, 2, 3, 4), (where, res.exit_code, res.output[-3000:])
            assert "Traceback" not in res.output, (where, res.output[-3000:])
            # Work that takes longer than a few seconds shows progress lines before its answer
            # (control/progress.py: `import <file> 0/3: reading`), as a loaded machine made of a
            # deeply nested file's reading; the contract is on the answer itself.
            lines = [line for line in res.stderr.strip().splitlines() if not PROGRESS_LINE.match(line)]
            if res.exit_code:
                assert len(lines) == 1 and lines[0].startswith("error: "), (where, res.stderr)
            else:
                assert len(lines) <= 1, (where, res.stderr)
            if res.exit_code in (2, 4):
                assert after == before, (where, "a refusal changed the ledger", before, after, lines)
            delta = {t: after[t] - before[t] for t in TABLES}
            seen[backend] = (res.exit_code, self.normalise(backend, lines[0]) if lines else "", delta)
            self.outcomes[res.exit_code] = self.outcomes.get(res.exit_code, 0) + 1
        assert seen["sqlite"] == seen["postgresql"], (args, extra_env, seen)
        self.cases += 1
        self.seconds += time.perf_counter() - t0


# A plain progress line of the tasks these commands run after a delay (control/progress.py):
# "<description> <done>/<total>: <note>", or "<description> <done>: <note>" for "attempts ended".
PROGRESS_LINE = re.compile(r"^(import \S+|attempts ended) \d+(/\d+)?(: .*)?$")

_ENGINES: list[Any] = []


def _dispose_engines() -> None:
    """Close what the commands of one case opened (the CLI's process would have ended)."""
    while _ENGINES:
        _ENGINES.pop().dispose()


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory, pg_url: str) -> Iterator[Backends]:
    from ggpo_batch.ledger import db

    real = db.create_engine

    def recorded(*args: Any, **kwargs: Any) -> Any:
        engine = real(*args, **kwargs)
        _ENGINES.append(engine)
        return engine

    redis_gen = flushed_redis(redis_test_db())
    redis_url = next(redis_gen)
    wipe_pg(pg_url)
    mp = pytest.MonkeyPatch()
    mp.setattr(db, "create_engine", recorded)
    b = Backends(tmp_path_factory.mktemp("hostile"), pg_url, redis_url)
    b.spec.write_text(render_spec({**GOOD_SPEC, "experiment.name": '"base"'}))
    for backend in ("sqlite", "postgresql"):
        for args in (["db", "upgrade"], ["ledger", "import", str(SEED_000), "--name", "seed000"], ["enqueue", str(b.spec)]):
            res = CliRunner(env=b.env(backend)).invoke(cli, args)
            assert res.exit_code == 0, (backend, args, res.output)
        _dispose_engines()
    b.spec.write_text(render_spec(GOOD_SPEC))
    yield b
    mp.undo()
    _dispose_engines()
    wipe_pg(pg_url)
    next(redis_gen, None)
    total = sum(b.outcomes.values())
    print(f"\nhostile properties: {b.cases} cases x 2 backends in {b.seconds:.1f} s "
          f"({b.seconds / max(b.cases, 1) * 1000:.0f} ms a case); exit codes {dict(sorted(b.outcomes.items()))} "
          f"of {total}")


# -- the properties --------------------------------------------------------------------------------------


@pytest.mark.slow
@CHECK
@given(command=st.sampled_from(COMMANDS), value=arg_text)
def test_hostile_command_arguments(backends: Backends, command, value: str) -> None:  # type: ignore[no-untyped-def]
    backends.run(command(value))


@pytest.mark.slow
@CHECK
@given(command=st.sampled_from(NUMBER_COMMANDS), value=numbers)
def test_hostile_numbers_in_arguments(backends: Backends, command, value: Any) -> None:  # type: ignore[no-untyped-def]
    backends.run(command(as_arg(value)))


@pytest.mark.slow
@CHECK
@given(variable=st.sampled_from(sorted(ENV_COMMANDS)), value=st.one_of(arg_text.filter(bool), numbers.map(as_arg)))
def test_hostile_environment(backends: Backends, variable: str, value: str) -> None:
    backends.run(ENV_COMMANDS[variable], {variable: value})


@pytest.mark.slow
@CHECK
@given(path=st.sampled_from(RECORD_PATHS), value=st.one_of(json_values, st.sampled_from(RAW_JSON)),
       key=st.one_of(st.none(), _any_text))
def test_hostile_results_file_fields(backends: Backends, path: tuple[str, ...], value: Any,
                                     key: str | None) -> None:
    records = json.loads(SEED_000.read_text())
    first_key, rec = next(iter(records.items()))
    marker = "__HOSTILE_VALUE__"
    block = rec
    for part in path[:-1]:
        block = block[part]
    raw = value if isinstance(value, str) and value in RAW_JSON else None
    block[path[-1]] = marker if raw is not None else value
    body = json.dumps({key if key is not None else first_key: rec}, allow_nan=True)
    if raw is not None:
        body = body.replace(json.dumps(marker), raw)
    f = backends.root / "hostile-results.json"
    f.write_text(body, encoding="utf-8", errors="surrogatepass")
    backends.run(["ledger", "import", str(f)])


@CHECK
@given(field=st.sampled_from(sorted(GOOD_SPEC) + ["experiment.queue", "experiment.profile", "arms.clean.templates",
                                                 "<arm name>"]),
       value=toml_values, arm=_any_text)
def test_hostile_spec_fields(backends: Backends, field: str, value: str, arm: str) -> None:
    if field == "<arm name>":
        text_ = render_spec(GOOD_SPEC, arm_name=arm)
    else:
        text_ = render_spec({**GOOD_SPEC, field: value})
    backends.spec.write_text(text_, encoding="utf-8", errors="surrogatepass")
    try:
        backends.run(["enqueue", str(backends.spec)])
    finally:
        backends.spec.write_text(render_spec(GOOD_SPEC))
