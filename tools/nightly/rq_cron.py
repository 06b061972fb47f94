"""RQ cron config for the nightly CPU tier: `rq cron --url redis://HOST:6379/DB $PWD/tools/nightly/rq_cron.py`.

RQ loads this file and runs the jobs it registers on their cron schedule. This file is the edge
where the operator's environment is read: GGPO_NIGHTLY_SUITE (a .toml file or a suite name looked up
like a profile; default nightly-cpu, the packaged suite) and
GGPO_NIGHTLY_OUTPUT (default results/nightly). Run at most one `rq cron` per suite; if two run,
the job's once-per-night claim makes the second enqueue a no-op.
"""

import os
from pathlib import Path

from ggpo_batch.nightly.schedule import register_cron
from ggpo_batch.nightly.suite import DEFAULT_SUITE, load_suite

_root = Path(__file__).resolve().parents[2]
_suite = load_suite(os.environ.get("GGPO_NIGHTLY_SUITE") or DEFAULT_SUITE)
register_cron(_suite, Path(os.environ.get("GGPO_NIGHTLY_OUTPUT", _root / "results" / "nightly")).resolve())
