"""Evaluations after training: one row per succeeded run and outcome-set name (its state, data file,
outcome and record), and `attempts.evaluation_id` naming the evaluation an attempt of kind
`evaluation` spent its GPU-hours on. Older attempts have none (NULL).

Revision ID: 0009
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0005'
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


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.drop_index('ix_attempts_evaluation_id')
        batch.drop_constraint('fk_attempts_evaluation_id', type_='foreignkey')
        batch.drop_column('evaluation_id')
    op.drop_index('ix_evaluations_state', table_name='evaluations')
    op.drop_index('ix_evaluations_run_id', table_name='evaluations')
    op.drop_table('evaluations')
