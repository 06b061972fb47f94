"""The notifications outbox: `notifications`, one row per event to tell people about (written in
the transaction of the transition it reports, or by reconcile for what it observes; its dedupe key
unique, so each event is recorded once), and `notification_deliveries`, each one's tries and
outcome per sink (a webhook, an e-mail relay). ggpo_batch/notify/ delivers them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'notifications',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('dedupe_key', sa.String(255), nullable=False),
        sa.Column('key', sa.String(255), nullable=False),
        sa.Column('kind', sa.String(32), nullable=False),
        sa.Column('subject', sa.Text(), nullable=False),
        sa.Column('fields', sa.JSON(), nullable=False),
        sa.Column('experiment_id', sa.Integer(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('next_try_at', sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint('dedupe_key', name='uq_notifications_dedupe_key'),
    )
    op.create_index('ix_notifications_experiment_id', 'notifications', ['experiment_id'])
    op.create_index('ix_notifications_next_try_at', 'notifications', ['next_try_at'])
    op.create_table(
        'notification_deliveries',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('notification_id', sa.Integer(), sa.ForeignKey('notifications.id', ondelete='CASCADE'),
                  nullable=False),
        sa.Column('sink', sa.String(64), nullable=False),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('tries', sa.Integer(), nullable=False),
        sa.Column('next_try_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint('notification_id', 'sink', name='uq_delivery_notification_sink'),
    )
    op.create_index('ix_deliveries_sink_state', 'notification_deliveries', ['sink', 'state'])
    if op.get_bind().dialect.name == 'postgresql':
        _grant()


# The team's group roles (migration 0006, ggpo_batch/config/identity.py): a member's transition (a cancel, a
# decision) writes its notification in the same transaction, and anyone may read the outbox; the
# service (reconcile) records what it observes and delivers.
MEMBER, SERVICE = "ggpo_member", "ggpo_service"


def _grant() -> None:
    op.execute(f"GRANT SELECT, INSERT ON notifications TO {MEMBER}, {SERVICE}")
    op.execute(f"GRANT UPDATE ON notifications TO {SERVICE}")
    op.execute(f"GRANT SELECT ON notification_deliveries TO {MEMBER}, {SERVICE}")
    op.execute(f"GRANT INSERT, UPDATE ON notification_deliveries TO {SERVICE}")
    for table in ('notifications', 'notification_deliveries'):
        sequence = op.get_bind().execute(sa.text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": table}).scalar()
        if sequence:
            op.execute(f"GRANT USAGE, SELECT ON SEQUENCE {sequence} TO {MEMBER}, {SERVICE}")


def downgrade() -> None:
    op.drop_index('ix_deliveries_sink_state', table_name='notification_deliveries')
    op.drop_table('notification_deliveries')
    op.drop_index('ix_notifications_next_try_at', table_name='notifications')
    op.drop_index('ix_notifications_experiment_id', table_name='notifications')
    op.drop_table('notifications')
