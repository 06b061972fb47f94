"""The RQ job functions under the path Redis stores: `JOB_FUNC` and `EVALUATION_JOB_FUNC` in
control/queue.py name `ggpo_batch.worker.execute_run` / `.execute_evaluation` (and CANARY_JOB_FUNC `.execute_canary`), and RQ resolves that
string when a worker takes a job, possibly a job queued by an earlier release. The path is part of the
queue's wire format: nothing else belongs in this module, and it does not move.
"""

from .control.worker import execute_canary, execute_evaluation, execute_run

__all__ = ["execute_canary", "execute_evaluation", "execute_run"]
