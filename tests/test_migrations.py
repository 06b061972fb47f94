from __future__ import annotations

import pytest
from sqlalchemy import inspect

from ggpo_batch.errors import SchemaBehindError
from ggpo_batch.ledger import connect, current_revision, downgrade, head_revision, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.ledger.schema import Base

TABLES = {"experiments", "runs", "attempts", "events", "decisions", "artifacts", "component_runs"}


def test_upgrade_empty_then_downgrade_to_base(db_url: str) -> None:
    engine = make_engine(db_url)
    assert current_revision(engine) is None
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    assert TABLES <= set(inspect(engine).get_table_names())
    downgrade(engine, "base")
    assert current_revision(engine) is None
    assert not TABLES & set(inspect(engine).get_table_names())
    upgrade(engine)  # and back: a downgrade leaves nothing that blocks a fresh upgrade
    assert current_revision(engine) == head_revision()
    engine.dispose()


def schema_drift(engine, metadata) -> list:  # type: ignore[no-untyped-def]
    """What Alembic's autogenerate finds between the database and `metadata` (tables, columns with
    their types, nullability and server defaults, indexes, unique and foreign-key constraints), plus
    what it cannot compare: indexes on expressions, by name (neither dialect reflects them to it)."""
    import warnings

    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import Column

    with warnings.catch_warnings(), engine.connect() as conn:
        warnings.filterwarnings("ignore", message=".*expression-based index")
        context = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        drift = list(compare_metadata(context, metadata))
        expression_indexes = {i.name for t in metadata.tables.values() for i in t.indexes
                              if any(not isinstance(e, Column) for e in i.expressions)}
        if conn.dialect.name == "sqlite":
            present = set(conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'index'").scalars())
        else:
            present = set(conn.exec_driver_sql("SELECT indexname FROM pg_indexes WHERE schemaname = "
                                               "current_schema()").scalars())
    drift += [("missing expression index", name) for name in sorted(expression_indexes - present)]
    return drift


def test_migrations_create_exactly_the_model_schema(db_url: str) -> None:
    """Not only the column names: types, nullability, defaults, indexes and constraints, on both backends."""
    engine = make_engine(db_url)
    upgrade(engine)
    assert schema_drift(engine, Base.metadata) == []
    engine.dispose()


def test_the_schema_comparison_finds_a_changed_type_nullability_and_index(db_url: str) -> None:
    """The comparison can fail: a model whose column names all match the migrated database, with
    one column's type, another's nullability and two indexes (one on an expression) changed."""
    from sqlalchemy import Index, MetaData, Text, func

    engine = make_engine(db_url)
    upgrade(engine)
    planted = MetaData()
    for table in Base.metadata.sorted_tables:
        table.to_metadata(planted)
    runs = planted.tables["runs"]
    runs.c.arm.type = Text()
    runs.c.config_hash.nullable = not runs.c.config_hash.nullable
    Index("ix_runs_planted", runs.c.seed)
    Index("ix_runs_planted_expression", func.lower(runs.c.arm))
    kinds = {d[0] if isinstance(d, tuple) else d[0][0] for d in schema_drift(engine, planted)}
    assert {"modify_type", "modify_nullable", "add_index", "missing expression index"} <= kinds
    engine.dispose()


def test_refuses_empty_schema_with_the_command_to_run(db_url: str) -> None:
    with pytest.raises(SchemaBehindError, match="ggpo-batch db upgrade"):
        connect(db_url)


def test_refuses_schema_newer_than_the_code(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = 'ffff_unknown'")
    with pytest.raises(SchemaBehindError, match="newer than this code"):
        connect(db_url)
    engine.dispose()


def test_the_packaged_head_is_the_head_of_migrations() -> None:
    """Commands check the schema against a constant (no alembic import); it must not drift."""
    from ggpo_batch.ledger.db import HEAD_REVISION, migrations_head

    assert HEAD_REVISION == migrations_head()


def test_status_start_up_imports_no_orm_alembic_rich_torch_matplotlib_or_rq(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`status` on an empty ledger (issue 14: under 0.3 s) reads through SQLAlchemy Core alone: the ORM,
    the declarative schema, every part of Ledger, rich and the other commands' modules stay unimported."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update({"GGPO_DATA_DIR": str(tmp_path), "GGPO_REDIS_URL": "redis://127.0.0.1:1/0"})  # nothing listens: untouched
    subprocess.run([sys.executable, "-m", "ggpo_batch.cli", "db", "upgrade"], env=env, check=True,
                   capture_output=True)
    heavy = ("alembic", "torch", "matplotlib", "rq", "deepspeed", "sqlalchemy.orm", "rich", "ggpo_batch.ledger.schema",
             "ggpo_batch.ledger.core", "ggpo_batch.reporting.status", "ggpo_batch.cli.queue_cmds",
             "ggpo_batch.cli.train_cmds", "ggpo_batch.cli.dashboard_cmds", "ggpo_batch.cli.report_cmds")
    probe = ("import sys; from ggpo_batch.cli import cli; cli(['status'], standalone_mode=False); "
             f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, check=True, capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[0].startswith("no experiments in the ledger")
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_limits_fit_the_ledger_columns() -> None:
    """limits.py states the lengths of the columns that hold checked input, and schema.py declares
    those columns with them; the names a run key is made of fit it, and names fit their columns."""
    from ggpo_batch.common import limits
    from ggpo_batch.ledger.schema import Attempt, ComponentRun, Decision, Event, Experiment, Run

    def length(attr) -> int:  # type: ignore[no-untyped-def]
        return int(attr.property.columns[0].type.length)

    assert length(Run.arm) == limits.ARM_NAME_MAX and length(Run.run_key) == limits.RUN_KEY_MAX
    assert {length(c) for c in (Event.actor, Experiment.created_by, Attempt.submitted_by, Decision.decided_by,
                                ComponentRun.actor)} == {limits.USER_MAX}
    assert length(Run.worker) == length(Attempt.worker) == limits.WORKER_NAME_MAX
    assert limits.NAME_MAX <= min(length(Experiment.name), length(Decision.experiment_name), length(Experiment.queue))


def test_a_truncated_sqlite_ledger_is_refused_even_by_a_query_that_reads_only_its_first_page(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SQLite notices a missing page only when a query reads it; `SELECT 1` reads none, so without
    the header check a truncated ledger would open. The same file whole opens."""
    import sqlite3

    from sqlalchemy import text
    from sqlalchemy.exc import DatabaseError

    db = tmp_path / "ledger.sqlite3"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 200,)] * 500)
    conn.close()
    assert not (tmp_path / "ledger.sqlite3-wal").exists()
    healthy = make_engine(f"sqlite:///{db}")
    with healthy.connect() as c:
        assert c.execute(text("SELECT count(*) FROM t")).scalar() == 500
    healthy.dispose()  # the last connection checkpoints and removes the log
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    engine = make_engine(f"sqlite:///{db}")
    with pytest.raises(DatabaseError, match="truncated"), engine.connect() as c:
        c.execute(text("SELECT 1"))
    engine.dispose()
