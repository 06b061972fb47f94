"""One night of the suite, recorded in the ledger: for each method, claim (method, tier, night)
(the once-per-night guard: a unique row), run the tier, write the JSON artifact, record its path
and sha256 and finish the component-run row with the record. A failure finishes the row as
failed with its error and is not retried.

Shared by the RQ job (`schedule.nightly_job`), `ggpo-batch nightly` and the cron/systemd script
(`python -m ggpo_batch.nightly.night`), so every path leaves the same ledger trail.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from ..errors import GgpoError
from .suite import DEFAULT_SUITE, Suite, load_suite

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MethodNight:
    """What happened to one method on one night."""

    method: str
    night: str
    ran: bool
    component_run_id: int | None
    artifact: str | None = None
    artifact_sha256: str | None = None
    seconds: float | None = None
    claimed_by: str | None = None  # when not ran: who holds the night


def artifact_path(output_dir: Path, night: date, method: str, seeds: Sequence[int]) -> Path:
    seeds_part = f"seeds{min(seeds)}-{max(seeds)}" if len(seeds) > 1 else f"seed{seeds[0]}"
    return output_dir / night.isoformat() / f"component-{method}-cpu-{seeds_part}.json"


def run_method_night(ledger: Any, *, suite: Suite, method: str, night: date, actor: str, command: str,
                     output: Path, seeds: Sequence[int] | None = None, corpus: Path | None = None,
                     corpus_sha256: str | None = None,
                     full_experiment: Mapping[str, Any] | None = None) -> MethodNight:
    """Claim, run, write and record one method's tier for `night`; skipped if the night is taken.

    A bad corpus (missing, oversized, wrong sha256) or an unknown method is refused before the
    claim, so a mistyped manual run cannot use up a night.
    """
    from ..contracts.code_provenance import sha256_path
    from .corpus import load_corpus
    from .runner import (  # torch is imported only where the tier really runs
        METHODS,
        run_nightly,
    )

    if method not in METHODS:
        raise GgpoError(f"--methods: unknown method {method!r} (known: {', '.join(sorted(METHODS))})")
    load_corpus(suite.corpus, path=corpus, expected_sha256=corpus_sha256)
    cr = ledger.claim_night(method=method, tier=suite.tier, night=night.isoformat(), actor=actor)
    if cr is None:
        holder = next((r for r in ledger.component_runs(method=method, limit=100)
                       if r.night == night.isoformat() and r.tier == suite.tier), None)
        log.info("%s %s night %s already claimed (%s); not running again", method, suite.tier, night,
                 holder.actor if holder else "?")
        return MethodNight(method=method, night=night.isoformat(), ran=False,
                           component_run_id=holder.id if holder else None,
                           claimed_by=f"{holder.actor} ({holder.state})" if holder else None)
    try:
        rec = run_nightly(seeds=seeds or suite.seeds, methods=[method], corpus=corpus, corpus_sha256=corpus_sha256,
                          output=output, command=command, full_experiment=full_experiment, suite=suite)
        assert isinstance(rec, dict)
        sha = sha256_path(output)
        ledger.record_artifact(path=str(output), sha256=sha, size_bytes=output.stat().st_size,
                               kind="component_record", component_run_id=cr.id)
        prov = rec["provenance"]
        ledger.finish_component_run(cr.id, state="succeeded", record=rec, seconds=rec["timing"]["tier_seconds"],
                                    commit=prov["commit"], dirty=prov["uncommitted_source_at_cpu_run"])
    except BaseException as exc:
        message = exc.message if isinstance(exc, GgpoError) else f"{type(exc).__name__}: {exc}"
        ledger.finish_component_run(cr.id, state="failed", record=None, seconds=None, commit=None, dirty=None,
                                    error=message[:2000])
        raise
    return MethodNight(method=method, night=night.isoformat(), ran=True, component_run_id=cr.id,
                       artifact=str(output), artifact_sha256=sha, seconds=rec["timing"]["tier_seconds"])


def run_night(ledger: Any, *, suite: Suite, output_dir: Path, night: date, actor: str, command: str,
              full_experiment: Mapping[str, Any] | None = None) -> list[MethodNight]:
    """Every method of the suite for `night`, each at its nightly artifact path."""
    return [run_method_night(ledger, suite=suite, method=m, night=night, actor=actor, command=command,
                             output=artifact_path(output_dir, night, m, suite.seeds),
                             full_experiment=full_experiment)
            for m in suite.methods]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the cron/systemd alternative; settings (ledger URL) come from the environment."""
    from ..config.identity import acting, resolve
    from ..config.logs import configure_logging
    from ..config.settings import load_settings
    from ..ledger import connect

    ap = argparse.ArgumentParser(description="Run one night of the nightly CPU suite (no queue).")
    ap.add_argument("--suite", default=DEFAULT_SUITE, help="a .toml file, or a suite name looked up like a profile")
    ap.add_argument("--output-dir", type=Path, required=True)
    ap.add_argument("--night", type=date.fromisoformat, default=datetime.now(UTC).date())
    args = ap.parse_args(argv)
    settings = load_settings()
    configure_logging(text_format="%(asctime)s %(name)s %(message)s", fmt=settings.log_format)
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "ggpo_batch.nightly.night",
                                                *(argv if argv is not None else sys.argv[1:])])
    try:
        ledger = connect(settings.db_url)
        done = run_night(ledger, suite=load_suite(args.suite), output_dir=args.output_dir, night=args.night,
                         actor=acting(resolve(ledger.engine, settings).user, "cron"), command=command)
    except GgpoError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    for d in done:
        print(f"{d.method} {d.night}: " + (f"{d.artifact} ({d.seconds:.2f} s)" if d.ran
                                           else f"already claimed by {d.claimed_by}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
