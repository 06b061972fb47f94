"""What the tests share besides fixtures (fixtures stay in the conftest.py files).

- `paths`: the checkout's own paths, and the two reference records in tests/data.
- `services`: the Redis db and PostgreSQL helpers, per pytest-xdist worker.
- `waiting`: polling until something holds (`wait_until`, `reconcile_until_ended`).
- `slurm`: asking the dev Slurm what it did (a counting command runner, squeue/sacct helpers).
- `slurm_jobs`: the small callables Slurm tests run inside allocations, pickled by value.
- `specs`: writing experiment specs for tests.
- `workers`: a real `ggpo-batch worker` subprocess that can be SIGKILLed.
"""
