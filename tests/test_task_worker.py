"""A single-turn run with the `math` reward and a user's reward file through the real queue, an RQ worker
and the local executor; a user reward that raises inside the job fails its run with the file, the row's
id and the last line of the exception in the run's reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.spec.parse import load_spec

pytestmark = [pytest.mark.redis, pytest.mark.train, pytest.mark.slow]
pytest.importorskip("pyarrow")
pytest.importorskip("math_verify")

SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [1]
gpus = 2
loop_budget_seconds = 1.5
executor = "local"
[train]
max_new_tokens = 12
eval_size = 4
[train.task]
kind = "single_turn"
reward = ["math", "rewards/{reward}.py:score"]
reward_weights = [1.0, 0.5]
[train.data]
train = "data/train.parquet"
eval = "data/eval.parquet"
[arms.clean]
"""
# Right on the gold answers preflight calls it with; raises on anything else, as a reward with a bug would.
PICKY = ("def score(prompts, completions, **columns):\n"
         "    gold = [c['ground_truth'] for c in columns['reward_model']]\n"
         "    if completions != gold:\n"
         "        raise KeyError('no rule for ' + repr(completions[0][:8]))\n"
         "    return [1.0] * len(completions)\n")


@pytest.mark.slow_reason("two single-turn training runs end to end through an RQ worker and the local executor")
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # enqueue's refusals run on both in test_reward_enqueue
def test_a_single_turn_math_run_and_a_failing_user_reward_through_the_worker(  # type: ignore[no-untyped-def]
        ledger, settings, worker_env, tmp_path: Path) -> None:
    from ggpo_batch.train.task.arithmetic import write
    from tests.support.paths import REPO
    from tests.support.workers import run_burst_worker

    write(tmp_path / "data", n_train=16, n_eval=4)
    (tmp_path / "rewards").mkdir()
    (tmp_path / "rewards" / "format.py").write_text((REPO / "jobs" / "rewards" / "format.py").read_text())
    (tmp_path / "rewards" / "picky.py").write_text(PICKY)
    for name, reward in (("mathok", "format"), ("mathbad", "picky")):
        (tmp_path / f"{name}.toml").write_text(SPEC.format(name=name, reward=reward))
        enqueue_spec(ledger, settings, load_spec(tmp_path / f"{name}.toml"), actor="tester")
    done = run_burst_worker(["--queue", "testq", "--reconcile-interval", "5"], dict(os.environ), timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    good = ledger.get_run("mathok-v1-1-clean")
    assert good.state == "succeeded", good.cause
    bad = ledger.get_run("mathbad-v1-1-clean")
    reason = bad.attempts[-1].reason or ""
    assert bad.state == "failed", (bad.state, reason)
    assert f"reward {tmp_path / 'rewards' / 'picky.py'}:score, row '" in reason, reason
    assert "KeyError: \"no rule for" in reason, reason
