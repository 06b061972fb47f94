"""A small arithmetic set in verl's Parquet layout, generated offline and deterministically: the data of
`jobs/math-cpu.toml`, the plumbing example of a single-turn task with the `math` reward.

`python -m ggpo_batch.train.task.arithmetic OUT` writes OUT/train.parquet and OUT/eval.parquet: one row
per question, `prompt` a chat of one user message, `reward_model.ground_truth` the answer,
`extra_info.index` the row's id (apart between the two files), as verl's GSM8K preprocessing writes them.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

INSTRUCTION = "Solve the problem. Put the final answer in \\boxed{}."
_OPS = (("+", lambda a, b: a + b), ("-", lambda a, b: a - b), ("*", lambda a, b: a * b))


def rows(n: int, *, seed: int, first_index: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """`n` questions `a OP b` with a, b in 0..20, the same for the same seed."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        sym, fn = _OPS[rng.randrange(len(_OPS))]
        out.append({"data_source": "ggpo-arithmetic",
                    "prompt": [{"role": "user", "content": f"{INSTRUCTION}\nWhat is {a} {sym} {b}?"}],
                    "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(fn(a, b))},
                    "extra_info": {"index": first_index + i, "split": split}})
    return out


def write(folder: Path, *, n_train: int = 64, n_eval: int = 16, seed: int = 0) -> dict[str, Path]:
    """OUT/train.parquet and OUT/eval.parquet (ids apart: eval's follow train's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    files = {"train": folder / "train.parquet", "eval": folder / "eval.parquet"}
    pq.write_table(pa.Table.from_pylist(rows(n_train, seed=seed)), files["train"])
    pq.write_table(pa.Table.from_pylist(rows(n_eval, seed=seed + 1, first_index=n_train, split="test")), files["eval"])
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ggpo_batch.train.task.arithmetic", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="The folder to write train.parquet and eval.parquet into.")
    parser.add_argument("--train", type=int, default=64, help="Training questions (default 64).")
    parser.add_argument("--eval", type=int, default=16, help="Held-out questions (default 16).")
    args = parser.parse_args(argv)
    for name, path in write(args.out, n_train=args.train, n_eval=args.eval).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
