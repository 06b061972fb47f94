"""The evaluation job under its path before the package layout (train/run/eval_job.py now), for the
submitit pickles of attempts submitted by an earlier release (see train/job.py). Only re-exports.
"""

from .run.eval_job import EvaluationJob

__all__ = ["EvaluationJob"]
