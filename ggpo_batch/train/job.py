"""The training job under its path before the package layout (train/run/job.py now): submitit pickles
the job object into the attempt folder by module path, and a Slurm job submitted by an earlier release
unpickles `ggpo_batch.train.job.TrainingJob` when it starts or is requeued. Only re-exports; kept one
release, until no attempt of an older release can still start (squeue shows none).
"""

from .run.job import TrainingJob, preload

__all__ = ["TrainingJob", "preload"]
