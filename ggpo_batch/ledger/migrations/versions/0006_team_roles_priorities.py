"""A team on one ledger: run priorities, the index the cost view reads, and, on PostgreSQL, the
group roles, grants and row-level security that decide who may do what (docs/operator.md: Roles and
permissions).

- `runs.priority` (high | normal | low; existing runs normal) and `ix_attempts_booked_at`.
- PostgreSQL only: the NOLOGIN group roles `ggpo_member`, `ggpo_lead` (a member of ggpo_member),
  `ggpo_service` and `ggpo_team` (a team is a role that is a member of it), created if absent (this
  needs CREATEROLE once; roles are the cluster's, so a downgrade leaves them); functions the
  policies call, and `ggpo_changed`, which refuses a transition whose UPDATE row-level security
  silently filtered to no row (ledger/core.py `commit_after`); grants; and row-level security on
  every ledger table:
  - every role granted SELECT (a group role, or a reader granted SELECT alone) reads every row;
  - a member inserts experiments as themself, runs, events and decisions of their own experiments
    (a lead: also their teams' members'), events whose actor is themself, and moves those runs
    only to queued, cancelled or not_reproduced (retry, cancel, decide), through the columns
    those moves change; attempts only of an imported experiment of theirs, or a `submitting` one
    cancelled; nothing is deleted, and no event is ever updated or deleted (append-only);
  - a service does every transition of every run, as anyone (acting for others), but still
    never updates or deletes an event.
  The owner of the tables (who runs `db upgrade`) and superusers bypass row-level security.
  SQLite has no roles: nothing of this applies there.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

MEMBER, LEAD, SERVICE, TEAM = "ggpo_member", "ggpo_lead", "ggpo_service", "ggpo_team"  # ggpo_batch/config/identity.py
TABLES = ("experiments", "runs", "attempts", "events", "decisions", "artifacts", "component_runs")

# The moves a member's runs may make, and the columns those moves write (ledger/runs.py, costs.py).
MEMBER_RUN_STATES = "('queued', 'cancelled', 'not_reproduced')"
MEMBER_UPDATE_COLUMNS = {
    "runs": "state, cause, worker, updated_at",
    "attempts": "state, ended_at",  # a `submitting` attempt cancelled with its run
    "component_runs": "state, record, seconds, commit, dirty, error, finished_at",  # `nightly`
}

FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION ggpo_acts_for_others() RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT pg_has_role(session_user, '{SERVICE}', 'MEMBER')
$$;
CREATE OR REPLACE FUNCTION ggpo_is_me(who text) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT who = session_user OR starts_with(who, session_user || ' (')
$$;
CREATE OR REPLACE FUNCTION ggpo_may_manage(owner text) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT owner = session_user OR ggpo_acts_for_others() OR (
    pg_has_role(session_user, '{LEAD}', 'MEMBER') AND EXISTS (
      SELECT 1 FROM pg_auth_members mine
      JOIN pg_auth_members theirs ON theirs.roleid = mine.roleid
      JOIN pg_auth_members team ON team.member = mine.roleid
      WHERE mine.member = (SELECT oid FROM pg_roles WHERE rolname = session_user)
        AND theirs.member = (SELECT oid FROM pg_roles WHERE rolname = owner)
        AND team.roleid = (SELECT oid FROM pg_roles WHERE rolname = '{TEAM}')))
$$;
CREATE OR REPLACE FUNCTION ggpo_experiment_owner(experiment integer) RETURNS text LANGUAGE sql STABLE AS $$
  SELECT created_by FROM experiments WHERE id = experiment
$$;
CREATE OR REPLACE FUNCTION ggpo_experiment_source(experiment integer) RETURNS text LANGUAGE sql STABLE AS $$
  SELECT source FROM experiments WHERE id = experiment
$$;
CREATE OR REPLACE FUNCTION ggpo_run_experiment(run integer) RETURNS integer LANGUAGE sql STABLE AS $$
  SELECT experiment_id FROM runs WHERE id = run
$$;
CREATE OR REPLACE FUNCTION ggpo_changed(n bigint, what text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  IF n <> 1 THEN
    RAISE EXCEPTION 'ggpo: % changed % rows, not 1: row-level security does not let this role change it', what, n
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN n;
END $$;
"""
FUNCTION_NAMES = ("ggpo_acts_for_others()", "ggpo_is_me(text)", "ggpo_may_manage(text)",
                  "ggpo_experiment_owner(integer)", "ggpo_experiment_source(integer)", "ggpo_run_experiment(integer)",
                  "ggpo_changed(bigint, text)")

