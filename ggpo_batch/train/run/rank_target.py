"""`python -m ggpo_batch.train.run.rank_target MODULE:FUNCTION ARGS...`: call FUNCTION(ARGS) and exit
with what it returns (None: 0).

How a rank of a local run (`launch.main`) or another rank entry point (a bench's, a test's) runs
when the machine's rank server forks it: the server runs `python -m` commands
(train/run/rankfork.py, common/rank_client.py).
"""

from __future__ import annotations

import importlib
import sys


def call(target: str, argv: list[str]) -> int:
    """Run the rank entry point `target` ("module:function") with `argv` (also its sys.argv); its exit code."""
    module, _, function = target.partition(":")
    sys.argv = [module, *argv]
    return getattr(importlib.import_module(module), function)(argv) or 0


def main() -> None:
    if len(sys.argv) < 2 or ":" not in sys.argv[1]:
        raise SystemExit("usage: python -m ggpo_batch.train.run.rank_target MODULE:FUNCTION [ARGS...]")
    target, *argv = sys.argv[1:]
    raise SystemExit(call(target, argv))


if __name__ == "__main__":
    main()
