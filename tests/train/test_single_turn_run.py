"""A single-turn run end to end on the CPU: `ggpo-batch train` of a spec like jobs/math-cpu.toml (the
built-in byte model on 2 gloo ranks, arithmetic in verl's Parquet layout, the `math` reward plus the
shipped user format reward): the run's record validates (its audit re-scores every reward through the
same functions), the details count math-verify's unparsed completions, and the provenance carries the
reward file's sha256."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("pyarrow")
pytest.importorskip("math_verify")
pytestmark = pytest.mark.train

from ggpo_batch.contracts.allocation import details_of  # noqa: E402
from ggpo_batch.contracts.run_record import TRAINING_STATUS_VALIDATED  # noqa: E402
from ggpo_batch.train.task.arithmetic import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_a_single_turn_math_run_trains_audits_and_records_its_reward_code(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ggpo_batch.cli import cli

    spec = tmp_path / "math.toml"
    text = (ROOT / "jobs" / "math-cpu.toml").read_text()
    text = text.replace("loop_budget_seconds = 6", "loop_budget_seconds = 1.5").replace("../out/math-cpu/", "data/")
    spec.write_text(text)
    (tmp_path / "rewards").mkdir()
    shutil.copy(ROOT / "jobs" / "rewards" / "format.py", tmp_path / "rewards" / "format.py")
    write(tmp_path / "data", n_train=16, n_eval=8)
    out = tmp_path / "run" / "clean.json"
    res = CliRunner().invoke(cli, ["train", str(spec), "--arm", "kl_coef_0p0__lr_0p001", "--seed", "1", "-o", str(out)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = json.loads(out.read_text())
    assert record["training"]["status"] == TRAINING_STATUS_VALIDATED, record
    details = json.loads(details_of(out).read_text())
    assert details["audit"]["ok"] and details["audit"]["trajectories_checked"] > 0
    assert details["reward"]["rewards"] == ["math", str(tmp_path / "rewards" / "format.py") + ":score"]
    assert details["reward"]["math_unparsed"] > 0  # a byte model's completions are rarely math
    sha = hashlib.sha256((tmp_path / "rewards" / "format.py").read_bytes()).hexdigest()
    assert details["provenance"]["code"]["reward_files"] == [f"{sha}  {tmp_path / 'rewards' / 'format.py'}"]
    assert details["evaluation"]["items"] == 8 and 0 <= details["evaluation"]["mean_reward"] <= 1.5
