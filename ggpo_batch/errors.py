"""One exception hierarchy. The CLI prints a GgpoError as one line and exits with its code;
anything else reaching the user is a bug and keeps its traceback."""

from __future__ import annotations


class GgpoError(Exception):
    """A failure with a message meant for the user."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(GgpoError):
    """Bad configuration from the environment or a secrets file."""


class SpecError(GgpoError):
    """An experiment spec (TOML) that cannot be used: names the file and the field."""

    def __init__(self, path: object, field: str, problem: str) -> None:
        self.path = str(path)
        self.field = field
        self.problem = problem
        where = f"{self.path}: {field}" if field else self.path
        super().__init__(f"{where}: {problem}")


class RecordError(GgpoError):
    """A result record (seed-000 or seed-003 schema) that breaks the schema or an invariant."""


class LedgerError(GgpoError):
    """A ledger operation that is not allowed (bad transition, unknown run, schema behind)."""


class SchemaBehindError(LedgerError):
    """The database schema is older than this code; the message says what to run."""


class QueueError(GgpoError):
    """Redis/RQ unavailable or a queue operation refused."""


class ExecutorError(GgpoError):
    """The executor (slurm, local, debug) could not submit or query a job."""


class Unavailable(GgpoError):
    """A service or a file the ledger needs cannot be used (unreachable, read-only, damaged): exit 4."""

    exit_code = 4


class CostCapExceeded(GgpoError):
    """A spec's estimated GPU-hours are over a cap; nothing was queued."""

    exit_code = 3


class NotPermitted(GgpoError):
    """The system does not permit this (a file this user may not read): exit 6."""

    exit_code = 6
