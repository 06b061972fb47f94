"""An evaluation after training of a pretrained-format checkpoint reproduces the training job's own
evaluation: the exported policy reloaded in the training's dtype, its chat template rendered with the
run's keywords (a hybrid template told not to think), retrieval over the run's passages, scored on a
data file holding the very items the training evaluated -- the same sampled answers and rewards."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ggpo_batch.contracts.evaluation_spec import EvaluationSpec, evaluation_key, file_sha256
from ggpo_batch.control.evaluation_jobs import check_evaluation_record
from tests.support.paths import REPO, run_wide_env
from tests.train.hf.conftest import train_table

pytestmark = [pytest.mark.train, pytest.mark.slow]

RUN = """
import sys
from ggpo_batch.train.run.eval_job import EvaluationJob
EvaluationJob(open(sys.argv[1]).read(), sys.argv[2])()
"""


def test_an_evaluation_after_training_reproduces_the_trainings_own(thinking_hf: Path, qa_files: dict[str, Path],  # type: ignore[no-untyped-def]
                                                                    tmp_path: Path) -> None:
    from ggpo_batch.contracts.allocation import details_of
    from ggpo_batch.contracts.runspec import RunSpec
    from ggpo_batch.train.run.launch import train_local
    from tests.support.arms import ARMS

    # sampled answers (two per item, the same seeds): a random tiny policy's greedy turn is often
    # empty, which any prompt would reproduce; its samples differ with the prompt
    table = train_table(thinking_hf, qa_files, eval_size=6, eval_temperature=1.0, eval_samples=2)
    table["model"]["chat_template_kwargs"] = {"enable_thinking": False}
    spec = RunSpec(run_key="hfe-v1-7-paired", experiment="hfe", experiment_version=1, method="ggpo", arm=ARMS["paired"],
                   seed=7, gpus=1, loop_budget_seconds=1.0, executor="local", profile="default", train=table)
    out = tmp_path / "train" / "record.json"
    train_local(spec, out, nproc=1, timeout=600)
    details = json.loads(details_of(out).read_text())
    own = details["evaluation"]["per_item"]
    assert len(own) == 6 and details["trained_item_ids"]
    # the items the training evaluated, as a data file of their own (their lines of the eval file)
    wanted = {r["item_id"] for r in own}
    lines = [line for line in qa_files["eval"].read_text().splitlines() if json.loads(line)["id"] in wanted]
    data = tmp_path / "again.jsonl"
    data.write_text("\n".join(lines) + "\n")
    ev = EvaluationSpec(key=evaluation_key(spec.run_key, "again"), name="again", run_key=spec.run_key,
                        data_path=str(data), data_sha256=file_sha256(data), items=6, gpus=1,
                        policy_dir=details["policy_dir"], details_path=str(details_of(out)), run_spec=spec.to_dict())
    (tmp_path / "spec.json").write_text(ev.to_json())
    record = tmp_path / "eval" / "evaluation.json"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
           **run_wide_env()}
    proc = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "spec.json"), str(record)], capture_output=True,
                          text=True, timeout=600, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads(record.read_text())
    assert check_evaluation_record(rec, ev, set(details["trained_item_ids"]), details["policy_sha256"]) == []
    # the prompts it scored: the run's chat template with the run's keywords (thinking off)
    from ggpo_batch.train.pretrained.hf import eos_ids, load_tokenizer
    from ggpo_batch.train.task.codec import HfCodec
    from ggpo_batch.train.task.qa import read_items

    def prompts_sha256(**kwargs: object) -> str:
        codec = HfCodec(load_tokenizer(thinking_hf), max_model_len=1024, eos_ids=eos_ids(thinking_hf),
                        chat_template_kwargs=kwargs)
        ids = [codec.prompt("eval", it) for it in read_items(str(data), "data")]
        return hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()

    assert rec["prompts_sha256"] == prompts_sha256(enable_thinking=False) != prompts_sha256()
    assert rec["dtype"] == "float32" and rec["rollout"] == "torch"
    again = {r["item_id"]: r for r in rec["evaluation"]["per_item"]}
    assert sum(1 for r in own for a in r["answers"] if a.strip()) >= 4  # a comparison of something
    assert [again[r["item_id"]]["answers"] for r in own] == [r["answers"] for r in own]
    assert [x for r in own for x in again[r["item_id"]]["rewards"]] == pytest.approx([x for r in own
                                                                                       for x in r["rewards"]])
    # exposure in the new set: what the run trained on (its held-out exposures among them)
    assert {i for i, r in again.items() if r["exposed"]} == wanted & set(details["trained_item_ids"])
    assert {r["item_id"] for r in own if r["exposed"]} <= {i for i, r in again.items() if r["exposed"]}
