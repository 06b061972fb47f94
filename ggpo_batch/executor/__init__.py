"""Executors: where a run's allocation comes from (slurm, local, debug), behind one interface."""
