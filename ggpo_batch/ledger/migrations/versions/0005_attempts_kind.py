"""What an attempt's GPU-hours were spent on: `training` (a run from its start, or a retry) or
`continuation` (the run continued past a time limit in a new allocation, from its checkpoint).
Every existing attempt is training.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.add_column(sa.Column('kind', sa.String(16), nullable=False, server_default='training'))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        batch.drop_column('kind')
