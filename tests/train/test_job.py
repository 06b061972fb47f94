"""TrainingJob as submitit runs it: pickled, ranks from submitit's environment, checkpoint hook."""

import pickle

import pytest
import submitit

from ggpo_batch.run_record import check_run_record
from ggpo_batch.train.job import TrainingJob


def test_job_pickles_and_its_checkpoint_resubmits_the_same_run(tmp_path, spec_for):
    spec = spec_for("clean")
    job = pickle.loads(pickle.dumps(TrainingJob(spec.to_json(), str(tmp_path / "r.json"))))
    again = job.checkpoint()
    assert isinstance(again, submitit.helpers.DelayedSubmission)
    assert isinstance(again.function, TrainingJob)
    assert (again.function.spec_json, again.function.output) == (spec.to_json(), str(tmp_path / "r.json"))


@pytest.mark.train
@pytest.mark.slow
def test_two_submitit_tasks_train_one_run(tmp_path, spec_for):
    """submitit's local executor sets the same task environment as its Slurm one (SUBMITIT_*)."""
    ex = submitit.AutoExecutor(folder=tmp_path / "sub", cluster="local")
    ex.update_parameters(tasks_per_node=2, nodes=1, timeout_min=5, gpus_per_node=0,
                         local_setup=["export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1"])
    out = tmp_path / "r.json"
    job = ex.submit(TrainingJob(spec_for("random_answer", budget=1.0).to_json(), str(out)))
    results = job.results()
    assert len(results) == 2 and results[0] == results[1]
    assert check_run_record("7/random_answer", results[0]) == []
    import json

    details = json.loads((tmp_path / "r.json.details.json").read_text())
    assert details["under_submitit"] is True and details["world_size"] == 2


@pytest.mark.train
@pytest.mark.slow
def test_two_jobs_train_one_after_the_other_in_one_process(tmp_path, spec_for):
    """The debug executor and the embedded queue run each job inside the calling process: the
    second must find no trace of the first's process group (DeepSpeed cached a clone of it, and the
    second run failed with "Group ... is not registered")."""
    import subprocess
    import sys

    specs = [spec_for(arm, budget=0.5).to_json() for arm in ("clean", "paired")]
    script = (
        "import sys; from ggpo_batch.train.job import TrainingJob\n"
        "for i, spec in enumerate(sys.argv[2:]):\n"
        "    TrainingJob(spec, f'{sys.argv[1]}/r{i}.json')()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path), *specs], capture_output=True, text=True,
                          timeout=600, env={**__import__("os").environ, "DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    for i, arm in enumerate(("clean", "paired")):
        record = json.loads((tmp_path / f"r{i}.json").read_text())
        assert check_run_record(f"7/{arm}", record) == []
