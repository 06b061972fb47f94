"""TrainingJob as submitit runs it: pickled, ranks from submitit's environment, checkpoint hook."""

import os
import pickle

import pytest
import submitit

from ggpo_batch.contracts.run_record import check_run_record
from ggpo_batch.train.run.job import TrainingJob


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
        "import sys; from ggpo_batch.train.run.job import TrainingJob\n"
        "for i, spec in enumerate(sys.argv[2:]):\n"
        "    TrainingJob(spec, f'{sys.argv[1]}/r{i}.json')()\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path), *specs], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    for i, arm in enumerate(("clean", "paired")):
        record = json.loads((tmp_path / f"r{i}.json").read_text())
        assert check_run_record(f"7/{arm}", record) == []


def test_a_lone_rank_takes_a_fresh_port_for_each_job_and_keeps_a_launchers(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A job run in a process (or a child of one) where an earlier lone job exported its rendezvous
    port must not reuse that port (EADDRINUSE in CI: the earlier job's store still held it); a
    launcher's own RANK/MASTER_PORT are kept."""
    from ggpo_batch.train.run import job

    for key in job.RENDEZVOUS_ENV:  # set, then removed: monkeypatch puts back what was there, absent included
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    assert job._distributed_env() == (0, 1, 0, False)
    first = os.environ["MASTER_PORT"]
    ports = {first}
    for _ in range(5):
        job._distributed_env()
        ports.add(os.environ["MASTER_PORT"])
    assert len(ports) == 6  # a fresh one each time
    monkeypatch.delenv(job.LONE_PORT_ENV)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "23456")
    assert job._distributed_env() == (1, 2, 0, False) and os.environ["MASTER_PORT"] == "23456"


def test_a_submitit_task_ignores_a_port_a_lone_rank_left_in_the_submitting_process(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """submitit takes an inherited MASTER_PORT as the rendezvous port: one a lone (debug) job had
    chosen in the submitting process was still held there (EADDRINUSE in CI). A task drops it and
    rendezvouses on the port submitit draws from the job id; a port the job's setup exported stays."""
    from ggpo_batch.train.run import job

    for key in [k for k in os.environ if k.startswith(("SLURM_", "SUBMITIT_"))]:
        monkeypatch.delenv(key)
    for key in job.RENDEZVOUS_ENV:  # what submitit's export sets, put back as it was at the end
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    task = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "4242", "SUBMITIT_LOCAL_NTASKS": "2",
            "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_GLOBALID": "1",
            "SUBMITIT_LOCAL_LOCALID": "1"}
    for key, value in task.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("MASTER_PORT", "23457")
    monkeypatch.setenv(job.LONE_PORT_ENV, "23457")
    assert job._distributed_env() == (1, 2, 1, True)
    drawn = os.environ["MASTER_PORT"]
    assert drawn != "23457" and 20000 <= int(drawn) <= 60000
    monkeypatch.setenv("MASTER_PORT", "23458")  # the local executor's setup exports a free port of its own
    assert job._distributed_env() == (1, 2, 1, True) and os.environ["MASTER_PORT"] == "23458"
