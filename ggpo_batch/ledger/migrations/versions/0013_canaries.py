"""The canaries before a sweep (ggpo_batch/control/canary.py): one row per distinct shape (model,
rollout, ZeRO stage, tensor parallel size) of an experiment version, naming the run it stands for
(its attempts, kind `canary`, are booked on that run), its state, the reason it failed and the
record its job wrote. On PostgreSQL: every role reads them; a member inserts and updates those of
the experiments they may manage (an enqueue creates them, `canary --rerun` queues one again); the
service (worker, reconcile) inserts and updates any. Runs a failed canary cancelled go back to held
(`canary --rerun`): 0012's `ggpo_member_update` already admits a member's move to held.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

MEMBER, SERVICE = "ggpo_member", "ggpo_service"
_OWNS_EXP = "ggpo_may_manage(ggpo_experiment_owner(experiment_id))"

POLICIES = [
    ("canaries", "ggpo_read", "SELECT", "PUBLIC", "true", None),
    ("canaries", "ggpo_member_insert", "INSERT", MEMBER, None, _OWNS_EXP),
    ("canaries", "ggpo_member_update", "UPDATE", MEMBER, _OWNS_EXP, _OWNS_EXP),
    ("canaries", "ggpo_service_insert", "INSERT", SERVICE, None, "true"),
    ("canaries", "ggpo_service_update", "UPDATE", SERVICE, "true", "true"),
]


def upgrade() -> None:
    op.create_table(
        'canaries',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('experiment_id', sa.Integer(), sa.ForeignKey('experiments.id', ondelete='CASCADE'),
                  nullable=False),
        sa.Column('run_id', sa.Integer(), sa.ForeignKey('runs.id', ondelete='CASCADE'), nullable=False),
        sa.Column('key', sa.String(length=220), nullable=False),
        sa.Column('shape', sa.JSON(), nullable=False),
        sa.Column('spec', sa.JSON(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('gpus', sa.Integer(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('record', sa.JSON(), nullable=True),
        sa.Column('created_by', sa.String(length=128), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('key', name='uq_canary_key'),
        sa.UniqueConstraint('run_id', name='uq_canary_run'),
    )
    op.create_index('ix_canaries_experiment_id', 'canaries', ['experiment_id'])
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON canaries TO {MEMBER}, {SERVICE}")
    op.execute(f"GRANT USAGE, SELECT ON SEQUENCE canaries_id_seq TO {MEMBER}, {SERVICE}")
    op.execute("ALTER TABLE canaries ENABLE ROW LEVEL SECURITY")
    for table, name, command, role, using, check in POLICIES:
        clauses = (f" USING ({using})" if using else "") + (f" WITH CHECK ({check})" if check else "")
        op.execute(f"CREATE POLICY {name} ON {table} FOR {command} TO {role}{clauses}")


def downgrade() -> None:
    op.drop_index('ix_canaries_experiment_id', table_name='canaries')
    op.drop_table('canaries')
