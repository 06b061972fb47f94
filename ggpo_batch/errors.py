"""One exception hierarchy. The CLI prints a GgpoError as one line and exits with its code;
anything else reaching the user is a bug and keeps its traceback."""

from __future__ import annotations

# The exit codes of every command: their one home (docs/reference/commands.md is generated from it).
EXIT_DONE = 0
EXIT_FAILED = 1  # click's own for a ClickException
EXIT_BAD_INPUT = 2
EXIT_OVER_CAP = 3
EXIT_UNAVAILABLE = 4
EXIT_NOTHING_YET = 5
EXIT_NOT_PERMITTED = 6
EXIT_CODES: dict[int, str] = {
    EXIT_DONE: "done",
    EXIT_FAILED: "the work itself failed",
    EXIT_BAD_INPUT: "bad input: one line naming the file, the field and what is wrong; no traceback; nothing written",
    EXIT_OVER_CAP: "over a GPU-hour cap: recorded as a `not_reproduced_high_cost` decision, nothing queued "
                   "(`--accept-cost --reason` overrides)",
    EXIT_UNAVAILABLE: "a service (database, Redis) is unreachable, or the ledger cannot be used; try again later",
    EXIT_NOTHING_YET: "nothing to show yet (`logs` of an attempt that has no log yet)",
    EXIT_NOT_PERMITTED: "not permitted: a writing command on a ledger that is read-only to you, acting as someone "
                        "else, or on another person's experiment on a team ledger; refused before it does anything",
}


class GgpoError(Exception):
    """A failure with a message meant for the user."""

    exit_code = EXIT_BAD_INPUT

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

    exit_code = EXIT_UNAVAILABLE


class CostCapExceeded(GgpoError):
    """A spec's estimated GPU-hours are over a cap; nothing was queued."""

    exit_code = EXIT_OVER_CAP


class NotPermitted(GgpoError):
    """Something the user may not do (write a ledger that is read-only to them; later, act outside
    their team's grants), refused before anything changed: exit 6. The message says what was
    refused and why, in one line: "not permitted: <what>, <why>"."""

    exit_code = EXIT_NOT_PERMITTED

    def __init__(self, what: str, why: str) -> None:
        self.what = what
        self.why = why
        super().__init__(f"not permitted: {what}, {why}")
