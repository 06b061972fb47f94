"""Experiment specs written for tests."""

from __future__ import annotations

from pathlib import Path

SLURM_SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = {seeds}
gpus = 4
loop_budget_seconds = 2
executor = "slurm"
profile = "{profile}"
max_gpu_hours = {max_gpu_hours}
retries = {retries}
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[arms.clean]
exposure = "none"
"""


# A two-run spec on the debug executor (no model, no data): what a ledger check needs to enqueue.
DEBUG_SPEC = """[experiment]
name = "{name}"
method = "ggpo"
seeds = [1, 2]
executor = "debug"
loop_budget_seconds = 1
[arms.clean]
exposure = "none"
"""


def write_spec(folder: Path, name: str, *, seeds: list[int], profile: str = "dev-cluster-1task", retries: int = 0,
               max_gpu_hours: float = 1.0) -> Path:
    """A one-arm spec on the dev Slurm (`profile` of the packaged profiles), written to `folder`/`name`.toml."""
    path = folder / f"{name}.toml"
    path.write_text(SLURM_SPEC.format(name=name, seeds=seeds, profile=profile, retries=retries,
                                      max_gpu_hours=max_gpu_hours))
    return path


ONE_SEED_SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [7]
gpus = {gpus}
loop_budget_seconds = 1.5
executor = "{executor}"
profile = "{profile}"
max_gpu_hours = 1.0
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
"""


def one_seed_spec(folder: Path, name: str, body: str, *, gpus: int = 4, executor: str = "local",
                  profile: str = "default") -> Path:
    """A spec of seed 7 and a 1.5 s loop budget whose `body` (its [train...] and [arms...] tables)
    follows the [experiment] and [overheads] tables, written to `folder`/`name`.toml."""
    path = folder / f"{name}.toml"
    path.write_text(ONE_SEED_SPEC.format(name=name, gpus=gpus, executor=executor, profile=profile) + body)
    return path


def flagship_with(folder: Path, model: Path, data: dict[str, Path]) -> Path:
    """jobs/exposure-5arm.toml with its placeholders (model directory, data files) pointed at `model`
    and `data` (build_qa_set's files), written to `folder`."""
    from ggpo_batch.spec.parse import load_spec

    from .paths import JOBS

    flagship = JOBS / "exposure-5arm.toml"
    spec = load_spec(flagship)
    text = flagship.read_text().replace(spec.train["model"]["path"], str(model))
    for key in ("train", "eval", "passages"):
        text = text.replace(spec.train["data"][key], str(data[key]))
    mine = folder / "exposure-5arm.toml"
    mine.write_text(text)
    return mine


# A nightly suite small enough for a test: seeds, width and steps cut to the bone.
TINY_SUITE = """
schema = 1
[suite]
name = "nightly-test"
tier = "l1_mechanism"
methods = ["ggpo"]
seeds = {seeds}
time_goal_seconds = 60
[model]
width = 24
[budgets]
teacher_steps = 3
specialist_steps = 2
student_steps = 2
max_new_tokens = 8
batch_size = 8
window_bytes = 32
prompt_bytes = 8
eval_chunk_bytes = 64
[ggpo]
group_size = 4
reference_refresh_steps = 2
max_group_draws_per_step = 4
[corpus]
id = "test:absent"
path = "{absent}"
max_bytes = 100000
generated_bytes = 20000
[schedule]
cron = "30 2 * * *"
queue = "nightly-test"
[full_experiment]
status = "not_reproduced_high_cost"
review_done = true
resolution = "r"
available_budget = "b"
cost_basis = "c"
cost_type = "t"
automatic_retry = false
"""


def write_suite(tmp_path: Path, seeds: str = "[1, 2]") -> Path:
    """A tiny nightly suite (one method, small budgets, a corpus that is absent) as `tmp_path`/suite.toml."""
    path = tmp_path / "suite.toml"
    path.write_text(TINY_SUITE.format(seeds=seeds, absent=tmp_path / "absent.txt"))
    return path
