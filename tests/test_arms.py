"""Arms over any training field and sweeps (spec/arms.py, contracts/arm_train.py): an arm's overrides
go into its run specs only, and change its config hash only where they change its train; what every
arm shares is refused naming the arm and the field; a sweep's arms are named deterministically and
uniquely; preflight checks each arm with its own train; `enqueue --dry-run`, `status`, `report` and
`report A B` say what each arm changes against the baseline."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.common import limits
from ggpo_batch.contracts.arm_train import arm_changes, difference, overlay
from ggpo_batch.errors import SpecError
from ggpo_batch.spec import preflight
from ggpo_batch.spec.arms import arm_name, sweep_arms
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import REPO

HEAD = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [1, 2]
loop_budget_seconds = 5
executor = "{executor}"
gpus = 1
[train]
lr = 1e-3
"""

# The run specs' config hashes of the shipped exposure study, taken before arms could override
# [train]: "run_key config_hash" lines of expand(1), hashed; and the first run's own.
PINNED_CONFIG = {
    "exposure-5arm.toml": ("d7b1a94e629bf87aee4e215ca663b3203751a4db44ae5022c68050467a0d17f4",
                           "6c3d603b61d0afe3d19d74f1b97da0db42f97606e19360367b140218217ac6d6"),
    "demo-cpu.toml": ("49ed575cff42324bbb2726c4d2c5d8d97c7549579b0211af43b6d9f9a9baff11",
                      "cb61b73b00902421d0ceaadb0c1be159c81b392cb1d932184310ff70c9520b79"),
}


def _spec(tmp_path: Path, body: str, *, name: str = "arms", executor: str = "debug") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(HEAD.format(name=name, executor=executor) + body)
    return p


def _refused(tmp_path: Path, body: str) -> SpecError:
    with pytest.raises(SpecError) as e:
        load_spec(_spec(tmp_path, body))
    assert "\n" not in str(e.value)
    return e.value


@pytest.mark.parametrize("name", sorted(PINNED_CONFIG))
def test_specs_without_overrides_keep_their_runs_config_hashes(name: str) -> None:
    runs = load_spec(REPO / "jobs" / name).expand(1)
    lines = "\n".join(f"{r.run_key} {r.config_hash}" for r in runs)
    assert (hashlib.sha256(lines.encode()).hexdigest(), runs[0].config_hash) == PINNED_CONFIG[name]


def test_an_override_goes_into_its_arms_runs_only(tmp_path: Path) -> None:
    body = '[arms.clean]\n[arms.lr_hi.train]\nlr = 3e-3\n[arms.lr_hi.train.model]\n'
    plain = load_spec(_spec(tmp_path, "[arms.clean]\n[arms.lr_hi]\n"))
    spec = load_spec(_spec(tmp_path, "[arms.clean]\n[arms.lr_hi.train]\nlr = 3e-3\nkl_coef = 0.0\n"))
    runs = {(r.arm.name, r.seed): r for r in spec.expand(1)}
    before = {(r.arm.name, r.seed): r for r in plain.expand(1)}
    assert runs["clean", 1].config_hash == before["clean", 1].config_hash  # the baseline's runs are as they were
    assert runs["lr_hi", 1].config_hash != before["lr_hi", 1].config_hash
    assert difference(runs["clean", 1].train, runs["lr_hi", 1].train) == {"lr": 3e-3, "kl_coef": 0.0}
    assert spec.canonical()["arms"][1]["train"] == {"kl_coef": 0.0, "lr": 3e-3}
    assert "train" not in spec.canonical()["arms"][0] and plain.spec_hash != spec.spec_hash
    # an empty [arms.NAME.train.model] beside a spec without one is a model table without a path
    with pytest.raises(SpecError, match=r"arms\.lr_hi\.train\.model\.path: is required"):
        load_spec(_spec(tmp_path, body))


def test_an_override_that_changes_nothing_changes_no_hash(tmp_path: Path) -> None:
    plain = load_spec(_spec(tmp_path, "[arms.clean]\n[arms.same]\n"))
    # lr as the spec has it, kl_coef at its default (not in the spec's [train]): nothing changes
    same = load_spec(_spec(tmp_path, "[arms.clean]\n[arms.same.train]\nlr = 0.001\nkl_coef = 0.02\n"))
    assert same.spec_hash == plain.spec_hash and same.arm_train == {}
    assert [r.config_hash for r in same.expand(1)] == [r.config_hash for r in plain.expand(1)]


