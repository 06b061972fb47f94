"""`ggpo-batch gc`: the checkpoints and attempt folders of finished runs go, each run's removal booked
in the ledger's events; records, details, policies, the folder holding the last attempt's logs (a
requeued job's first folder) and everything of a live run stay. On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts.allocation import CHECKPOINT_NAME, DETAILS_NAME, RECORD_NAME, attempt_folder, policy_of
from ggpo_batch.ledger import NewRun, connect

KEYS = {"live": "g-v1-1-live", "requeued": "g-v1-1-requeued", "retried": "g-v1-1-retried",
        "cancelling": "g-v1-1-cancelling"}


def _write(path: Path, size: int = 1000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def _files(jobs: Path, key: str, attempt: int, job_id: str, *, record: bool) -> list[Path]:
    folder = attempt_folder(jobs, key, attempt)
    made = [_write(folder / f"{job_id}_0_log.out"), _write(folder / f"{job_id}_0_log.err"),
            _write(folder / f"{job_id}_submitted.pkl")]
    if record:
        made += [_write(folder / RECORD_NAME, 10), _write(folder / DETAILS_NAME, 10),
                 _write(policy_of(folder / RECORD_NAME) / "model.safetensors", 10)]
    return made


def _setup(db_url: str, jobs: Path) -> dict[str, list[Path]]:
    """Four runs: one running, one cancelled whose job has not ended, one whose Slurm job was
    requeued and then succeeded (both attempts on the first folder), one that failed once and
    succeeded on a second job."""
    led = connect(db_url)
    runs = [NewRun(run_key=k, arm=k.split("-")[-1], seed=1, config_hash="h", run_spec={"seed": 1}) for k in KEYS.values()]
    led.create_experiment(name="g", version=1, method="ggpo", source="spec", spec_hash="x", spec={}, gpus=4,
                          actor="alice", runs=runs)
    ckpts = {k: _write(jobs / key / CHECKPOINT_NAME / "step3" / "mp_rank_00_model_states.pt", 5000)
             for k, key in KEYS.items()}

    def start(key: str, job_id: str) -> int:
        att = led.begin_attempt(key, executor="slurm", gpus=4, actor="w", worker="w")
        led.mark_submitted(key, att.number, job_id=job_id, actor="w")
        led.mark_running(key, att.number, actor="w")
        return att.number

    start(KEYS["live"], "10")
    live = _files(jobs, KEYS["live"], 1, "10", record=False)
    start(KEYS["cancelling"], "11")
    led.mark_cancelled(KEYS["cancelling"], actor="bob", reason="wrong arm")  # its job is still ending
    cancelling = _files(jobs, KEYS["cancelling"], 1, "11", record=False)
    n = start(KEYS["requeued"], "20")
    led.book_requeue(KEYS["requeued"], n, actor="r", started_at=None, ended_at=None, elapsed_seconds=5.0,
                     gpu_hours_scheduler=0.005, next_started_at=None)
    led.mark_finished(KEYS["requeued"], n + 1, attempt_state="succeeded", run_state="succeeded", actor="r")
    requeued_kept = _files(jobs, KEYS["requeued"], 1, "20", record=True)  # the requeued job's only folder
    stray = _files(jobs, KEYS["requeued"], 2, "x", record=False)  # a folder the second attempt never used
    n = start(KEYS["retried"], "30")
    led.mark_finished(KEYS["retried"], n, attempt_state="failed", run_state="failed", actor="r", reason="bad record")
    failed_folder = _files(jobs, KEYS["retried"], 1, "30", record=True)  # an invalid record: kept all the same
    led.requeue(KEYS["retried"], actor="bob", reason="retry by hand")
    n = start(KEYS["retried"], "31")
    led.mark_finished(KEYS["retried"], n, attempt_state="succeeded", run_state="succeeded", actor="r")
    retried_kept = _files(jobs, KEYS["retried"], 2, "31", record=True)
    led.engine.dispose()
    return {"live": [*live, ckpts["live"]], "cancelling": [*cancelling, ckpts["cancelling"]],
            "kept": [*requeued_kept, *retried_kept, *failed_folder[3:]],
            "removed": [ckpts["requeued"], ckpts["retried"], *stray, *failed_folder[:3]]}


def _gc(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["gc", *args], catch_exceptions=False)


def test_gc_cleans_a_finished_run_and_never_touches_a_live_one(env: dict[str, str], db_url: str) -> None:
    assert CliRunner().invoke(cli, ["db", "upgrade"]).exit_code == 0
    jobs = Path(env["GGPO_DATA_DIR"]) / "jobs"
    files = _setup(db_url, jobs)
    everything = [p for group in files.values() for p in group]
    freed = sum(p.stat().st_size for p in files["removed"])

    assert json.loads(_gc("--json").output)["runs"] == []  # default: only runs older than 30 days
    dry = json.loads(_gc("--older-than", "0d", "--dry-run", "--json").output)
    assert dry["schema"] == 1 and dry["dry_run"] is True and dry["freed_bytes"] == freed
    assert sorted(r["run_key"] for r in dry["runs"]) == [KEYS["requeued"], KEYS["retried"]]
    assert dry["skipped_live"] == 2 and all(p.exists() for p in everything)  # a dry run removes nothing

    res = _gc("--older-than", "0d", "-e", "g")
    assert res.exit_code == 0, res.output
    assert f"{freed / 1e6:.1f} MB freed" in res.output and "2 unfinished run(s) left alone" in res.output
    assert not any(p.exists() for p in files["removed"])
    assert all(p.exists() for p in files["kept"] + files["live"] + files["cancelling"])
    assert not attempt_folder(jobs, KEYS["requeued"], 2).exists()  # a folder with nothing to keep goes whole
    led = connect(db_url)
    cleaned = {k: [e for e in led.events(run_key=key) if e.entity == "cleanup"] for k, key in KEYS.items()}
    assert [len(cleaned[k]) for k in ("live", "cancelling", "requeued", "retried")] == [0, 0, 1, 1]
    assert "checkpoint checkpoint" in cleaned["requeued"][0].reason and "attempt folder attempt-2" in cleaned[
        "requeued"][0].reason and cleaned["requeued"][0].actor == "tester"
    led.engine.dispose()
    again = json.loads(_gc("--older-than", "0d", "--json").output)
    assert again["runs"] == [] and again["freed_bytes"] == 0  # nothing left to remove: nothing booked


def test_gc_refuses_bad_options_in_one_line(env: dict[str, str]) -> None:
    assert CliRunner().invoke(cli, ["db", "upgrade"]).exit_code == 0
    for args, words in ((["--older-than", "soon"], "is not a duration like 30d"),
                        (["-e", "nope"], "no experiment 'nope'")):
        res = _gc(*args)
        assert res.exit_code == 2 and words in res.output and res.output.strip().count("\n") == 0, res.output


@pytest.mark.parametrize("age", ["999999w", "999999d"])
def test_gc_older_than_beyond_the_calendar_is_nothing_that_old(env: dict[str, str], db_url: str, age: str) -> None:
    """An age reaching before year 1 (a valid form) removes nothing and exits 0, never an OverflowError."""
    assert CliRunner().invoke(cli, ["db", "upgrade"]).exit_code == 0
    jobs = Path(env["GGPO_DATA_DIR"]) / "jobs"
    files = _setup(db_url, jobs)
    res = CliRunner().invoke(cli, ["gc", "--older-than", age, "--json"])
    assert res.exit_code == 0 and res.exception is None, res.output
    assert json.loads(res.output)["runs"] == [] and all(p.exists() for group in files.values() for p in group)
