"""Preflight at enqueue: a spec that names a checkpoint and JSONL data is checked against them before
anything is queued (one line per problem naming the field, exit 2, nothing in the ledger or the
queue); a good one goes through `enqueue` and `worker` to a succeeded run on this machine's CPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ggpo_batch.spec import preflight
from ggpo_batch.spec.parse import load_spec
from ggpo_batch.train.policy import gpu_memory
from tests.support.paths import JOBS


def copy_model(tiny_hf: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "model-copy"
    shutil.copytree(tiny_hf, folder)
    return folder


def edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_a_spec_naming_the_checkpoint_and_data_passes_with_its_figures(write, tiny_hf):  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file

    report = preflight.check(load_spec(write()))
    assert report.ok, report.lines()
    f = report.facts
    assert f["parameters"] == sum(t.numel() for t in load_file(tiny_hf / "model.safetensors").values())
    assert (f["train_items"], f["eval_items"], f["passages"]) == (200, 200, 1200)
    assert 100 < f["longest_prompt_tokens"] < f["episode_tokens_at_most"] <= f["max_model_len"] == 1024


def _break(case: str, tmp_path: Path, tiny_hf: Path, qa_files: dict) -> dict:  # type: ignore[type-arg]
    """The spec fields of one broken case (files changed under tmp_path)."""
    if case == "absent model":
        return {"model": tmp_path / "no-such-model"}
    if case == "hub id not cached":
        return {"model": "ggpo-test-org/no-such-model"}
    if case in ("no chat template", "not a causal LM", "no weights", "tokenizer bigger than the model"):
        folder = copy_model(tiny_hf, tmp_path)
        if case == "no chat template":
            (folder / "chat_template.jinja").unlink()
            cfg = json.loads((folder / "tokenizer_config.json").read_text())
            cfg.pop("chat_template", None)
            (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
        elif case == "not a causal LM":
            edit_json(folder / "config.json", model_type="vit", architectures=["ViTModel"])
        elif case == "no weights":
            (folder / "model.safetensors").unlink()
        else:
            edit_json(folder / "config.json", vocab_size=300)
        return {"model": folder}
    if case == "absent eval file":
        return {"eval_file": tmp_path / "nope.jsonl"}
    if case == "bad data line":
        bad = tmp_path / "train.jsonl"
        line = {"id": "x", "question": "q", "answers": "a", "support_titles": []}
        bad.write_text(Path(qa_files["train"]).read_text() + json.dumps(line) + "\n")
        return {"train_file": bad}
    if case == "held-out ids in train":
        both = tmp_path / "train.jsonl"
        both.write_text(Path(qa_files["train"]).read_text() + Path(qa_files["eval"]).read_text().splitlines()[0] + "\n")
        return {"train_file": both}
    return {
        "too few held-out items": {"exposed": 150, "eval_file": _head(qa_files["eval"], 24, tmp_path)},
        "prompts do not fit": {"max_model_len": 128},
        "past the model's positions": {"max_model_len": 16384},
        "group does not split over templates": {"train": "group_size = 3"},
        "groups do not split over ranks": {"train": "prompts_per_step = 3"},
        "float16 on the CPU": {"dtype": "float16"},
    }[case]


def _head(path: Path, n: int, tmp_path: Path) -> Path:
    out = tmp_path / "eval-head.jsonl"
    out.write_text("".join(Path(path).read_text().splitlines(keepends=True)[:n]))
    return out


CASES = [
    ("absent model", "train.model.path", "absent from this machine", True),
    ("hub id not cached", "train.model.path", "nor in the local Hugging Face cache on this machine", True),
    ("no chat template", "train.model.path", "no chat template", False),
    ("not a causal LM", "train.model.path", "is not a causal LM", False),
    ("no weights", "train.model.path", "no safetensors weights", False),
    ("tokenizer bigger than the model", "train.model.path", "the model's embeddings 300", False),
    ("absent eval file", "train.data.eval", "absent from this machine", True),
    ("bad data line", "train.data.train", "train.jsonl:201: answers must be a non-empty array", False),
    ("held-out ids in train", "train.data.eval", "held-out items must be held out", False),
    ("too few held-out items", "arms.paired.exposed_items", "must be in 1..24 (held-out items of train.data.eval", False),
    ("prompts do not fit", "train.model.max_model_len", "128 tokens cannot hold the longest prompt", False),
    ("past the model's positions", "train.model.max_model_len", "more than the model's 8192 positions", False),
    ("group does not split over templates", "train.group_size", "does not split over the 2 templates", False),
    ("groups do not split over ranks", "train.prompts_per_step", "do not split over the 2 training ranks", False),
    ("float16 on the CPU", "train.model.dtype", "float16 (loss scaling) needs a GPU", False),
]


@pytest.mark.parametrize("case, field, words, absent", CASES, ids=[c[0] for c in CASES])
def test_each_problem_is_one_line_naming_its_field(case, field, words, absent, write, tmp_path, tiny_hf, qa_files):  # type: ignore[no-untyped-def]
    path = write(**_break(case, tmp_path, tiny_hf, qa_files))
    report = preflight.check(load_spec(path))
    assert [p.field for p in report.problems] == [field], report.lines()
    [problem] = report.problems
    assert words in problem.message and problem.absent is absent
    assert report.lines() == [f"{path}: {field}: {problem.message}"] and "\n" not in report.lines()[0]


def test_a_hub_id_is_taken_from_the_local_hugging_face_cache_only(write, tmp_path, tiny_hf, monkeypatch):  # type: ignore[no-untyped-def]
    """A hub id names a snapshot already in the local cache (laid out as huggingface_hub keeps it);
    nothing is downloaded, an uncached id is refused (see CASES)."""
    import huggingface_hub.constants

    from ggpo_batch.train.pretrained import hf

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--ggpo-test--tiny"
    shutil.copytree(tiny_hf, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hf.resolve("ggpo-test/tiny") == (repo / "snapshots" / commit).resolve()
    spec = load_spec(write(model="ggpo-test/tiny"))
    assert spec.train["model"]["path"] == "ggpo-test/tiny"  # kept as a hub id, resolved where it is loaded
    report = preflight.check(spec)
    assert report.ok, report.lines()
    assert Path(report.facts["model_dir"]).resolve() == (repo / "snapshots" / commit).resolve()


def test_ranks_given_by_the_caller_replace_the_executors(write):  # type: ignore[no-untyped-def]
    """`train --nproc N` decides the ranks of a local run; the executor's default (2) is for the queue."""
    spec = load_spec(write(train="prompts_per_step = 3"))
    assert preflight.check(spec, ranks=1).ok and preflight.check(spec, ranks=3).ok
    assert [p.field for p in preflight.check(spec).problems] == ["train.prompts_per_step"]


