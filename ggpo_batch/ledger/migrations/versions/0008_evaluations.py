"""Evaluations after training: one row per succeeded run and outcome-set name (its state, data file,
outcome and record), and `attempts.evaluation_id` naming the evaluation an attempt of kind
`evaluation` spent its GPU-hours on. Older attempts have none (NULL).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'evaluations',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('run_id', sa.Integer(), sa.ForeignKey('runs.id', ondelete='CASCADE'), nullable=False),
        sa.Column('key', sa.String(270), nullable=False),
        sa.Column('name', sa.String(64), nullable=False),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('source', sa.String(16), nullable=False),
        sa.Column('spec', sa.JSON(), nullable=False),
        sa.Column('gpus', sa.Integer(), nullable=False),
        sa.Column('cause', sa.Text(), nullable=True),
        sa.Column('outcome', sa.JSON(), nullable=True),
        sa.Column('record', sa.JSON(), nullable=True),
        sa.Column('created_by', sa.String(128), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('run_id', 'name', name='uq_evaluation_run_name'),
        sa.UniqueConstraint('key', name='uq_evaluations_key'),
    )
    op.create_index('ix_evaluations_run_id', 'evaluations', ['run_id'])
    op.create_index('ix_evaluations_state', 'evaluations', ['state'])
    with op.batch_alter_table('attempts') as batch:
        batch.add_column(sa.Column('evaluation_id', sa.Integer(), nullable=True))
        batch.create_foreign_key('fk_attempts_evaluation_id', 'evaluations', ['evaluation_id'], ['id'],
                                 ondelete='CASCADE')
        batch.create_index('ix_attempts_evaluation_id', ['evaluation_id'])
    _keep_booked_at_index()
    if op.get_bind().dialect.name == 'postgresql':
        _permissions()


def _keep_booked_at_index() -> None:
    """On SQLite a batch operation copies `attempts` into a new table, and SQLAlchemy does not reflect
    the expression index of migration 0006 (`costs --since` reads attempts through it): made again."""
    if op.get_bind().dialect.name == 'sqlite':
        op.execute("CREATE INDEX IF NOT EXISTS ix_attempts_booked_at ON attempts (coalesce(ended_at, created_at))")


# The team's roles (migration 0006, ggpo_batch/config/identity.py): a member queues, cancels and retries by
# hand the evaluations of the experiments they may manage (ggpo_may_manage, as for runs); the
# service (the worker, reconcile) moves any; everyone granted SELECT reads every row.
MEMBER, SERVICE = "ggpo_member", "ggpo_service"
_OWNS = "ggpo_may_manage(ggpo_experiment_owner(ggpo_run_experiment(run_id)))"
POLICIES = [
    ("ggpo_read", "SELECT", "PUBLIC", "true", None),
    ("ggpo_service_insert", "INSERT", SERVICE, None, "true"),
    ("ggpo_service_update", "UPDATE", SERVICE, "true", "true"),
    ("ggpo_member_insert", "INSERT", MEMBER, None, f"{_OWNS} AND state = 'queued' AND outcome IS NULL"),
    ("ggpo_member_update", "UPDATE", MEMBER, _OWNS, f"{_OWNS} AND state IN ('queued', 'cancelled')"),
]


def _permissions() -> None:
    op.execute(f"GRANT SELECT, INSERT ON evaluations TO {MEMBER}, {SERVICE}")
    op.execute(f"GRANT UPDATE ON evaluations TO {SERVICE}")
    op.execute(f"GRANT UPDATE (state, cause, spec, updated_at) ON evaluations TO {MEMBER}")
    sequence = op.get_bind().execute(sa.text("SELECT pg_get_serial_sequence('evaluations', 'id')")).scalar()
    if sequence:
        op.execute(f"GRANT USAGE, SELECT ON SEQUENCE {sequence} TO {MEMBER}, {SERVICE}")
    op.execute("ALTER TABLE evaluations ENABLE ROW LEVEL SECURITY")
    for name, command, role, using, check in POLICIES:
        clauses = (f" USING ({using})" if using else "") + (f" WITH CHECK ({check})" if check else "")
        op.execute(f"CREATE POLICY {name} ON evaluations FOR {command} TO {role}{clauses}")


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.drop_index('ix_attempts_evaluation_id')
        batch.drop_constraint('fk_attempts_evaluation_id', type_='foreignkey')
        batch.drop_column('evaluation_id')
    _keep_booked_at_index()
    op.drop_index('ix_evaluations_state', table_name='evaluations')
    op.drop_index('ix_evaluations_run_id', table_name='evaluations')
    op.drop_table('evaluations')
