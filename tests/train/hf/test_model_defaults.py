"""Defaults taken from the model (ggpo_batch/spec/defaults.py): `[train.model] path` alone gives the
model's own context as max_model_len (not 4,096, which a model of 1,024 positions refused), capped
by the GPU-memory formula when the profile declares its GPUs; the number is in the spec's train
table, so the run spec and its hash carry it, and `enqueue --dry-run` says where it came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggpo_batch.contracts.runspec import config_hash
from ggpo_batch.spec import defaults as spec_defaults
from ggpo_batch.spec import preflight
from ggpo_batch.spec.parse import load_spec
from tests.faults.test_hostile_inputs import fingerprint, run_cli
from tests.train.hf.test_hf_preflight import copy_model

SPEC = """
[experiment]
name = "{name}"
method = "ggpo"
seeds = [7]
gpus = 4
loop_budget_seconds = 1.5
executor = "{executor}"
profile = "{profile}"
[train]
max_new_tokens = 16
max_turns = 3
passage_max_bytes = 96
{train}
[train.model]
path = "{model}"
dtype = "float32"
{model_extra}
[train.data]
train = "{train_file}"
eval = "{eval_file}"
passages = "{passages_file}"
[arms.clean]
"""


@pytest.fixture
def model_1024(tiny_hf: Path, tmp_path: Path) -> Path:
    """The tiny checkpoint, declaring 1,024 positions."""
    folder = copy_model(tiny_hf, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 1024
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _spec(tmp_path: Path, qa_files: dict, model: Path, *, name: str = "defaults", executor: str = "local",  # type: ignore[type-arg]
          profile: str = "default", train: str = "", model_extra: str = "", file: str = "") -> Path:
    path = tmp_path / f"{file or name}.toml"
    path.write_text(SPEC.format(name=name, executor=executor, profile=profile, train=train, model=model,
                                model_extra=model_extra, train_file=qa_files["train"], eval_file=qa_files["eval"],
                                passages_file=qa_files["passages"]))
    return path


def test_a_model_of_1024_positions_gives_max_model_len_1024_carried_by_the_run_spec(
        tmp_path: Path, qa_files: dict, model_1024: Path) -> None:  # type: ignore[type-arg]
    spec = load_spec(_spec(tmp_path, qa_files, model_1024))
    assert spec.train["model"]["max_model_len"] == 1024
    assert spec.defaults == ("train.model.max_model_len = 1,024 (the model's max_position_embeddings)",)
    report = preflight.check(spec)
    assert report.ok, report.lines()  # 4,096 was refused: "more than the model's 1024 positions"
    run = spec.run_spec(spec.arm("clean"), 7, 1)
    assert run.train["model"]["max_model_len"] == 1024
    explicit = load_spec(_spec(tmp_path, qa_files, model_1024, file="explicit", model_extra="max_model_len = 1024"))
    assert explicit.defaults == () and explicit.train == spec.train
    assert config_hash(explicit.run_spec(explicit.arm("clean"), 7, 1).to_dict()) == config_hash(run.to_dict())
    other = load_spec(_spec(tmp_path, qa_files, model_1024, file="other", model_extra="max_model_len = 512"))
    assert config_hash(other.run_spec(other.arm("clean"), 7, 1).to_dict()) != config_hash(run.to_dict())
    absent = load_spec(_spec(tmp_path, qa_files, tmp_path / "absent-model", name="absent"))
    assert "max_model_len" not in absent.train["model"] and absent.defaults == ()  # preflight says it is absent


def test_the_default_is_capped_by_the_memory_formula_of_the_profile(tmp_path: Path, qa_files: dict,  # type: ignore[type-arg]
                                                                    tiny_hf: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "big.toml").write_text("schema = 1\ngpus_per_node = 4\ntasks_per_node = 4\ngpu_memory_gib = 80\n")
    path = _spec(tmp_path, qa_files, tiny_hf, executor="slurm", profile="big", train="micro_batch_size = 64")
    raw = load_spec(path)
    uncapped = spec_defaults.apply(_without_default(raw), profiles)
    assert uncapped.train["model"]["max_model_len"] == 8192  # the tiny model's positions fit 80 GiB
    at_8192 = preflight.check(uncapped, profiles_dir=profiles).facts["gpu_memory_estimate_gib"]["total"]
    at_64 = preflight.check(_with_len(uncapped, 64), profiles_dir=profiles).facts["gpu_memory_estimate_gib"]["total"]
    # A GPU that holds the length-independent part (contexts, buckets, the model) and about half of
    # what the context's length adds.
    small = round(at_64 + (at_8192 - at_64) / 2, 2)
    (profiles / "small.toml").write_text(f"schema = 1\ngpus_per_node = 4\ntasks_per_node = 4\ngpu_memory_gib = {small}\n")
    path = _spec(tmp_path, qa_files, tiny_hf, name="capped", executor="slurm", profile="small",
                 train="micro_batch_size = 64")
    capped = spec_defaults.apply(_without_default(load_spec(path)), profiles)
    value = capped.train["model"]["max_model_len"]
    assert 16 < value < 8192 and value % spec_defaults.ROUND_TO == 0, capped.defaults
    assert "capped by the GPU memory estimate" in capped.defaults[0] and f"{small:g} GiB GPUs" in capped.defaults[0]
    report = preflight.check(capped, profiles_dir=profiles)
    assert report.ok, report.lines()
    assert report.facts["gpu_memory_estimate_gib"]["total"] <= small
    longer = _with_len(capped, value + spec_defaults.ROUND_TO)  # the next multiple of 64 does not fit
    [problem] = preflight.check(longer, profiles_dir=profiles).problems
    assert problem.field == "experiment.profile" and "the model does not fit" in problem.message


def _without_default(spec):  # type: ignore[no-untyped-def]
    """The spec as parsed before its defaults (the repository's profiles decided them)."""
    import dataclasses

    model = {k: v for k, v in spec.train["model"].items() if k != "max_model_len"}
    return dataclasses.replace(spec, train={**spec.train, "model": model}, defaults=())


def _with_len(spec, n: int):  # type: ignore[no-untyped-def]
    import dataclasses

    return dataclasses.replace(spec, train={**spec.train, "model": {**spec.train["model"], "max_model_len": n}})


def test_enqueue_dry_run_says_where_the_default_came_from(env, tmp_path: Path, qa_files: dict,  # type: ignore[no-untyped-def]
                                                          model_1024: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On both ledger backends: the dry run names the default, passes preflight and writes nothing."""
    monkeypatch.setenv("GGPO_REDIS_URL", "memory://")
    assert run_cli("db", "upgrade").exit_code == 0
    before = fingerprint(env["GGPO_DB_URL"])
    res = run_cli("enqueue", str(_spec(tmp_path, qa_files, model_1024)), "--dry-run")
    assert res.exit_code == 0, res.output
    assert "default: train.model.max_model_len = 1,024 (the model's max_position_embeddings)" in res.output
    assert "preflight: ok" in res.output and "of 1024)" in res.output
    assert fingerprint(env["GGPO_DB_URL"]) == before


def test_an_arm_of_another_model_takes_its_own_default(tmp_path: Path, qa_files: dict,  # type: ignore[type-arg]
                                                       tiny_hf: Path, model_1024: Path) -> None:
    path = _spec(tmp_path, qa_files, tiny_hf, name="arms")
    path.write_text(path.read_text() + f'[arms.short.train.model]\npath = "{model_1024}"\n'
                    '[arms.lr_hi.train]\nlr = 0.01\n')
    spec = load_spec(path)
    own = spec.train["model"]["max_model_len"]
    assert own != 1024 and spec.train_of("lr_hi")["model"]["max_model_len"] == own  # lr alone: the spec's
    assert spec.train_of("short")["model"]["max_model_len"] == 1024
    assert spec.defaults[1] == "arms.short.train.model.max_model_len = 1,024 (the model's max_position_embeddings)"
    assert spec.run_spec(spec.arm("short"), 7, 1).train["model"]["path"] == str(model_1024)
    report = preflight.check(spec)
    assert report.ok, report.lines()
    # the arm's own model checked with its own length: one longer than its positions is refused, naming it
    path.write_text(path.read_text().replace(f'path = "{model_1024}"\n', f'path = "{model_1024}"\nmax_model_len = 2048\n'))
    [problem] = preflight.check(load_spec(path)).problems
    assert problem.field == "arms.short.train.model.max_model_len" and "1024" in problem.message


def test_each_arm_is_checked_against_the_gpu_memory_with_its_own_batch(tmp_path: Path, qa_files: dict,  # type: ignore[type-arg]
                                                                        tiny_hf: Path) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "big.toml").write_text("schema = 1\ngpus_per_node = 4\ntasks_per_node = 4\ngpu_memory_gib = 80\n")
    path = _spec(tmp_path, qa_files, tiny_hf, name="mem", executor="slurm", profile="big",
                 train="micro_batch_size = 1", model_extra="max_model_len = 4096")
    path.write_text(path.read_text() + "[arms.wide.train]\nmicro_batch_size = 64\n")
    spec = load_spec(path)
    report = preflight.check(spec, profiles_dir=profiles)
    assert report.ok, report.lines()
    narrow = report.facts["gpu_memory_estimate_gib"]["total"]
    import dataclasses

    # the arm alone (enqueue --arms wide): its own figures, as a spec whose [train] were the arm's
    need = preflight.check(spec, arms=["wide"], profiles_dir=profiles).facts["gpu_memory_estimate_gib"]["total"]
    wide_spec = dataclasses.replace(spec, train=spec.train_of("wide"), arm_train={})
    assert need == preflight.check(wide_spec, profiles_dir=profiles).facts["gpu_memory_estimate_gib"]["total"] > narrow
    # a GPU between what the two batches need: the spec's own arm fits, the wide one does not
    (profiles / "mid.toml").write_text(f"schema = 1\ngpus_per_node = 4\ntasks_per_node = 4\n"
                                       f"gpu_memory_gib = {round((narrow + need) / 2, 3)}\n")
    [problem] = preflight.check(dataclasses.replace(spec, profile="mid"), profiles_dir=profiles).problems
    assert problem.field == "experiment.profile" and problem.message.startswith("arm 'wide': the model does not fit")
