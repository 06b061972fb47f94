"""An attempt's last heartbeat (ggpo_batch/contracts/heartbeat.py): step, loop seconds of the budget, mean
reward, tokens/s and the time the job wrote it, copied by reconcile while the attempt runs, so
`status` shows progress and flags a job whose heartbeat stopped. Older attempts have none (NULL).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

_COLUMNS = (('heartbeat_step', sa.Integer()), ('heartbeat_loop_seconds', sa.Float()),
            ('heartbeat_budget_seconds', sa.Float()), ('heartbeat_mean_reward', sa.Float()),
            ('heartbeat_tokens_per_second', sa.Float()), ('heartbeat_at', sa.DateTime(timezone=True)))


def upgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        for name, type_ in _COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch:
        for name, _type in reversed(_COLUMNS):
            batch.drop_column(name)
