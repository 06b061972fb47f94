"""Who is acting: known from the ledger's connection, not declared.

On PostgreSQL the actor is the database role of the connection (`session_user`), authenticated as
the site configures it (peer, password, certificate). On SQLite (one person's ledger) it is the OS
user of the process (its effective uid, not $USER). `GGPO_USER` may name someone else only where
that identity may act for others: a member of the `ggpo_service` group role (the role the workers
run as), the role that owns the ledger's tables (the one that ran `db upgrade`; it bypasses
row-level security anyway) or a superuser; on SQLite, the owner of the ledger file or root (who can
write the file by hand anyway). Anyone else naming someone else is refused (exit 6): a changed
GGPO_USER no longer escapes a per-user cap or a permission.

The group roles of a team ledger are named here and created by migration 0006, which also holds
the grants and row-level security policies that enforce what each may do (docs/operator.md: Roles and
permissions).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..common.limits import USER_MAX
from ..errors import NotPermitted
from .settings import os_user

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from .settings import Settings

# The group roles of a team ledger (PostgreSQL): what a login role is granted decides what it may do.
MEMBER_ROLE = "ggpo_member"  # enqueue, cancel, retry, decide on one's own experiments; read everything
LEAD_ROLE = "ggpo_lead"  # a member who may also act on the experiments of their teams' members
SERVICE_ROLE = "ggpo_service"  # the workers: every run's transitions, and acting for others
TEAM_MARKER_ROLE = "ggpo_team"  # a team is a NOLOGIN role that is a member of this one
GROUP_ROLES = (MEMBER_ROLE, LEAD_ROLE, SERVICE_ROLE, TEAM_MARKER_ROLE)


@dataclass(frozen=True)
class Identity:
    """The actor of this process's transitions and how it was established."""

    user: str  # recorded as actor, created_by, submitted_by, decided_by
    login: str  # who authenticated: the PostgreSQL role, or the OS user
    acts_for_others: bool  # may name someone else with GGPO_USER
    how: str  # "PostgreSQL role" | "OS user"


def acting(user: str, via: str) -> str:
    """The actor of a transition made by `user` through a process of theirs (`reconcile`, a worker's
    reconcile, cron): `user (via)`. Row-level security lets a member write an actor that is
    exactly their role, or starts with it followed by ` (`."""
    label = f"{user} ({via})"
    return label if len(label) <= USER_MAX else user


# One round trip; nothing of it depends on the ledger's migrations (an older ledger, an empty database).
_PG_IDENTITY = """
SELECT session_user AS login,
       r.rolsuper AS superuser,
       CASE WHEN to_regrole(:service) IS NULL THEN false
            ELSE pg_has_role(session_user, :service, 'MEMBER') END AS service,
       CASE WHEN to_regclass('runs') IS NULL THEN false
            ELSE pg_has_role(session_user, (SELECT relowner FROM pg_class WHERE oid = to_regclass('runs')),
                             'MEMBER') END AS owner
FROM pg_roles r WHERE r.rolname = session_user
"""


def established(engine: Engine) -> tuple[str, bool, str]:
    """(login, may act for others, how) of the connection `engine` makes."""
    if engine.dialect.name == "postgresql":
        from sqlalchemy import text

        with engine.connect() as conn:
            row = conn.execute(text(_PG_IDENTITY), {"service": SERVICE_ROLE}).one()
        return row.login, bool(row.superuser or row.service or row.owner), "PostgreSQL role"
    database = engine.url.database
    if not database or database == ":memory:":
        return os_user(), True, "OS user"
    path = Path(database).expanduser()
    try:
        owner = path.stat().st_uid
    except FileNotFoundError:  # this process creates it: it will be its owner
        owner = os.geteuid()
    except OSError:
        owner = -1
    return os_user(), os.geteuid() in (owner, 0), "OS user"


def resolve(engine: Engine, settings: Settings) -> Identity:
    """The identity this process acts as on the ledger of `engine`; NotPermitted (exit 6) if
    GGPO_USER names someone else and this login may not act for others."""
    login, may, how = established(engine)
    if settings.inline_queue and not may and how == "PostgreSQL role":
        # memory:// runs the jobs in this process, as this member: the writes only a worker may make
        # (attempts, results) would be refused half-way, or made under a member's name.
        raise NotPermitted(f"using GGPO_REDIS_URL=memory:// as the PostgreSQL role {login!r} on a team ledger",
                           "its jobs would run as you, not as a worker; set GGPO_REDIS_URL to the team's Redis")
    declared = settings.user if settings.user_declared else None
    if declared is None or declared == login:
        return Identity(login, login, may, how)
    if may:
        return Identity(declared, login, may, how)
    if how == "OS user":
        why = (f"on this SQLite ledger you are the OS user {login!r}: only the ledger file's owner (or root) may "
               f"name someone else")
    else:
        why = (f"you are the PostgreSQL role {login!r}, which may act only as itself (members of "
               f"{SERVICE_ROLE}, the ledger's owner and superusers may act for others)")
    raise NotPermitted(f"acting as {declared!r} (GGPO_USER)", f"{why}; unset GGPO_USER")