def test_overlay_and_difference_are_inverse() -> None:
    base = {"lr": 1, "model": {"path": "/m", "dtype": "bfloat16"}, "old_logprobs": "rollout", "rollout_is_cap": 2.0}
    arm = {"lr": 2, "model": {"path": "/m", "dtype": "float32"}, "old_logprobs": "policy"}
    d = difference(base, arm)
    assert d == {"lr": 2, "model": {"dtype": "float32"}, "old_logprobs": "policy", "rollout_is_cap": None}
    assert overlay(base, d) == arm and difference(base, base) == {}


@pytest.mark.parametrize(("body", "field", "words"), [
    ("[arms.a.train.data]\ntrain = 'x.jsonl'\n", "arms.a.train.data", "paired on the same items and the same reward"),
    ("[arms.a.train.task]\nkind = 'single_turn'\n", "arms.a.train.task", "same reward"),
    ("[arms.a.train]\nsynthetic_entities = 8\n", "arms.a.train.synthetic_entities", "same items"),
    ("[arms.a.train]\neval_size = 3\n", "arms.a.train.eval_size", "cannot be set per arm"),
    ("[arms.a.train]\nlr = -1.0\n", "arms.a.train.lr", "must be > 0"),
    ("[arms.a.train]\nnope = 1\n", "arms.a.train.nope", "unknown key"),
    ("[arms.a.train]\nmodel = 3\n", "arms.a.train.model", "must be a table"),
    ("[arms.a]\ntrain = 3\n", "arms.a.train", "must be a table"),
    ("[arms.a.train]\nmax_new_tokens = 400\n", "arms.a.train.n_positions", "too small"),
    ("[arms.a.train]\nold_logprobs = 'rollout'\nrollout_is_cap = 0.5\n", "arms.a.train.rollout_is_cap", "a cap below 1"),
])
def test_refusals_name_the_arm_and_the_field(tmp_path: Path, body: str, field: str, words: str) -> None:
    e = _refused(tmp_path, "[arms.clean]\n" + body)
    assert e.field == field and words in e.problem, str(e)


def test_sweep_arms_follow_the_explicit_ones_named_deterministically(tmp_path: Path) -> None:
    body = '[arms.clean]\n[sweep]\n"train.lr" = [1e-6, 3e-6]\n"train.kl_coef" = [0, 0.001]\n'
    spec = load_spec(_spec(tmp_path, body))
    assert [a.name for a in spec.arms] == ["clean", "lr_1em06__kl_coef_0", "lr_1em06__kl_coef_0p001",
                                          "lr_3em06__kl_coef_0", "lr_3em06__kl_coef_0p001"]
    assert spec.swept_arms == tuple(a.name for a in spec.arms[1:]) and spec.baseline_arm == "clean"
    assert spec.train_of("lr_3em06__kl_coef_0p001")["lr"] == 3e-6
    assert spec.train_of("lr_3em06__kl_coef_0p001")["kl_coef"] == 0.001
    assert spec.canonical()["sweep"] == {"train.lr": [1e-6, 3e-6], "train.kl_coef": [0, 0.001]}
    assert load_spec(_spec(tmp_path, body)).spec_hash == spec.spec_hash  # the same file, the same arms
    assert "sweep" not in load_spec(_spec(tmp_path, "[arms.clean]\n")).canonical()
    # no explicit arm: the sweep's first point is the baseline
    only = load_spec(_spec(tmp_path, '[sweep]\n"train.model.dtype" = ["float32"]\n"train.group_size" = [2, 4]\n'
                           '[train.model]\npath = "m"\n'))
    assert [a.name for a in only.arms] == ["model_dtype_float32__group_size_2", "model_dtype_float32__group_size_4"]


def test_sweep_names_stay_within_the_arm_name_rule_and_unique() -> None:
    long = {f"train.{k}": [1.5e-7] for k in ("reference_refresh_steps", "logprob_chunk_tokens", "max_tokens_per_pass",
                                             "vllm_gpu_memory_utilization")}
    [(name, overrides)] = sweep_arms("s.toml", long, set())
    assert len(name) <= limits.ARM_NAME_MAX and limits.ARM_NAME.match(name) and re.search(r"_[0-9a-f]{8}$", name)
    assert overrides == {k.removeprefix("train."): 1.5e-7 for k in long}
    # two values that read alike once made a name: both hashed, apart
    clash = sweep_arms("s.toml", {"train.rollout": ["a-b", "a_b"]}, set())
    names = [n for n, _ in clash]
    assert len(set(names)) == 2 and all(limits.ARM_NAME.match(n) for n in names)
    assert names == [n for n, _ in sweep_arms("s.toml", {"train.rollout": ["a-b", "a_b"]}, set())]
    assert arm_name({"train.lr": -1e-06, "train.model.dtype": "float32"}) == "lr_m1em06__model_dtype_float32"


