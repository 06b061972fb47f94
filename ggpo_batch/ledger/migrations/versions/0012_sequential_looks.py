"""The looks of sequential designs (ggpo_batch/control/waves.py): one row per arm and look, with the
statistic, the boundary it was held against, the per-seed differences it was computed from and the
decision (crossed / futile / continue / final / refused), so an audit can replay every look. On
PostgreSQL: every role reads them; only the service (reconcile) inserts; nothing updates or deletes.
And a member may move a run of theirs to `held` (0006's `runs` / `ggpo_member_update`): accepting the
cost of a sequential design (`enqueue --accept-cost`) puts the runs of its later waves, decided not
reproduced, back on hold (not_reproduced -> held) rather than on the queue.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

MEMBER, SERVICE = "ggpo_member", "ggpo_service"
_OWNS_EXP = "ggpo_may_manage(ggpo_experiment_owner(experiment_id))"


def _member_update(states: str) -> str:
    """0006's `runs` / `ggpo_member_update`, with the states a member's run may be moved to."""
    return (f"CREATE POLICY ggpo_member_update ON runs FOR UPDATE TO {MEMBER} USING ({_OWNS_EXP}) "
            f"WITH CHECK ({_OWNS_EXP} AND state IN {states})")

POLICIES = [
    ("sequential_looks", "ggpo_read", "SELECT", "PUBLIC", "true", None),
    ("sequential_looks", "ggpo_service_insert", "INSERT", SERVICE, None, "true"),
]


def upgrade() -> None:
    op.create_table(
        'sequential_looks',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('experiment_id', sa.Integer(), sa.ForeignKey('experiments.id', ondelete='CASCADE'),
                  nullable=False),
        sa.Column('arm', sa.String(length=64), nullable=False),
        sa.Column('look', sa.Integer(), nullable=False),
        sa.Column('looks', sa.Integer(), nullable=False),
        sa.Column('seeds', sa.Integer(), nullable=False),
        sa.Column('seeds_paired', sa.Integer(), nullable=False),
        sa.Column('metric', sa.String(length=64), nullable=False),
        sa.Column('statistic', sa.Float(), nullable=True),
        sa.Column('boundary', sa.Float(), nullable=True),
        sa.Column('alpha', sa.Float(), nullable=False),
        sa.Column('spending', sa.String(length=32), nullable=False),
        sa.Column('waves', sa.JSON(), nullable=False),
        sa.Column('per_seed', sa.JSON(), nullable=False),
        sa.Column('decision', sa.String(length=16), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('decided_by', sa.String(length=128), nullable=False),
        sa.Column('decided_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('experiment_id', 'arm', 'look', name='uq_look_experiment_arm_look'),
    )
    op.create_index('ix_sequential_looks_experiment_id', 'sequential_looks', ['experiment_id'])
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.execute(f"GRANT SELECT ON sequential_looks TO {MEMBER}, {SERVICE}")
    op.execute(f"GRANT INSERT ON sequential_looks TO {SERVICE}")
    op.execute(f"GRANT USAGE, SELECT ON SEQUENCE sequential_looks_id_seq TO {SERVICE}")
    op.execute("ALTER TABLE sequential_looks ENABLE ROW LEVEL SECURITY")
    for table, name, command, role, using, check in POLICIES:
        clauses = (f" USING ({using})" if using else "") + (f" WITH CHECK ({check})" if check else "")
        op.execute(f"CREATE POLICY {name} ON {table} FOR {command} TO {role}{clauses}")
    op.execute("DROP POLICY IF EXISTS ggpo_member_update ON runs")
    op.execute(_member_update("('queued', 'cancelled', 'not_reproduced', 'held')"))


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("DROP POLICY IF EXISTS ggpo_member_update ON runs")
        op.execute(_member_update("('queued', 'cancelled', 'not_reproduced')"))
    op.drop_index('ix_sequential_looks_experiment_id', table_name='sequential_looks')
    op.drop_table('sequential_looks')
