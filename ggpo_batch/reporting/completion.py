"""Names the shell completes from the ledger (experiment names, run keys), read through a
read-only engine (`make_engine(reading=True)`: nothing written, no file created beside a SQLite
ledger) with SQLAlchemy Core, so a TAB costs one short query and no ORM import. A ledger that
cannot be read completes nothing: completion never prints an error into the user's shell."""

from __future__ import annotations

import logging

from sqlalchemy import text
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)

# At most this many candidates: a shell lists them all, and a team ledger may hold thousands of runs.
COMPLETIONS_MAX = 200
# A TAB must not hang on an unreachable PostgreSQL for the ledger's usual 10 s connect timeout.
CONNECT_TIMEOUT_S = 2

_QUERIES = {
    "experiment": "SELECT DISTINCT name FROM experiments WHERE name LIKE :prefix ESCAPE '\\' ORDER BY name LIMIT :n",
    "run_key": "SELECT run_key FROM runs WHERE run_key LIKE :prefix ESCAPE '\\' ORDER BY run_key LIMIT :n",
}


def _like_prefix(incomplete: str) -> str:
    escaped = incomplete.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def ledger_names(db_url: str, what: str, incomplete: str) -> list[str]:
    """The `what` ("experiment" or "run_key") values in the ledger at `db_url` that start with
    `incomplete`, sorted; [] when the ledger cannot be read (absent, unreachable, not migrated)."""
    from ..ledger.db import make_engine

    try:
        url = make_url(db_url)
        if url.get_backend_name() == "postgresql" and "connect_timeout" not in url.query:
            db_url = url.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT_S)}).render_as_string(
                hide_password=False)
        engine = make_engine(db_url, pre_ping=False, reading=True)
    except Exception as exc:  # noqa: BLE001  a URL the ledger refuses: nothing to complete
        log.debug("completion: no ledger (%s)", exc)
        return []
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(_QUERIES[what]), {"prefix": _like_prefix(incomplete), "n": COMPLETIONS_MAX})
            return [str(v) for v in rows.scalars()]
    except Exception as exc:  # noqa: BLE001  whatever the ledger's failure, a TAB prints no error
        log.debug("completion: the ledger cannot be read (%s)", exc)
        return []
    finally:
        engine.dispose()