@pytest.mark.parametrize(("body", "field", "words"), [
    ('"train.data.train" = ["a", "b"]', 'sweep."train.data.train"', "cannot be swept"),
    ('"train.task.kind" = ["a", "b"]', 'sweep."train.task.kind"', "cannot be swept"),
    ('"train.eval_size" = [1, 2]', 'sweep."train.eval_size"', "same items"),
    ('"lr" = [1, 2]', 'sweep."lr"', "not a field an arm may override"),
    ('"train.lr" = []', 'sweep."train.lr"', "non-empty array"),
    ('"train.lr" = [1e-6, 1e-6]', 'sweep."train.lr"', "duplicate"),
    ('"train.max_steps" = [' + ", ".join(map(str, range(1, 66))) + "]", 'sweep."train.max_steps"',
     "has 65 values; at most 64"),
    ('"train.lr" = [[1]]', 'sweep."train.lr"[0]', "must be a plain value"),
    ("[sweep.train]\nlr = [1]", "sweep.train", "quote the dotted field"),
    ('"train.lr" = [1e-6, -1.0]', 'sweep."train.lr"[1]', "train.lr: must be > 0"),
    ('"train.group_size" = [2, 3, 4, 5, 6, 7, 8, 9]\n"train.lr" = [1, 2, 3, 4, 5, 6, 7, 8, 9]', "sweep",
     "8 x 9 = 72 arms, with the 1 explicit arm(s) 73; at most 64"),
])
def test_sweep_refusals_name_the_field_or_the_count(tmp_path: Path, body: str, field: str, words: str) -> None:
    e = _refused(tmp_path, f"[arms.clean]\n[sweep]\n{body}\n")
    assert e.field == field and words in e.problem, str(e)


def test_a_sweep_arm_with_an_explicit_arms_name_is_refused(tmp_path: Path) -> None:
    e = _refused(tmp_path, '[arms.lr_2em06]\n[sweep]\n"train.lr" = [2e-6]\n')
    assert e.field == "sweep" and "'lr_2em06'" in e.problem and "explicit" in e.problem
    e = _refused(tmp_path, "".join(f"[arms.a{i}]\n" for i in range(65)))
    assert e.field == "arms" and "65 arms; at most 64" in e.problem


def test_preflight_checks_each_arm_with_its_own_train(tmp_path: Path) -> None:
    body = "[arms.clean]\n[arms.odd.train]\nprompts_per_step = 3\n[arms.odd2.train]\nprompts_per_step = 3\n"
    spec = load_spec(_spec(tmp_path, body, executor="local"))  # two CPU ranks
    report = preflight.check(spec)
    why = "3 groups per step do not split over the 2 training ranks of executor 'local'"
    assert [(p.field, p.message.split(";")[0]) for p in report.problems] == [("arms.odd.train.prompts_per_step", why)]
    assert report.problems[0].message.endswith("(also arm odd2)")
    assert preflight.check(spec, arms=["clean"]).ok  # the baseline alone has no problem


def _cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_dry_run_lists_the_sweep_arms_with_their_gpu_hours(env: dict[str, str], tmp_path: Path) -> None:
    spec = _spec(tmp_path, '[arms.clean]\n[arms.kl0.train]\nkl_coef = 0.0\n[sweep]\n"train.lr" = [1e-6, 3e-6]\n')
    assert _cli("db", "upgrade").exit_code == 0
    res = _cli("enqueue", str(spec), "--dry-run")
    assert res.exit_code == 0, res.output
    assert "arms: 4 (2 from [sweep]), each against the baseline 'clean':" in res.output
    assert "  clean: 2 run(s), 0.386 GPU-h; (baseline)" in res.output  # 2 x 1 GPU x (5 + 690) s / 3600
    assert "  kl0: 2 run(s), 0.386 GPU-h; train.kl_coef 0.02 -> 0.0" in res.output
    assert "  lr_1em06 [sweep]: 2 run(s), 0.386 GPU-h; train.lr 0.001 -> 1e-06" in res.output
    doc = json.loads(_cli("enqueue", str(spec), "--dry-run", "--json").output)
    rows = {a["name"]: a for a in doc["arms"]}
    assert rows["lr_3em06"]["swept"] and not rows["kl0"]["swept"] and rows["clean"]["baseline"]
    assert rows["lr_3em06"]["changes"] == {"train.lr": [0.001, 3e-6]}
    assert rows["lr_3em06"]["estimated_gpu_hours"] == pytest.approx(2 * 1 * (5 + 690) / 3600)
    assert doc["schema"] == 3  # enqueue 3: the canaries (issue 39)


