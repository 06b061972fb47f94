"""Held runs (ggpo_batch/contracts/states.py: in the ledger, never on the queue, until released or
cancelled): on PostgreSQL, a member may create their experiment's runs `held`, as they may `queued`
(an enqueue that holds its runs for a canary or a later wave). Releasing (held -> queued) and
cancelling (held -> cancelled) need nothing new: `ggpo_member_update` already admits a move to queued
or cancelled of a run of theirs. SQLite has no policies: nothing to do there.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

MEMBER = "ggpo_member"
_OWNS_EXP = "ggpo_may_manage(ggpo_experiment_owner(experiment_id))"


def _insert_policy(states: str) -> str:
    """0006's `runs` / `ggpo_member_insert`, with the states a member's new run may be in."""
    return (f"CREATE POLICY ggpo_member_insert ON runs FOR INSERT TO {MEMBER} WITH CHECK ("
            f"{_OWNS_EXP} AND (ggpo_experiment_source(experiment_id) = 'import' OR "
            f"(state IN {states} AND result IS NULL AND outcome IS NULL)))")


def upgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.execute("DROP POLICY IF EXISTS ggpo_member_insert ON runs")
    op.execute(_insert_policy("('held', 'queued', 'not_reproduced')"))


def downgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.execute("DROP POLICY IF EXISTS ggpo_member_insert ON runs")
    op.execute(_insert_policy("('queued', 'not_reproduced')"))
