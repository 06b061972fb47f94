"""Each attempt's provenance (code, environment, hardware, spec hash: ggpo_batch/contracts/provenance.py)
and each run's learning curve, one row per training step (ggpo_batch/contracts/curve.py), both booked by
settlement. Older attempts and runs have none.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

_FIGURES = ('loop_seconds', 'mean_reward', 'kl', 'loss', 'clip_fraction', 'tokens_per_second', 'gradient_norm',
            'mean_length', 'logprob_gap_mean', 'logprob_gap_p99', 'is_weight_mean', 'weight_sync_seconds',
            'probe_gap')


def upgrade() -> None:
    op.create_table(
        'attempt_provenance',
        sa.Column('attempt_id', sa.Integer(), sa.ForeignKey('attempts.id', ondelete='CASCADE'), primary_key=True),
        sa.Column('run_id', sa.Integer(), sa.ForeignKey('runs.id', ondelete='CASCADE'), nullable=False),
        sa.Column('document', sa.JSON(), nullable=False),
        sa.Column('distributions', sa.JSON(), nullable=True),
    )
    op.create_index('ix_attempt_provenance_run_id', 'attempt_provenance', ['run_id'])
    op.create_table(
        'curve_points',
        sa.Column('run_id', sa.Integer(), sa.ForeignKey('runs.id', ondelete='CASCADE'), primary_key=True),
        sa.Column('step', sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column('attempt_id', sa.Integer(), sa.ForeignKey('attempts.id', ondelete='CASCADE'), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=True) for name in _FIGURES),
    )
    if op.get_bind().dialect.name == 'postgresql':
        # The team's roles (migration 0006, ggpo_batch/config/identity.py): settlement (the service) books an
        # attempt's provenance and replaces its run's curve; everyone reads them.
        for table in ('attempt_provenance', 'curve_points'):
            op.execute(f"GRANT SELECT ON {table} TO ggpo_member, ggpo_service")
            op.execute(f"GRANT INSERT, UPDATE, DELETE ON {table} TO ggpo_service")


def downgrade() -> None:
    op.drop_table('curve_points')
    op.drop_index('ix_attempt_provenance_run_id', table_name='attempt_provenance')
    op.drop_table('attempt_provenance')