def test_gpu_memory_is_checked_against_the_profile(write, tmp_path):  # type: ignore[no-untyped-def]
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "small.toml").write_text("schema = 1\ngpus_per_node = 4\ntasks_per_node = 4\ngpu_memory_gib = 1\n")
    (profiles / "unsized.toml").write_text("schema = 1\ngpus_per_node = 4\ntasks_per_node = 4\n")
    (profiles / "big.toml").write_text("schema = 1\ngpus_per_node = 4\ntasks_per_node = 4\ngpu_memory_gib = 80\n")
    # vLLM reserves 90 % of a 1 GiB GPU, beside the CUDA context: no room.
    small = preflight.check(load_spec(write(executor="slurm", profile="small", train='rollout = "vllm"\n'
                                            "vllm_gpu_memory_utilization = 0.9")), profiles_dir=profiles)
    [p] = small.problems
    assert p.field == "experiment.profile" and "the model does not fit" in p.message and "rollout 0.9" in p.message
    [p] = preflight.check(load_spec(write(executor="slurm", profile="unsized")), profiles_dir=profiles).problems
    assert p.field == "experiment.profile" and "does not declare gpu_memory_gib" in p.message
    big = preflight.check(load_spec(write(executor="slurm", profile="big")), profiles_dir=profiles)
    assert big.ok and big.facts["gpu_memory_estimate_gib"]["total"] < 80
    [p] = preflight.check(load_spec(write(executor="slurm", profile="big", gpus=2)), profiles_dir=profiles).problems
    assert p.field == "experiment.gpus" and "allocates 4 per run" in p.message


