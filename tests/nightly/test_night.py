from __future__ import annotations

import hashlib
import json
from datetime import date
from pathlib import Path

import pytest

from ggpo_batch.nightly import ggpo_tier
from ggpo_batch.nightly import runner as nightly
from ggpo_batch.nightly.night import artifact_path, run_method_night, run_night
from ggpo_batch.nightly.suite import load_suite
from ggpo_batch.errors import GgpoError

NIGHT = date(2026, 12, 1)


@pytest.mark.slow
def test_night_is_recorded_once_with_its_artifact(nightly_ledger, tiny_suite_path: Path, tmp_path: Path):
    suite = load_suite(tiny_suite_path)
    [done] = run_night(nightly_ledger, suite=suite, output_dir=tmp_path / "out", night=NIGHT, actor="t", command="c")
    out = artifact_path(tmp_path / "out", NIGHT, "ggpo", suite.seeds)
    assert done.ran and done.artifact == str(out) and out.name == "component-ggpo-cpu-seeds1-2.json"
    assert done.artifact_sha256 == hashlib.sha256(out.read_bytes()).hexdigest()
    [row] = nightly_ledger.component_runs()
    assert (row.method, row.tier, row.night, row.state) == ("ggpo", "l1_mechanism", "2026-12-01", "succeeded")
    assert row.record == json.loads(out.read_text()) and row.commit == row.record["provenance"]["commit"]
    [art] = nightly_ledger.artifacts(component_run_id=row.id)
    assert (art.path, art.sha256, art.size_bytes, art.kind) == (str(out), done.artifact_sha256,
                                                                 out.stat().st_size, "component_record")
    [again] = run_night(nightly_ledger, suite=suite, output_dir=tmp_path / "out", night=NIGHT, actor="u", command="c")
    assert not again.ran and again.component_run_id == row.id and again.claimed_by == "t (succeeded)"
    assert len(nightly_ledger.component_runs()) == 1 and len(nightly_ledger.artifacts()) == 1


def test_bad_corpus_is_refused_before_the_claim(nightly_ledger, tiny_suite_path: Path, tmp_path: Path):
    suite = load_suite(tiny_suite_path)
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"some corpus text\n" * 500)
    with pytest.raises(GgpoError, match="expected 0{64}"):
        run_method_night(nightly_ledger, suite=suite, method="ggpo", night=NIGHT, actor="t", command="c",
                         output=tmp_path / "x.json", corpus=corpus, corpus_sha256="0" * 64)
    with pytest.raises(GgpoError, match="unknown method 'sif'"):
        run_method_night(nightly_ledger, suite=suite, method="sif", night=NIGHT, actor="t", command="c",
                         output=tmp_path / "x.json")
    assert nightly_ledger.component_runs() == []


def test_a_failing_tier_stays_failed_and_is_not_retried(nightly_ledger, tiny_suite_path: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    suite = load_suite(tiny_suite_path)

    def broken(*args, **kwargs):
        raise RuntimeError("tier exploded")

    monkeypatch.setitem(nightly.METHODS, "ggpo", (broken, nightly.METHODS["ggpo"][1]))
    with pytest.raises(RuntimeError, match="tier exploded"):
        run_night(nightly_ledger, suite=suite, output_dir=tmp_path, night=NIGHT, actor="t", command="c")
    [row] = nightly_ledger.component_runs()
    assert row.state == "failed" and row.error == "RuntimeError: tier exploded" and row.record is None
    monkeypatch.setitem(nightly.METHODS, "ggpo", (ggpo_tier.run_seed, nightly.METHODS["ggpo"][1]))
    [again] = run_night(nightly_ledger, suite=suite, output_dir=tmp_path, night=NIGHT, actor="t", command="c")
    assert not again.ran and again.claimed_by == "t (failed)"
