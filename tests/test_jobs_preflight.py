"""Every spec under jobs/ passes preflight, or fails only because a model directory or data file it
names is absent from this machine (a spec written for the cluster: the test says which); and the
flagship spec, its placeholders pointed at a tiny checkpoint and QA set built here, passes outright."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from ggpo_batch.spec import preflight
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import JOBS
from tests.support.specs import flagship_with

EXPERIMENT_SPECS = sorted(p for p in JOBS.glob("*.toml") if "[experiment]" in p.read_text())


def test_the_jobs_folder_holds_the_experiment_specs():
    names = {p.name for p in EXPERIMENT_SPECS}
    assert {"exposure-5arm.toml", "demo-cpu.toml"} <= names


@pytest.mark.parametrize("path", EXPERIMENT_SPECS, ids=[p.stem for p in EXPERIMENT_SPECS])
def test_every_spec_passes_preflight_or_names_only_absent_inputs(path: Path):
    report = preflight.check(load_spec(path))
    wrong = [line for p, line in zip(report.problems, report.lines()) if not p.absent]
    assert wrong == [], "\n".join(wrong)
    if report.problems:
        assert all("absent from this machine" in p.message or "Hugging Face cache on this machine" in p.message
                   for p in report.problems)
        warnings.warn(f"{path.name}: preflight passes except for inputs absent from this machine: "
                      + "; ".join(f"{p.field} ({p.message})" for p in report.problems), stacklevel=1)


def test_the_flagship_passes_preflight_once_its_placeholders_name_real_files(tmp_path: Path):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from ggpo_batch.train.task.tiny_hf import THINKING_CHAT_TEMPLATE, build_checkpoint, build_qa_set

    # A Qwen3-like hybrid chat template, as the flagship's Qwen3 checkpoint has (it reads enable_thinking).
    model = build_checkpoint(tmp_path / "model", chat_template=THINKING_CHAT_TEMPLATE)
    data = build_qa_set(tmp_path / "qa", n_train=200, n_eval=160)
    spec = load_spec(JOBS / "exposure-5arm.toml")
    mine = flagship_with(tmp_path, model, data)
    report = preflight.check(load_spec(mine))
    assert report.ok, report.lines()
    assert spec.train["model"]["chat_template_kwargs"] == {"enable_thinking": False}
    assert report.facts["eval_items"] == 160 >= max(a.exposed_items for a in spec.arms)
    assert report.facts["gpu_memory_estimate_gib"]["total"] <= report.facts["gpu_memory_gib"] == 80
    # The reference sizes (seeds/000): 5 arms x 3 seeds, 150 exposed items over 2 templates, 2700 s, 4 GPUs.
    assert len(spec.expand(1)) == 15 and spec.loop_budget_seconds == 2700 and spec.gpus == 4
    assert {a.exposed_items for a in spec.arms if a.exposure != "none"} == {150}
    assert {a.templates for a in spec.arms if a.exposure != "none"} == {("train_direct", "train_role")}


@pytest.mark.parametrize(("tp", "refused"), [(2, False), (4, False), (8, True)])
def test_tensor_parallel_size_must_tile_the_ranks_of_a_node(tmp_path: Path, tp: int, refused: bool):
    """The flagship's 4-GPU node: vLLM engines of 2 or 4 ranks tile it, 8 does not (refused at
    enqueue, one line naming the field, instead of when the allocation starts)."""
    text = (JOBS / "exposure-5arm.toml").read_text().replace('rollout = "vllm"',
                                                             f'rollout = "vllm"\ntensor_parallel_size = {tp}')
    mine = tmp_path / "tp.toml"
    mine.write_text(text)
    report = preflight.check(load_spec(mine))
    tp_lines = [line for p, line in zip(report.problems, report.lines()) if p.field == "train.tensor_parallel_size"]
    if refused:
        assert len(tp_lines) == 1 and "does not divide the 4 training ranks of a node" in tp_lines[0], tp_lines
    else:
        assert tp_lines == []
