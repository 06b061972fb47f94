"""Index runs by (experiment, arm, state, estimated GPU-hours): `status` totals are read from the
index alone, without the rows' JSON, so they cost the same at 100,000 runs as at 1,000.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_runs_status_totals', 'runs', ['experiment_id', 'arm', 'state', 'estimated_gpu_hours'])


def downgrade() -> None:
    op.drop_index('ix_runs_status_totals', table_name='runs')
