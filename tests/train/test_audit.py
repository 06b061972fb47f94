"""Honest stamps: each VALIDATED / RECONCILED stamp comes from a check that can fail, shown failing.

Unit level: real episodes (a scripted backend, the real environment, retriever and verifier), the
trainer's own loss batching (`loss_batch`), then one planted defect at a time; the audit must name
it and the record's training status must turn into ROLLOUT_AUDIT_FAILED, while the clean step stays
VALIDATED. The budget block likewise. End to end: a 1-second run short of its exposure target
records no RECONCILED stamp, and evaluation counts as exposed only the items actually trained on.
"""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("bm25s")
pytestmark = pytest.mark.train

from ggpo_batch.contracts.run_record import (
    BUDGET_STATUS_RECONCILED,
    BUDGET_STATUS_SHORT,
    TRAINING_STATUS_AUDIT_FAILED,
    TRAINING_STATUS_VALIDATED,
    check_run_record,
)
from ggpo_batch.contracts.runspec import ArmSpec
from ggpo_batch.train.audit.audit import CHECKS, audit
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.policy.batch import loss_batch
from ggpo_batch.train.policy.ggpo import group_advantages
from ggpo_batch.train.rollout.environment import GENERATED, TOOL, run_episodes, start
from ggpo_batch.train.rollout.sampler import Generation, RolloutBackend
from ggpo_batch.train.run.result import build_record
from ggpo_batch.train.task.qa import render, synthetic
from ggpo_batch.train.task.retrieval import Retriever
from ggpo_batch.train.task.tokenizer import EOS, SEARCH, encode

CFG = TrainConfig()
DATA = synthetic(CFG)
RETRIEVER = Retriever(DATA.corpus)
EPS = 1e-6
WRONG = " 7"  # no character in common with a synthetic (letters-only) gold answer: reward 0
G = 4


class Scripted(RolloutBackend):
    """Trajectory i searches with its item's question, then answers answers[i] (real env around it)."""

    def __init__(self, queries: list[list[int]], answers: list[str]) -> None:
        self.queries, self.answers, self.turn = queries, answers, 0

    def generate(self, prompts, max_new_tokens, temperature, seed):
        assert len(prompts) == len(self.answers)  # every trajectory takes both turns
        if self.turn == 0:
            out = [q + [SEARCH] for q in self.queries]
        else:
            out = [encode(a) + [EOS] for a in self.answers]
        self.turn += 1
        return [Generation(tuple(t), tuple(-0.5 for _ in t)) for t in out]

    def sync_weights(self, state):
        pass


def _item(n: int):
    return [i for i in DATA.train if i.support_title in {p.title for p in DATA.corpus}][n]


def _groups():
    a, b, c = _item(0), _item(1), _item(2)
    def gold(i):
        return " " + i.answer

    return [
        (a, "train", [gold(a), WRONG, gold(a), WRONG]),  # rewards [1, 0, 1, 0]: symmetric
        (b, "train_direct", [gold(b), WRONG, " " + b.answer[:3], WRONG]),  # three distinct rewards
        (c, "train_role", [WRONG] * G),  # all equal: dropped
    ]


def episodes(mutate=None):
    """The step's trajectories after real episodes; `mutate(trajs)` plants a defect before batching."""
    trajs, queries, answers = [], [], []
    for item, tmpl, ans in _groups():
        trajs.append([start(item, tmpl, encode(render(tmpl, item))) for _ in range(G)])
        queries += [encode(item.question)] * G
        answers += ans
    flat = [t for ts in trajs for t in ts]
    run_episodes(flat, Scripted(queries, answers), RETRIEVER, max_turns=2, max_new_tokens=64, temperature=1.0,
                 top_k=2, passage_max_bytes=64, seed=0)
    if mutate:
        mutate(trajs)
    return trajs


def step_evidence(mutate=None):
    trajs = episodes(mutate)
    rewards = torch.tensor([[t.reward for t in ts] for ts in trajs], dtype=torch.float32)
    adv = group_advantages(rewards, EPS)
    _, _, ev = loss_batch(3, 0, trajs, rewards, adv, EPS)
    return trajs, ev


