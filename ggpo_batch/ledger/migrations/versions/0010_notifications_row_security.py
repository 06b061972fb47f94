"""Row-level security on the notifications outbox: a member inserts only what the CLI writes for them
(a notice of their own transition on an experiment they may manage, naming them as its actor); the
service writes and claims any; everyone reads. Before, `notifications` had no policy, so a member
could insert by direct SQL a notification about anyone's experiment (issue 42).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

MEMBER, SERVICE = "ggpo_member", "ggpo_service"
# The kinds a member's own transitions make (notify/kinds.py): a run of theirs moved to failed or lost
# (an imported run), a cost decision on their experiment (or on a name not yet an experiment, as the
# decisions table allows), each naming them as its actor. Observations (hung, finished, nightly) are
# reconcile's, which only the service runs.
MEMBER_KINDS = ("run_failed", "run_lost", "cost_decision")
_OWNS_EXP = "ggpo_may_manage(ggpo_experiment_owner(experiment_id))"
POLICIES = [
    ("notifications", "ggpo_read", "SELECT", "PUBLIC", "true", None),
    ("notifications", "ggpo_service_insert", "INSERT", SERVICE, None, "true"),
    ("notifications", "ggpo_service_update", "UPDATE", SERVICE, "true", "true"),
    ("notifications", "ggpo_member_insert", "INSERT", MEMBER, None,
     (f"kind IN ({', '.join(repr(k) for k in MEMBER_KINDS)}) "
      f"AND ggpo_is_me(coalesce(fields ->> 'actor', fields ->> 'decided_by')) "
      f"AND ((experiment_id IS NOT NULL AND {_OWNS_EXP}) OR (experiment_id IS NULL AND kind = 'cost_decision'))")),
    ("notification_deliveries", "ggpo_read", "SELECT", "PUBLIC", "true", None),
    ("notification_deliveries", "ggpo_service_insert", "INSERT", SERVICE, None, "true"),
    ("notification_deliveries", "ggpo_service_update", "UPDATE", SERVICE, "true", "true"),
]
TABLES = ("notifications", "notification_deliveries")


def upgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    for table, name, command, role, using, check in POLICIES:
        clauses = (f" USING ({using})" if using else "") + (f" WITH CHECK ({check})" if check else "")
        op.execute(f"CREATE POLICY {name} ON {table} FOR {command} TO {role}{clauses}")


def downgrade() -> None:
    if op.get_bind().dialect.name != 'postgresql':
        return
    for table, name, *_ in POLICIES:
        op.execute(f"DROP POLICY IF EXISTS {name} ON {table}")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