def test_memory_formula_for_the_reference_model_sizes():  # type: ignore[no-untyped-def]
    """The module's formula, figure by figure, for a 1.7B-class model (bf16, ZeRO-2 on 4 GPUs)."""
    gib = gpu_memory.GIB
    p = 2_000_000_000
    parts = gpu_memory.memory_estimate(parameters=p, dtype_bytes=2, ranks=4, zero_stage=2, rows=1, seq_len=8192,
                                      hidden=2048, layers=28, vocab=151936, gradient_checkpointing=True,
                                      rollout="vllm", vllm_fraction=0.35, gpu_bytes=80 * gib)
    assert parts["weights"] == 2 * p and parts["gradients"] == 4 * p / 4 and parts["optimizer"] == 12 * p / 4
    assert parts["reference"] == 2 * p and parts["rollout"] == 0.35 * 80 * gib
    assert parts["activations"] == 8192 * 2048 * 28 * 2 and parts["logits"] == 8192 * 151936 * 10  # unchunked
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    z3 = gpu_memory.memory_estimate(parameters=p, dtype_bytes=2, ranks=4, zero_stage=3, rows=1, seq_len=8192,
                                   hidden=2048, layers=28, vocab=151936, gradient_checkpointing=True,
                                   rollout="torch", vllm_fraction=0.35, gpu_bytes=80 * gib)
    assert z3["weights"] == 2 * p / 4 and z3["rollout"] == 2 * p  # the torch sampler's behaviour copy
    assert z3["reference"] == 2 * p / 4  # partitioned like the policy
    z2 = gpu_memory.memory_estimate(parameters=p, dtype_bytes=2, ranks=4, zero_stage=2, rows=1, seq_len=8192,
                                   hidden=2048, layers=28, vocab=151936, gradient_checkpointing=False,
                                   rollout="torch", vllm_fraction=0.35, gpu_bytes=80 * gib)
    assert z2["rollout"] == 0  # it samples from the policy module itself
    assert z2["activations"] == 8192 * 2048 * 28 * 34
    chunked = gpu_memory.memory_estimate(parameters=p, dtype_bytes=2, ranks=4, zero_stage=2, rows=1, seq_len=8192,
                                        hidden=2048, layers=28, vocab=151936, gradient_checkpointing=False,
                                        rollout="torch", vllm_fraction=0.35, gpu_bytes=80 * gib, chunk_tokens=1024,
                                        chunk_vocab=32768)
    assert chunked["logits"] == 1024 * 32768 * 14 + 8192 * 2048 * 6  # one chunk, not the vocabulary: 0.5 GiB
    assert chunked["logits"] < z2["logits"] / 15


# -- through the CLI: exit 2, one line each, nothing written; then a good spec to a succeeded run -----


