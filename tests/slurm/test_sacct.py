"""Parsing of sacct output as Slurm 22.05 prints it (lines captured from the dev cluster)."""

from __future__ import annotations

import time

import pytest

from ggpo_batch.contracts.accounting import disagreement
from ggpo_batch.errors import ExecutorError
from ggpo_batch.executor.sacct import (
    Sacct,
    normalize_state,
    parse_gpus,
)

# `sacct -X -D -P --noheader -o JobID,JobName,State,Start,End,ElapsedRaw,AllocTRES,ExitCode,Comment`
CAPTURED = """\
1|t1|COMPLETED|2026-12-02T13:26:13|2026-12-02T13:26:14|1|billing=1,cpu=1,gres/gpu=4,node=1|0:0|ggpo:a/b:0
2|wrap|FAILED|2026-12-02T13:26:16|2026-12-02T13:26:16|0||1:0|
3|t2|REQUEUED|2026-12-02T13:26:38|2026-12-02T13:26:45|7|billing=1,cpu=1,gres/gpu=4,node=1|0:0|ggpo:a/b:0
3|t2|PREEMPTED|2026-12-02T13:27:38|2026-12-02T13:28:00|22|billing=1,cpu=1,gres/gpu=4,node=1|0:15|ggpo:a/b:0
3|t2|RUNNING|2026-12-02T13:29:00|Unknown|5|billing=1,cpu=1,gres/gpu=4,node=1|0:0|
4|x|CANCELLED by 0|2026-12-02T13:30:00|2026-12-02T13:30:09|9|billing=1,cpu=1,gres/gpu:a100=2,node=1|0:15|a|b
5|y|PENDING|Unknown|Unknown|0||0:0|
"""


def fixed(text):
    return lambda argv: text


def test_states_times_gpus_and_restarts():
    s = Sacct(runner=fixed(CAPTURED))
    acc = s.accounts(["1", "2", "3", "4", "5"])
    assert s.calls == 1
    one = acc["1"].latest
    assert one.state == "COMPLETED" and one.alloc_gpus == 4 and one.elapsed_seconds == 1
    assert one.gpu_hours == pytest.approx(4 / 3600)
    assert one.start.isoformat().startswith("2026-12-02T13:26:13") and one.start.tzinfo is not None
    assert acc["2"].latest.alloc_gpus is None and acc["2"].latest.state == "FAILED"
    three = acc["3"]
    assert three.latest.state == "RUNNING" and three.latest.end is None and three.latest.restarts == 2
    assert [seg.state for seg in three.segments] == ["PENDING", "PREEMPTED", "RUNNING"]
    assert three.gpu_hours == pytest.approx(4 * (7 + 22 + 5) / 3600)
    assert acc["4"].latest.state == "CANCELLED" and acc["4"].latest.alloc_gpus == 2
    assert acc["4"].comments == ("a|b",)
    assert acc["5"].latest.state == "PENDING" and acc["5"].latest.start is None


@pytest.mark.parametrize(
    "raw, state",
    [("CANCELLED by 0", "CANCELLED"), ("TIMEOUT", "TIMEOUT"), ("OUT_OF_MEMORY", "OUT_OF_MEMORY"),
     ("NODE_FAIL", "NODE_FAIL"), ("REQUEUED", "PENDING"), ("COMPLETING", "RUNNING"), ("RUNNING+", "RUNNING")],
)
def test_normalize_state(raw, state):
    assert normalize_state(raw) == state


def test_parse_gpus():
    assert parse_gpus("billing=1,cpu=1,gres/gpu=4,node=1") == 4
    assert parse_gpus("cpu=8,gres/gpu=8,gres/gpu:h100=8,node=1") == 8
    assert parse_gpus("cpu=2,node=1") == 0
    assert parse_gpus("") is None


def test_bad_ids_and_lines_are_refused():
    s = Sacct(runner=fixed("1|only|three\n"))
    with pytest.raises(ExecutorError, match="not a Slurm job id"):
        s.accounts(["1", "2;rm -rf /"])
    with pytest.raises(ExecutorError, match="expected 9"):
        s.accounts(["1"])
    assert s.accounts([]) == {}


def test_throttle_spaces_calls():
    s = Sacct(runner=fixed(""), min_interval_s=0.2)
    t0 = time.monotonic()
    for _ in range(3):
        s.accounts(["1"])
    assert time.monotonic() - t0 >= 0.39
    assert s.calls == 3


def test_disagreement():
    assert disagreement(1.005, 1.0) == pytest.approx(0.005)
    assert disagreement(1.02, 1.0) > 0.01
    assert disagreement(1.0, None) is None
