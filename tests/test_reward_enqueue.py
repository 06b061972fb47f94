"""A user's reward file and a bad data file are refused at `enqueue`, one line naming the file and what is
wrong, nothing queued (train/task/reward_check.py through spec/preflight.py), on both ledger backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli

GOOD = "def score(prompts, completions, **columns):\n    return [float(c == a) for c, a in zip(completions, columns['answer'])]\n"
BAD = {
    "missing": (None, "rewards/my_reward.py:score: is absent from this machine"),
    "import": ("import no_such_module_here\n", "does not import: ModuleNotFoundError: No module named"),
    "function": ("def other(prompts, completions, **kw):\n    return [0.0] * len(completions)\n",
                 "has no function 'score'"),
    "signature": ("def score(completions):\n    return [0.0] * len(completions)\n", "has the wrong signature score(completions)"),
    "return": ("def score(prompts, completions, **kw):\n    return 1.0\n", "returned float, not a list of numbers"),
    "nonfinite": ("def score(prompts, completions, **kw):\n    return [float('inf')] * len(completions)\n",
                  "returned inf at [0], not a finite number"),
    "hang": ("def score(prompts, completions, **kw):\n    while True:\n        pass\n", "did not return within 1 s"),
}


def spec(folder: Path, reward: str = "rewards/my_reward.py:score", train_file: str = "train.jsonl") -> Path:
    (folder / "rewards").mkdir(parents=True, exist_ok=True)
    for name, first in (("train.jsonl", 0), ("eval.jsonl", 100)):
        (folder / name).write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                                           for i in range(first, first + 4)))
    path = folder / "s.toml"
    path.write_text(f"""schema = 1
[experiment]
name = "rw"
method = "ggpo"
seeds = [1]
gpus = 1
executor = "local"
loop_budget_seconds = 5
[arms.clean]
[train]
max_new_tokens = 4
[train.task]
kind = "single_turn"
reward = ["exact_match", "{reward}"]
reward_timeout_seconds = 1
[train.data]
train = "{train_file}"
eval = "eval.jsonl"
""")
    return path


def enqueue(path: Path):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["enqueue", str(path)], catch_exceptions=False)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_reward_file_is_refused_at_enqueue_and_nothing_is_queued(tmp_path: Path, env, redis_url, ledger,
                                                                       monkeypatch, case: str) -> None:
    monkeypatch.setenv("GGPO_REDIS_URL", redis_url)
    path = spec(tmp_path)
    body, words = BAD[case]
    if body is not None:
        (tmp_path / "rewards" / "my_reward.py").write_text(body)
    res = enqueue(path)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "train.task.reward" in lines[0] and "my_reward.py:score" in lines[0], res.output
    assert words in lines[0], res.output
    assert ledger.experiments() == []


def test_a_good_reward_file_is_queued_and_a_bad_parquet_file_is_not(tmp_path: Path, env, redis_url, ledger,
                                                                    monkeypatch) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setenv("GGPO_REDIS_URL", redis_url)
    path = spec(tmp_path, train_file="train.parquet")
    (tmp_path / "rewards" / "my_reward.py").write_text(GOOD)
    rows = [{"id": f"q{i}", "prompt": f"{i}+{i}=", "answer": str(2 * i), "w": float("nan") if i == 1 else 1.0}
            for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    res = enqueue(path)
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "train.data.train" in res.output and "train.parquet: row 1: at w:" in res.output
    assert ledger.experiments() == []
    for r in rows:
        r["w"] = 1.0
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    res = enqueue(path)
    assert res.exit_code == 0, res.output
    assert [e.name for e in ledger.experiments()] == ["rw"]
