"""Experiment specs and everything checkable before queueing: the parser (`parse`), the spec type
(`experiment`), defaults taken from the model, the allocation's size (`sizing`), `preflight`, the
evaluation requests' checks and `init`'s starter. The names below keep
`from ggpo_batch.spec import load_spec` working.
"""

from .experiment import ExperimentSpec, Overheads
from .parse import load_spec, parse_spec, spec_diff

__all__ = ["ExperimentSpec", "Overheads", "load_spec", "parse_spec", "spec_diff"]