def record(*, audit_ok=True, actual=8, target=8, loop=2.0, budget=2.0):
    arm = ArmSpec("paired", "paired", target // 2, ("train_direct", "train_role"))
    totals = {k: 0 for k in ("nonzero_advantage_tokens", "trajectories", "shared_trajectories",
                             "exposed_with_nonzero_advantage", "retrieved_trajectories", "shared_groups",
                             "rl_sequence_nonpadding_tokens", "rl_sequence_padded_tokens", "rl_loss_tokens",
                             "backend_generated_tokens", "backend_requested_input_tokens", "backend_calls")}
    totals["actual_exposed"] = actual
    return build_record(arm=arm, seed=2, totals=totals,
                        templates={"train_direct": actual // 2, "train_role": actual - actual // 2}, steps=3,
                        audit_ok=audit_ok, loop_seconds=loop, budget_seconds=budget, last_batch_seconds=0.5, gpus=1,
                        training_seconds=loop + 1, audit_seconds=0.1, evaluation_seconds=0.1,
                        elapsed_seconds=loop + 2)


def training_status(ev) -> tuple[str, list[str]]:
    res = audit([ev])
    rec = record(audit_ok=res.ok)
    assert check_run_record("2/paired", rec) == []  # a failed audit is a valid record, not a broken one
    return rec["training"]["status"], res.problems


def rows_of(ev, group: int) -> list[int]:
    return [r for r, tid in enumerate(ev.row_trajectories) if tid and f"/g{group}/" in tid]


# ---- the clean step ------------------------------------------------------------------------------

def test_clean_step_is_validated_and_every_check_ran():
    trajs, ev = step_evidence()
    assert [t.reward for t in trajs[0]] == [1.0, 0.0, 1.0, 0.0]
    assert len({t.reward for t in trajs[1]}) == 3 and {t.reward for t in trajs[2]} == {0.0}
    assert all(t.retrieved and TOOL in t.sources for ts in trajs for t in ts)  # tool output in every row
    res = audit([ev])
    assert res.problems == [] and res.ok
    assert res.trajectories_checked == 3 * G and res.rows_checked == 2 * G  # the dropped group has no rows
    assert res.generated_tokens_checked == sum(t.generated_tokens for ts in trajs[:2] for t in ts)
    assert res.details()["checked"] == list(CHECKS) and res.details()["ok"] is True
    assert training_status(ev)[0] == TRAINING_STATUS_VALIDATED


def test_no_evidence_is_not_validated():
    assert not audit([]).ok


# ---- planted defects: each turns the stamp into ROLLOUT_AUDIT_FAILED ------------------------------

def test_advantages_permuted_across_trajectories():
    _, ev = step_evidence()
    rows = rows_of(ev, 1)  # distinct rewards: a permutation changes what each trajectory gets
    before = ev.row_advantages.clone()
    ev.row_advantages[rows] = before[rows].roll(1)
    assert not torch.equal(ev.row_advantages, before)
    # the same multiset per group: a sorted comparison cannot see it
    assert torch.equal(ev.row_advantages[rows].sort().values, before[rows].sort().values)
    status, problems = training_status(ev)
    assert status == TRAINING_STATUS_AUDIT_FAILED
    assert sum("trained with advantage" in p for p in problems) == len(rows), problems


def test_sign_flipped_advantages_on_symmetric_rewards():
    _, ev = step_evidence()
    rows = rows_of(ev, 0)
    flipped = -ev.row_advantages[rows]
    assert torch.equal(flipped.sort().values, ev.row_advantages[rows].sort().values)  # symmetric rewards
    ev.row_advantages[rows] = flipped
    status, problems = training_status(ev)
    assert status == TRAINING_STATUS_AUDIT_FAILED
    assert sum("trained with advantage" in p for p in problems) == G, problems


def test_reward_attached_to_the_wrong_trajectory():
    def swap(trajs):  # the trainer credits trajectory 0's reward to trajectory 1 and vice versa
        a, b = trajs[1][0], trajs[1][1]
        a.reward, b.reward = b.reward, a.reward

    _, ev = step_evidence(swap)
    status, problems = training_status(ev)
    assert status == TRAINING_STATUS_AUDIT_FAILED
    assert sum("the verifier re-scores" in p for p in problems) == 2, problems


def test_prompt_token_in_the_mask():
    def mislabel(trajs):  # the environment labels a prompt token as generated: the mask follows the label
        trajs[0][0].sources[5] = GENERATED

    _, ev = step_evidence(mislabel)
    status, problems = training_status(ev)
    assert status == TRAINING_STATUS_AUDIT_FAILED
    assert any("1 prompt token(s) under the loss mask" in p for p in problems), problems


def test_tool_output_token_in_the_mask():
    def mislabel(trajs):  # a retrieved passage byte (not a delimiter) labelled generated
        t = trajs[1][2]
        t.sources[t.sources.index(TOOL) + 3] = GENERATED

    _, ev = step_evidence(mislabel)
    status, problems = training_status(ev)
    assert status == TRAINING_STATUS_AUDIT_FAILED
    assert any("1 tool-output (retrieved passage) token(s) under the loss mask" in p for p in problems), problems


def test_padding_token_in_the_mask():
    _, ev = step_evidence()
    length = {t.traj_id: t.length for t in ev.trajectories}
    width = ev.loss_mask.shape[1] + 1
    row = next(r for r, tid in enumerate(ev.row_trajectories) if length[tid] < width)  # a padded row
    ev.loss_mask[row, -1] = True  # the last position: past its trajectory's end
    status, problems = training_status(ev)
    assert status == TRAINING_STATUS_AUDIT_FAILED
    assert any("1 padding token(s) under the loss mask" in p for p in problems), problems


def test_generated_token_missing_from_the_mask():
    def mislabel(trajs):  # the environment labels the answer's first generated token as tool output
        t = trajs[0][1]
        off, _ = t.turns[-1]
        t.sources[off] = TOOL

    _, ev = step_evidence(mislabel)
    status, problems = training_status(ev)
    assert status == TRAINING_STATUS_AUDIT_FAILED
    assert any("1 generated token(s) missing from the loss mask" in p for p in problems), problems
    assert any("the backend reported" in p for p in problems), problems


def test_dropped_group_reaching_the_loss():
    _, ev = step_evidence()
    tid = next(t.traj_id for t in ev.trajectories if t.group == 2)
    ev.row_trajectories[rows_of(ev, 1)[0]] = tid  # a row claims a trajectory of the all-equal group
    status, problems = training_status(ev)
    assert status == TRAINING_STATUS_AUDIT_FAILED
    assert any("reached the loss" in p and "all equal" in p for p in problems), problems


# ---- the budget block -----------------------------------------------------------------------------

@pytest.mark.parametrize("case, kw, status, matched", [
    ("clean", {}, BUDGET_STATUS_RECONCILED, True),
    ("exposure short of target", {"actual": 12, "target": 48}, BUDGET_STATUS_SHORT, False),
    ("time budget not reached", {"loop": 1.0}, BUDGET_STATUS_SHORT, False),
])
def test_budget_stamp_only_when_time_and_exposure_reached(case, kw, status, matched):
    rec = record(**kw)
    b = rec["budget"]
    assert b["status"] == status, case
    assert b["matched_interpretation_allowed"] is matched
    assert b["exposure_target_reached"] is (b["actual_exposed"] >= b["target_exposed"])
    assert check_run_record("2/paired", rec) == []


def test_record_check_refuses_a_reconciled_stamp_short_of_target():
    rec = record(actual=12, target=48)
    rec["budget"]["status"] = BUDGET_STATUS_RECONCILED
    assert any("not reached" in p for p in check_run_record("2/paired", rec))
    rec = record(actual=12, target=48)
    rec["budget"]["matched_interpretation_allowed"] = True
    assert any("matched_interpretation_allowed" in p for p in check_run_record("2/paired", rec))


# ---- end to end: the 1-second run of the issue ----------------------------------------------------

@pytest.mark.slow
def test_one_second_run_short_of_exposure_is_not_reconciled(tmp_path: Path, spec_for, arms, monkeypatch):
    """`ggpo-batch train jobs/demo-cpu.toml --arm paired --seed 2 --budget-seconds 1` with
    exposed_items = 24, through the same Python API (2 CPU ranks)."""
    from ggpo_batch.train.run.launch import train_local
    from ggpo_batch.train.task import curriculum as cur

    arm = ArmSpec("paired", "paired", 24, ("train_direct", "train_role"))
    monkeypatch.setitem(arms, "paired", arm)  # make_spec reads the shared ARMS table
    spec = spec_for("paired", seed=2, budget=1.0)
    assert spec.arm.exposed_items == 24
    out = tmp_path / "record.json"
    rec = train_local(spec, out, nproc=2, timeout=300)
    details = json.loads(Path(str(out) + ".details.json").read_text())
    b = rec["budget"]
    assert check_run_record("2/paired", rec) == []
    assert b["time_budget_reached"] is True and b["target_exposed"] == 48
    assert b["actual_exposed"] < 48 and b["exposure_target_reached"] is False
    assert b["matched_interpretation_allowed"] is False
    assert b["status"] == BUDGET_STATUS_SHORT != BUDGET_STATUS_RECONCILED
    # the rollout audit of a real run passes, and says what it checked
    assert rec["training"]["status"] == TRAINING_STATUS_VALIDATED
    assert details["audit"]["ok"] is True and details["audit"]["problems"] == []
    assert details["audit"]["trajectories_checked"] == rec["training"]["counts"]["trajectories"]  # all ranks
    assert details["audit"]["generated_tokens_checked"] == rec["training"]["cost"]["rl_loss_tokens"]
    assert details["audit"]["steps_checked"] == rec["training"]["counts"]["steps"]
    # evaluation's exposed set: the items actually trained on (derived here from the schedule), all ranks
    curriculum = cur.Curriculum(arm, DATA, group_size=CFG.group_size, prompts_per_step=CFG.prompts_per_step,
                                exposures_per_step=CFG.exposures_per_step, seed=2)
    trained = {it.item_id for s in range(rec["training"]["counts"]["steps"])
               for g in curriculum.step_groups(s) if g.exposure for it, _ in g.parts}
    evaluated = {it.item_id for it in DATA.heldout[: CFG.eval_size or None]}  # eval_size 0: every item
    ev = details["evaluation"]
    assert set(ev["trained_exposure_item_ids"]) == trained
    assert ev["exposed_items"] == len(trained & evaluated) < len(evaluated)  # not the 24 planned
    assert ev["planned_exposure_items"] == 24