@pytest.fixture
def cli_env(ledger, db_url, redis_url, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    if not db_url.startswith("sqlite"):
        pytest.skip("preflight runs before the ledger: one backend is enough")
    for k in list(os.environ):
        if k.startswith("GGPO_"):
            monkeypatch.delenv(k)
    env = {"GGPO_DB_URL": db_url, "GGPO_REDIS_URL": redis_url, "GGPO_DATA_DIR": str(tmp_path / "data"),
           "GGPO_USER": "tester", "GGPO_QUEUE": "hfq", "GGPO_DEFER_SECONDS": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


def _nothing_written(ledger, redis_url: str) -> None:  # type: ignore[no-untyped-def]
    import redis

    assert ledger.experiments() == [] and ledger.runs() == [] and ledger.decisions() == []
    assert redis.Redis.from_url(redis_url).keys("*") == []


def _enqueue(*args: str):  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from ggpo_batch.cli import cli

    return CliRunner().invoke(cli, ["enqueue", *args], catch_exceptions=False)


@pytest.mark.redis
def test_enqueue_refuses_with_one_line_per_problem_and_writes_nothing(cli_env, ledger, redis_url, write, tmp_path):  # type: ignore[no-untyped-def]
    path = write(model=tmp_path / "absent", exposed=500, train="prompts_per_step = 3")
    for extra in ([], ["--dry-run"]):
        res = _enqueue(str(path), *extra)
        assert res.exit_code == 2
        lines = res.stderr.strip().splitlines()
        assert [re.sub(r":.*", "", ln.split(f"{path}: ", 1)[1]) for ln in lines] == [
            "train.prompts_per_step", "arms.paired.exposed_items", "train.model.path"], lines
        assert all(ln.startswith(f"error: {path}: ") for ln in lines)
    _nothing_written(ledger, redis_url)


def flagship_before_this_change() -> str:
    """jobs/exposure-5arm.toml as it was: the same experiment and arms, no [train] tables (so the
    built-in model on the generated corpus, 24 held-out items, and 150 exposed items per arm)."""
    text = (JOBS / "exposure-5arm.toml").read_text()
    return re.sub(r"(?ms)^\[train(\.\w+)?\].*?(?=^\[arms\.)", "", text)


@pytest.mark.redis
def test_the_flagship_specs_old_failure_is_an_enqueue_time_exit_2(cli_env, ledger, redis_url, tmp_path):  # type: ignore[no-untyped-def]
    old = tmp_path / "exposure-5arm.toml"
    old.write_text(flagship_before_this_change())
    assert "[train" not in old.read_text() and load_spec(old).arm("paired").exposed_items == 150
    res = _enqueue(str(old))
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 4  # the four exposure arms; before, each run died in the trainer on its allocation
    for arm, line in zip(("paired", "random_matched", "paired_answer", "random_answer"), lines):
        assert line.startswith(f"error: {old}: arms.{arm}.exposed_items: must be in 1..24 (held-out items of "
                               f"the generated corpus") and line.endswith("got 150")
    _nothing_written(ledger, redis_url)


@pytest.mark.redis
@pytest.mark.train
@pytest.mark.slow
def test_enqueue_and_worker_train_the_checkpoint_to_a_succeeded_run(cli_env, ledger, redis_url, write, tiny_hf):  # type: ignore[no-untyped-def]
    from ggpo_batch.contracts.allocation import details_of
    from ggpo_batch.contracts.run_record import TRAINING_STATUS_VALIDATED, check_run_record

    path = write(name="hf-e2e")
    res = _enqueue(str(path), "--arms", "paired")
    assert res.exit_code == 0, res.output
    assert "preflight: ok (" in res.output and "parameters" in res.output
    done = subprocess.run([sys.executable, "-m", "ggpo_batch.cli", "worker", "--queue", "hfq", "--burst",
                           "--reconcile-interval", "5"], env=dict(os.environ), capture_output=True, timeout=400,
                          start_new_session=True, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    run = ledger.get_run("hf-e2e-v1-7-paired")
    assert run.state == "succeeded", run.cause
    assert check_run_record("7/paired", run.result) == []
    assert run.result["training"]["status"] == TRAINING_STATUS_VALIDATED
    [att] = run.attempts
    assert att.executor == "local" and att.state == "succeeded"
    [art] = ledger.artifacts(run_id=run.id)
    details = json.loads(details_of(Path(art.path)).read_text())
    assert details["model"]["resolved"] == str(tiny_hf) and details["rollout"] == "torch"
    assert Path(details["policy_dir"], "model.safetensors").is_file() and len(details["policy_sha256"]) == 64