def test_report_status_and_comparison_name_what_each_arm_changes(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.control.enqueue import new_experiment, new_run
    from ggpo_batch.reporting.compare import compare_reports
    from ggpo_batch.reporting.render import compare_tables, report_tables
    from ggpo_batch.reporting.report import experiment_report
    from ggpo_batch.reporting.status import experiment_status

    for name, body in (("a", '[arms.clean]\n[sweep]\n"train.lr" = [1e-6]\n'),
                       ("b", '[arms.clean]\n[arms.lr_1em06.train]\nlr = 1e-6\nkl_coef = 0.0\n')):
        spec = load_spec(_spec(tmp_path, body, name=name))
        ledger.create_experiment(**new_experiment(spec, 1, "q"), actor="t",
                                 runs=[new_run(r, {}) for r in spec.expand(1)])
    rep = experiment_report(ledger, "a")
    assert rep["changes"] == {"clean": {}, "lr_1em06": {"train.lr": [0.001, 1e-6]}}
    assert rep["train"]["lr"] == 0.001  # the spec's [train], the arms' own in `changes`
    text = "\n".join(str(t.rows) for t in report_tables(rep))
    assert "train.lr 0.001 -> 1e-06" in text and "(baseline)" in text
    [status] = experiment_status(ledger, experiment="b")
    assert status["baseline"] == "clean"
    assert status["changes"]["lr_1em06"] == {"train.kl_coef": [0.02, 0.0], "train.lr": [0.001, 1e-6]}
    both = compare_reports(rep, experiment_report(ledger, "b"))
    assert both["changes"]["lr_1em06"]["a"] == {"train.lr": [0.001, 1e-6]}
    assert both["warnings"][0]["kind"] == "arm_changes_differ"
    assert "train.kl_coef 0.02 -> 0.0" in "\n".join(str(t.rows) for t in compare_tables(both))
    # against another baseline: what the baseline changes shows on the other side
    assert arm_changes(ledger.experiment_spec(ledger.latest_experiment("a").id), "clean", "lr_1em06") == {
        "train.lr": [1e-6, 0.001]}


def test_enqueue_books_each_arms_train_and_is_idempotent(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.control.enqueue import enqueue_spec

    spec = load_spec(_spec(tmp_path, '[arms.clean]\n[arms.kl0.train]\nkl_coef = 0.0\n[sweep]\n"train.lr" = [1e-6]\n'))
    first = enqueue_spec(ledger, settings, spec, actor="tester")
    assert first.enqueued == 6 and first.version == 1
    again = enqueue_spec(ledger, settings, load_spec(spec.path), actor="tester")
    assert again.enqueued == 0 and again.version == 1  # the same spec hash: nothing new
    runs = {(r.arm, r.seed): r for r in ledger.runs()}
    assert runs["kl0", 1].run_spec["train"]["kl_coef"] == 0.0 and "kl_coef" not in runs["clean", 1].run_spec["train"]
    assert runs["lr_1em06", 2].run_spec["train"]["lr"] == 1e-6
    assert runs["kl0", 1].config_hash == spec.run_spec(spec.arm("kl0"), 1, 1).config_hash
    stored = ledger.experiment_spec(ledger.latest_experiment("arms").id)
    assert stored["sweep"] == {"train.lr": [1e-6]} and stored["arms"][1]["train"] == {"kl_coef": 0.0}


@pytest.mark.train
def test_train_arm_trains_with_the_arms_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _spec(tmp_path, "max_steps = 1\neval_size = 4\n[arms.clean]\n[arms.lr_hi.train]\nlr = 0.5\n",
                 executor="local")
    monkeypatch.setenv("GGPO_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "out" / "record.json"
    res = _cli("train", str(spec), "--arm", "lr_hi", "--seed", "1", "--nproc", "1", "--budget-seconds", "1",
               "-o", str(out))
    assert res.exit_code == 0, res.output
    assert "arm lr_hi changes against the baseline 'clean': train.lr 0.001 -> 0.5" in res.output
    trained = json.loads(out.with_name("record.json.spec.json").read_text())  # the run spec the ranks read
    assert trained["train"]["lr"] == 0.5 and trained["arm"]["name"] == "lr_hi"
