"""The control plane: a spec into the ledger and onto the RQ queue (`enqueue`, `queue`), the worker
that submits runs (`worker`), the ledger kept in step with the executors (`reconcile`), what an
attempt's end means for its run (`settlement`, `continuation`), caps, cancel and retry, gc,
evaluations after training, `ledger import` and progress.
"""
