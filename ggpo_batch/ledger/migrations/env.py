"""Alembic environment for the ggpo-batch ledger. The engine comes from `ggpo_batch.ledger.db`
(config.attributes["engine"]) or, for the alembic CLI, from GGPO_DB_URL via ggpo_batch.config.settings."""

from __future__ import annotations

from alembic import context

from ggpo_batch.ledger.schema import Base

config = context.config
target_metadata = Base.metadata


def _engine():  # type: ignore[no-untyped-def]
    engine = config.attributes.get("engine")
    if engine is None:
        from ..config.settings import load_settings
        from ggpo_batch.ledger.db import make_engine

        engine = make_engine(load_settings().db_url)
    return engine


def run_migrations_online() -> None:
    with _engine().connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run `ggpo-batch db upgrade`")
run_migrations_online()
