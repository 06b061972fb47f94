"""A run's evaluation outcome (`runs.outcome`, JSON): the figures settlement reads from the job's
details file when an attempt succeeds (ggpo_batch/contracts/outcome.py), so the report reads no files.
Runs booked before this revision, and imported runs, have none (NULL).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('outcome', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('outcome')
