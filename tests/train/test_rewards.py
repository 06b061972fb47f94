"""`[train.task] reward` (train/task/rewards.py): the built-ins, weights, a user's file called as TRL calls a
reward function, and what fails a run: a reward that raises, hangs or returns a non-finite number."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggpo_batch.train.task import qa
from ggpo_batch.train.task.items import Item
from ggpo_batch.train.task.rewards import RewardError, Rewards, exact_match, token_f1
from ggpo_batch.train.task_config import TaskConfig

ITEMS = [Item("a", "What is 2+2?", ("4",), (), prompt="What is 2+2?", columns='{"answer": "4", "id": "a"}'),
         Item("b", "Who wrote Hamlet?", ("William Shakespeare",), (), prompt=(("user", "Who wrote Hamlet?"),),
              columns='{"answer": "William Shakespeare", "id": "b"}')]


def task(**kw) -> TaskConfig:  # type: ignore[no-untyped-def]
    return TaskConfig.from_table(kw, "j.toml")


def test_the_default_reward_is_todays_verifier_exactly() -> None:
    data = qa.synthetic(__import__("ggpo_batch.train.config", fromlist=["TrainConfig"]).TrainConfig())
    items = list(data.train[:20])
    answers = [it.answer if i % 3 == 0 else it.answer[:3] + "x" if i % 3 == 1 else "nothing" for i, it in enumerate(items)]
    assert Rewards(None)(items, answers) == [qa.score(a, it) for a, it in zip(answers, items)]


def test_exact_match_and_squad_token_f1() -> None:
    it = ITEMS[1]
    assert exact_match("the William Shakespeare.", it) == 1.0 and exact_match("Shakespeare", it) == 0.0
    assert token_f1("Shakespeare", it) == pytest.approx(2 * 1 * 0.5 / 1.5) and token_f1("", it) == 0.0


def test_math_equivalence_scores_unparseable_output_zero_and_counts_it() -> None:
    pytest.importorskip("math_verify")
    r = Rewards(task(reward="math"))
    assert r([ITEMS[0]] * 3, ["The answer is $\\boxed{4}$", "2+2 = 5, so \\boxed{5}", "no idea"]) == [1.0, 0.0, 0.0]
    assert r.counts() == {"math_unparsed": 1}


def test_weighted_rewards_are_summed() -> None:
    r = Rewards(task(reward=["exact_match", "token_f1"], reward_weights=[1.0, 0.5]))
    assert r(ITEMS[1:], ["Shakespeare"]) == [pytest.approx(0.5 * 2 / 3)]


def write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return str(path)


def test_a_user_reward_is_called_as_trl_calls_reward_functions(tmp_path: Path) -> None:
    file = write(tmp_path, "calls = []\n"
                 "def score(prompts, completions, **columns):\n"
                 "    calls.append((prompts, completions, columns))\n"
                 "    return [float(c.strip() == a) for c, a in zip(completions, columns['answer'])]\n")
    r = Rewards(task(reward=f"{file}:score"))
    assert r(ITEMS, ["4", "Marlowe"]) == [1.0, 0.0]
    import sys

    module = next(m for n, m in sys.modules.items() if n.startswith("ggpo_user_reward_"))
    prompts, completions, columns = module.calls[-1]
    assert prompts == ["What is 2+2?", [{"role": "user", "content": "Who wrote Hamlet?"}]]
    assert completions == ["4", "Marlowe"] and columns == {"answer": ["4", "William Shakespeare"], "id": ["a", "b"]}


@pytest.mark.parametrize("body, words", [
    ("def score(prompts, completions, **kw):\n    raise ValueError('bad row\\nsecond line')\n",
     "row 'a' (a call of 2): ValueError: second line"),
    ("import time\ndef score(prompts, completions, **kw):\n    time.sleep(30)\n", "did not return within 0.5 s"),
    ("def score(prompts, completions, **kw):\n    return [1.0, float('nan')]\n", "row 'b': returned nan at [1]"),
    ("def score(prompts, completions, **kw):\n    return [1.0]\n", "returned 1 numbers for 2 completions"),
])
@pytest.mark.parametrize("thread", ["main", "other"])
def test_a_user_reward_that_raises_hangs_or_returns_nonsense_fails_the_run(tmp_path: Path, body: str, words: str,
                                                                           thread: str) -> None:
    """Bounded by SIGALRM in the main thread (a rank's trainer), by a thread of its own elsewhere."""
    import threading

    file = write(tmp_path, body)
    r = Rewards(task(reward=f"{file}:score", reward_timeout_seconds=0.5))
    got: list[BaseException] = []

    def call() -> None:
        try:
            r(ITEMS, ["4", "x"])
        except RewardError as exc:
            got.append(exc)

    if thread == "main":
        call()
    else:
        t = threading.Thread(target=call)
        t.start()
        t.join(30)
    [err] = got
    assert f"reward {file}:score" in str(err) and words in str(err), str(err)


def test_a_user_reward_may_bound_its_own_time_with_sigalrm_as_math_verify_does(tmp_path: Path) -> None:
    """TRL's accuracy reward calls math-verify, which sets SIGALRM: that works only in the main thread."""
    pytest.importorskip("math_verify")
    file = write(tmp_path, "from math_verify import parse, verify\n"
                 "def score(prompts, completions, **columns):\n"
                 "    return [float(verify(parse(a), parse(c))) for c, a in zip(completions, columns['answer'])]\n")
    r = Rewards(task(reward=f"{file}:score", reward_timeout_seconds=5))
    assert r(ITEMS[:1], ["$4$"]) == [1.0]