_OWNS_EXP = "ggpo_may_manage(ggpo_experiment_owner(experiment_id))"
_OWNS_RUN = "ggpo_may_manage(ggpo_experiment_owner(ggpo_run_experiment(run_id)))"
# (table, policy, command, role, USING, WITH CHECK)
POLICIES = [
    # whoever is granted SELECT (a group role, or a reader granted SELECT alone) reads every row
    *((t, "ggpo_read", "SELECT", "PUBLIC", "true", None) for t in TABLES),
    *((t, "ggpo_service_insert", "INSERT", SERVICE, None, "true") for t in TABLES),
    *((t, "ggpo_service_update", "UPDATE", SERVICE, "true", "true") for t in TABLES if t != "events"),
    ("experiments", "ggpo_member_insert", "INSERT", MEMBER, None, "created_by = session_user"),
    ("runs", "ggpo_member_insert", "INSERT", MEMBER, None,
     (f"{_OWNS_EXP} AND (ggpo_experiment_source(experiment_id) = 'import' OR "
      f"(state IN ('queued', 'not_reproduced') AND result IS NULL AND outcome IS NULL))")),
    ("runs", "ggpo_member_update", "UPDATE", MEMBER, _OWNS_EXP, f"{_OWNS_EXP} AND state IN {MEMBER_RUN_STATES}"),
    ("attempts", "ggpo_member_insert", "INSERT", MEMBER, None,
     f"{_OWNS_RUN} AND ggpo_experiment_source(ggpo_run_experiment(run_id)) = 'import'"),
    ("attempts", "ggpo_member_update", "UPDATE", MEMBER, f"{_OWNS_RUN} AND state = 'submitting'",
     f"{_OWNS_RUN} AND state = 'cancelled'"),
    ("events", "ggpo_member_insert", "INSERT", MEMBER, None,
     f"ggpo_is_me(actor) AND (run_id IS NULL OR {_OWNS_RUN}) AND (experiment_id IS NULL OR {_OWNS_EXP})"),
    ("decisions", "ggpo_member_insert", "INSERT", MEMBER, None,
     f"ggpo_is_me(decided_by) AND (experiment_id IS NULL OR {_OWNS_EXP})"),
    ("artifacts", "ggpo_member_insert", "INSERT", MEMBER, None, f"run_id IS NULL OR {_OWNS_RUN}"),
    ("component_runs", "ggpo_member_insert", "INSERT", MEMBER, None, "ggpo_is_me(actor)"),
    ("component_runs", "ggpo_member_update", "UPDATE", MEMBER, "ggpo_is_me(actor)", "ggpo_is_me(actor)"),
]

# Created once per cluster; two databases upgraded at once may race to create one: the loser's
# error is caught and the role (made by the other) checked for.
ROLES = f"""
DO $$
DECLARE r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['{MEMBER}', '{LEAD}', '{SERVICE}', '{TEAM}'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
      BEGIN
        EXECUTE format('CREATE ROLE %I NOLOGIN', r);
      EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;
      END;
    END IF;
  END LOOP;
  IF NOT EXISTS (SELECT 1 FROM pg_auth_members WHERE roleid = '{MEMBER}'::regrole AND member = '{LEAD}'::regrole) THEN
    BEGIN
      GRANT {MEMBER} TO {LEAD};
    EXCEPTION WHEN OTHERS THEN
      IF NOT EXISTS (SELECT 1 FROM pg_auth_members WHERE roleid = '{MEMBER}'::regrole
                     AND member = '{LEAD}'::regrole) THEN
        RAISE;
      END IF;
    END;
  END IF;
END $$;
"""


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('priority', sa.String(8), nullable=False, server_default='normal'))
    op.create_index('ix_attempts_booked_at', 'attempts', [sa.text('coalesce(ended_at, created_at)')])
    if op.get_bind().dialect.name != 'postgresql':
        return
    op.execute(ROLES)
    op.execute(FUNCTIONS)
    schema = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar()
    op.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO {MEMBER}, {SERVICE}')
    op.execute(f"GRANT SELECT ON alembic_version TO {MEMBER}, {SERVICE}")
    for table in TABLES:
        op.execute(f"GRANT SELECT, INSERT ON {table} TO {MEMBER}, {SERVICE}")
        if table != "events":  # append-only, for everyone
            op.execute(f"GRANT UPDATE ON {table} TO {SERVICE}")
        if table in MEMBER_UPDATE_COLUMNS:
            op.execute(f"GRANT UPDATE ({MEMBER_UPDATE_COLUMNS[table]}) ON {table} TO {MEMBER}")
        sequence = op.get_bind().execute(sa.text("SELECT pg_get_serial_sequence(:t, 'id')"), {"t": table}).scalar()
        if sequence:
            op.execute(f"GRANT USAGE, SELECT ON SEQUENCE {sequence} TO {MEMBER}, {SERVICE}")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    for table, name, command, role, using, check in POLICIES:
        clauses = (f" USING ({using})" if using else "") + (f" WITH CHECK ({check})" if check else "")
        op.execute(f"CREATE POLICY {name} ON {table} FOR {command} TO {role}{clauses}")


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        for table, name, *_ in POLICIES:
            op.execute(f"DROP POLICY IF EXISTS {name} ON {table}")
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
            op.execute(f"REVOKE ALL ON {table} FROM {MEMBER}, {SERVICE}")
            sequence = op.get_bind().execute(sa.text("SELECT pg_get_serial_sequence(:t, 'id')"),
                                             {"t": table}).scalar()
            if sequence:
                op.execute(f"REVOKE ALL ON SEQUENCE {sequence} FROM {MEMBER}, {SERVICE}")
        op.execute(f"REVOKE ALL ON alembic_version FROM {MEMBER}, {SERVICE}")
        schema = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar()
        op.execute(f'REVOKE USAGE ON SCHEMA "{schema}" FROM {MEMBER}, {SERVICE}')
        for function in FUNCTION_NAMES:
            op.execute(f"DROP FUNCTION IF EXISTS {function}")
    op.drop_index('ix_attempts_booked_at', table_name='attempts')
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('priority')
