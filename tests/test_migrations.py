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


def test_migrations_create_exactly_the_model_tables(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    insp = inspect(engine)
    for table in Base.metadata.sorted_tables:
        cols = {c["name"] for c in insp.get_columns(table.name)}
        assert cols == {c.name for c in table.columns}, table.name
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
