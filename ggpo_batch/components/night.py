"""One night of the suite: every method's tier, each record written to its nightly artifact path.

Shared by the RQ job (`schedule.nightly_job`) and the cron/systemd script
(`python -m ggpo_batch.components.night`), so both paths produce the same artifacts.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from .suite import DEFAULT_SUITE, Suite, load_suite

log = logging.getLogger(__name__)


def artifact_path(output_dir: Path, night: date, method: str, seeds: Sequence[int]) -> Path:
    seeds_part = f"seeds{min(seeds)}-{max(seeds)}" if len(seeds) > 1 else f"seed{seeds[0]}"
    return output_dir / night.isoformat() / f"component-{method}-cpu-{seeds_part}.json"


def run_night(suite: Suite, output_dir: Path, night: date, command: str) -> list[tuple[Path, dict[str, Any]]]:
    """Run each method of `suite` once; returns (artifact path, record) per method."""
    from .nightly import run_nightly  # torch is imported only where the tier really runs

    done = []
    for method in suite.methods:
        out = artifact_path(output_dir, night, method, suite.seeds)
        rec = run_nightly(seeds=suite.seeds, methods=[method], corpus=None, corpus_sha256=None, output=out,
                          command=command, suite=suite)
        assert isinstance(rec, dict)
        done.append((out, rec))
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run one night of the nightly CPU suite (no queue).")
    ap.add_argument("--suite", type=Path, default=DEFAULT_SUITE)
    ap.add_argument("--output-dir", type=Path, required=True)
    ap.add_argument("--night", type=date.fromisoformat, default=datetime.now(timezone.utc).date())
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "ggpo_batch.components.night",
                                                *(argv if argv is not None else sys.argv[1:])])
    for out, rec in run_night(load_suite(args.suite), args.output_dir, args.night, command):
        print(f"{rec['method']}: {out} ({rec['timing']['tier_seconds']:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
