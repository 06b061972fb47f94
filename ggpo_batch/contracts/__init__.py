"""The vocabulary and the contracts between the job and the control plane: states, priorities, the
GPU-hour formula, the run spec and evaluation spec that go on the queue, and the files a job writes into
its attempt folder (record, heartbeat, curve, provenance). Plain data, no behaviour above it.
"""
