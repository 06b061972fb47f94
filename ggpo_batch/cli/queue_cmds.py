"""Commands over the queue: enqueue, worker, cancel, retry, reconcile, release."""

from __future__ import annotations

import click

from ..contracts.priorities import PRIORITIES
from ..control import progress
from .app import (
    ARM_VALUE,
    FINITE_VALUE,
    NAME_VALUE,
    RUN_KEY_VALUE,
    TEXT_VALUE,
    WORKER_VALUE,
    App,
    cli,
    echo_json,
    experiment_at,
    pass_app,
)
from .shell import COMPLETE_EXPERIMENT, COMPLETE_RUN_KEY


def _csv(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _seeds(value: str | None) -> list[int] | None:
    items = _csv(value)
    if items is None:
        return None
    try:
        return [int(s) for s in items]
    except ValueError:
        raise click.BadParameter(f"{value!r}: seeds are integers, comma-separated", param_hint="--seeds") from None


def _facts(facts: dict) -> str:
    """Preflight's measured figures, one short parenthesis (empty when there are none)."""
    shown = []
    if "parameters" in facts:
        shown.append(f"{facts['parameters']:,} parameters")
    if "eval_items" in facts:
        shown.append(f"{facts['train_items']} train / {facts['eval_items']} eval items, {facts['passages']} passages")
    if "longest_prompt_tokens" in facts:
        shown.append(f"longest prompt {facts['longest_prompt_tokens']} tokens, an episode at most "
                     f"{facts['episode_tokens_at_most']} of {facts['max_model_len']}")
    mem = facts.get("gpu_memory_estimate_gib")
    if mem:
        shown.append(f"~{mem['total']:g} GiB per GPU of {facts['gpu_memory_gib']:g}")
    return f" ({'; '.join(shown)})" if shown else ""


@cli.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(path_type=str))
@click.option("--arms", help="Only these arms (comma-separated).")
@click.option("--seeds", help="Only these seeds (comma-separated).")
@click.option("--queue", callback=NAME_VALUE, help="Queue name (default: the spec's, else GGPO_QUEUE).")
@click.option("--priority", type=click.Choice(PRIORITIES),
              help="high | normal | low (default: the spec's [experiment] priority, else normal): workers take "
                   "higher priorities first; the Slurm profile maps each to --nice or a QoS.")
@click.option("--dry-run", is_flag=True, help="Print the runs and their cost estimate; write nothing.")
@click.option("--new-version", is_flag=True, help="The spec changed on purpose: start a new experiment version.")
@click.option("--accept-cost", is_flag=True, help="Queue even over a GPU-hour cap (needs --reason).")
@click.option("--reason", callback=TEXT_VALUE, help="Why the cost is accepted (recorded in the ledger).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def enqueue(app: App, spec_file: str, arms: str | None, seeds: str | None, queue: str | None, priority: str | None,
            dry_run: bool, new_version: bool, accept_cost: bool, reason: str | None, as_json: bool) -> None:
    """Expand SPEC (jobs/*.toml) into arm x seed runs, record them in the ledger and queue them.

    Preflight first: what would fail on the allocation (the model directory and tokenizer, the data
    files and their sizes against the arms, prompts against max_model_len, GPU memory) is refused
    here, one line per problem, exit 2, nothing written; --dry-run prints the GPU-memory estimate term by
    term against the profile's gpu_memory_gib. Enqueueing the same spec again adds nothing.
    A changed spec under the same experiment name is refused with a diff unless --new-version. Over a GPU-hour cap nothing is queued and the
    decision is recorded (exit code 3) unless --accept-cost --reason TEXT.

    \b
    --json: {"experiment", "version", "queue", "dry_run", "runs": [{"run_key", "arm", "seed", "gpus",
    "nodes", "new", "estimated_gpu_hours"}], "enqueued", "restored", "estimated_gpu_hours", "cost_basis",
    "within_caps", "preflight": {what preflight measured: "parameters", "model_dir", "model_type",
    "train_items", "eval_items", "passages", "longest_prompt_tokens", "episode_tokens_at_most",
    "max_model_len", "gpu_memory_estimate_gib": {each term of gpu_memory.py: GiB, "total"},
    "gpu_memory_gib": one GPU of the profile}} (preflight keys only where measured), "arms": [{"name", "swept",
    "baseline", "runs", "estimated_gpu_hours", "changes": {field: [baseline's, arm's]}}].
    """
    from ..control.enqueue import arm_rows, enqueue_spec
    from ..spec.parse import load_spec

    if accept_cost and not (reason and reason.strip()):
        raise click.UsageError("--accept-cost needs --reason TEXT")
    app.reads_only = dry_run  # a dry run reads the ledger only: it works on one this user may not write
    spec = load_spec(spec_file)
    with progress.shown():  # the embedded queue (memory://) runs every job here: show them
        res = enqueue_spec(app.ledger(), app.settings, spec, arms=_csv(arms), seeds=_seeds(seeds), queue=queue,
                           dry_run=dry_run, new_version=new_version,
                           accept_cost_reason=reason if accept_cost else None,
                           actor=app.settings.user if dry_run else app.actor, priority=priority)
    est = {e.run_key: e for e in res.estimate.runs} if res.estimate else {}
    if as_json:
        echo_json("enqueue", {"experiment": res.experiment, "version": res.version, "queue": res.queue, "dry_run": res.dry_run,
                   "runs": [{"run_key": r.run_key, "arm": r.arm.name, "seed": r.seed, "gpus": r.gpus, "nodes": r.nodes,
                             "new": r.run_key in res.new_runs,
                             "estimated_gpu_hours": est[r.run_key].gpu_hours if r.run_key in est else None}
                            for r in res.runs],
                   "enqueued": res.enqueued, "restored": res.restored,
                   "estimated_gpu_hours": res.estimate.total_gpu_hours if res.estimate else None,
                   "cost_basis": res.estimate.cost_basis if res.estimate else None,
                   "within_caps": res.cap.ok if res.cap else None,
                   "preflight": res.preflight.facts if res.preflight else None, "arms": arm_rows(spec, res),
                   "held": res.held, "canaries": res.canaries})
        return
    from ..contracts.arm_train import changes_text
    from ..control.costguard import describe

    if res.estimate and (res.dry_run or len(res.estimate.runs) <= 50):
        for line in describe(res.estimate, res.cap):
            click.echo(line)
    elif res.estimate:
        click.echo(f"estimated total: {res.estimate.total_gpu_hours:.2f} GPU-h for {len(res.estimate.runs)} runs "
                   f"({res.estimate.cost_basis})")
    rows = arm_rows(spec, res)
    if res.dry_run or len(rows) > 1:
        swept = sum(1 for a in rows if a["swept"])
        click.echo(f"arms: {len(rows)}" + (f" ({swept} from [sweep])" if swept else "")
                   + f", each against the baseline {spec.baseline_arm!r}:")
        for a in rows:
            gh = "-" if a["estimated_gpu_hours"] is None else f"{a['estimated_gpu_hours']:.3f}"
            what = "(baseline)" if a["baseline"] else changes_text(a["changes"])
            click.echo(f"  {a['name']}{' [sweep]' if a['swept'] else ''}: {a['runs']} run(s), {gh} GPU-h; {what}")
    if res.dry_run:  # what the spec's seeds can detect, and what its [power] effect needs
        from ..control.planning import dry_run_line

        click.echo(dry_run_line(app.ledger(), app.settings, spec, user=app.settings.user))
    for default in spec.defaults:  # taken from the model, not written in the spec
        click.echo(f"default: {default}")
    if res.preflight is not None:
        click.echo(f"preflight: ok{_facts(res.preflight.facts)}")
        mem = res.preflight.facts.get("gpu_memory_estimate_gib")
        if res.dry_run and mem:
            from ..train.policy.gpu_memory import breakdown

            click.echo("GPU memory per GPU, by term (ggpo_batch/train/policy/gpu_memory.py):")
            for line in breakdown(mem, res.preflight.facts["gpu_memory_gib"]):
                click.echo(line)
    if res.held and spec.power is not None and spec.power.design == "sequential":
        click.echo(f"sequential design, waves {list(spec.power.waves)}: {len(res.held)} run(s) of the later waves "
                   f"{'would be' if res.dry_run else 'are'} held; reconcile takes a look after each wave and releases "
                   f"the next (or cancels an arm that stopped)")
    if res.canaries:
        click.echo(f"canary: {len(res.canaries)} canary allocation(s) {'would run' if res.dry_run else 'started'} "
                   f"before the sweep ({', '.join(res.canaries)}); the runs of each shape stay held until its canary "
                   f"passes (`ggpo-batch canary {res.experiment}@{res.version}`)")
    if res.dry_run:
        click.echo("dry run: nothing written")
    else:
        click.echo(f"{res.experiment} v{res.version}: {res.enqueued} run(s) queued on {res.queue!r}, "
                   + (f"{len(res.held)} held, " if res.held else "")
                   + f"{len(res.runs) - len(res.new_runs)} already in the ledger"
                   + (f", {res.restored} of them put back on the queue (queued in the ledger, missing from Redis)"
                      if res.restored else ""))


@cli.command()
@click.option("--queue", "queues", multiple=True, callback=NAME_VALUE, help="Queue(s) to work (default GGPO_QUEUE).")
@click.option("--burst", is_flag=True, help="Exit once the queue is empty and this queue's runs have ended.")
@click.option("--name", callback=WORKER_VALUE, help="Worker name (default: RQ's host.pid name).")
@click.option("--reconcile-interval", default=30, show_default=True, type=click.IntRange(5, 3600),
              help="Seconds between reconcile cycles (one per interval across all workers).")
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve this worker's Prometheus metrics (/metrics) and health (/healthz) on this port "
                   "(0: any free one, logged).")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address of the metrics port (they name no secret; 0.0.0.0 for a Prometheus elsewhere).")
@pass_app
def worker(app: App, queues: tuple[str, ...], burst: bool, name: str | None, reconcile_interval: int,
           metrics_port: int | None, metrics_host: str) -> None:
    """Take runs from the queue and submit them through their executor (slurm, local, debug).

    Higher priorities first (enqueue --priority). The quotas GGPO_QUEUE_GPU_QUOTA (a queue's GPUs in
    flight), GGPO_USER_GPU_QUOTA and GGPO_ROLE_GPU_QUOTA (one person's) defer a run (re-queued after
    GGPO_DEFER_SECONDS, no attempt counted) rather than failing it. On a team ledger a worker runs as a
    service role (member of ggpo_service). Needs Redis; with GGPO_REDIS_URL=memory:// enqueue runs
    jobs inline. With --metrics-port: /metrics (reconcile seconds, sacct calls, errors and seconds,
    sbatch pacing wait, ledger retries; what its forked processes count included) and /healthz.
    """
    from ..control.worker import run_worker
    from ..ledger.read_only import require_service

    if app.settings.inline_queue:
        raise click.UsageError("GGPO_REDIS_URL=memory:// runs jobs inside `enqueue`; a worker needs a Redis server")
    app.ledger()  # refuse a schema that is behind before taking any job
    require_service(app.engine(), "ggpo-batch worker")
    metrics_at = (metrics_host, metrics_port) if metrics_port is not None else None
    if not burst:  # a long-lived worker logs; a burst worker is watched by someone waiting for it
        run_worker(app.settings, list(queues) or [app.settings.queue], burst=False, name=name,
                   reconcile_interval=reconcile_interval, metrics_at=metrics_at)
        return
    with progress.shown():
        run_worker(app.settings, list(queues) or [app.settings.queue], burst=True, name=name,
                   reconcile_interval=reconcile_interval, metrics_at=metrics_at)


@cli.command()
@click.argument("run_key", required=False, callback=RUN_KEY_VALUE, shell_complete=COMPLETE_RUN_KEY)
@click.option("--experiment", "-e", callback=NAME_VALUE, shell_complete=COMPLETE_EXPERIMENT,
              help="Cancel every unfinished run of this experiment (all versions).")
@click.option("--evaluation", "outcome_set", callback=ARM_VALUE,
              help="Cancel the evaluation after training of this outcome set (`evaluate --name`) instead: of "
                   "RUN_KEY, or of every run of --experiment.")
@click.option("--reason", callback=TEXT_VALUE, help="Why (recorded).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def cancel(app: App, run_key: str | None, experiment: str | None, outcome_set: str | None, reason: str | None,
           as_json: bool) -> None:
    """Cancel RUN_KEY, or every unfinished run of --experiment (held ones too): queued jobs removed,
    allocations scancelled.
    With --evaluation NAME, their unfinished evaluations of that outcome set (the runs stay as they are).

    \b
    --json: {"cancelled": [{"run_key", "was", "removed_jobs", "cancelled_job", "evaluation"}]}
    ("evaluation": the outcome set, null for a run)."""
    from ..contracts.states import CANCELLABLE_RUN_STATES
    from ..control.interventions import cancel_runs

    if run_key is None and experiment is None:
        raise click.UsageError("give a RUN_KEY or --experiment NAME")
    if run_key is not None and experiment is not None:
        raise click.UsageError("give a RUN_KEY or --experiment, not both")
    led = app.ledger()
    if outcome_set is not None:
        from ..control.evaluations import cancel_evaluations, evaluation_keys

        if experiment and not led.experiments(experiment):
            raise click.BadParameter(f"no experiment {experiment!r}", param_hint="--experiment")
        stopped = cancel_evaluations(led, app.settings, evaluation_keys(led, run_key=run_key, experiment=experiment,
                                                                         name=outcome_set),
                                     actor=app.settings.user, reason=reason)
        if as_json:
            echo_json("cancel", {"cancelled": [{"run_key": c.run_key, "was": c.was, "removed_jobs": c.removed_jobs,
                                                "cancelled_job": c.cancelled_job, "evaluation": c.evaluation}
                                               for c in stopped]})
            return
        for c in stopped:
            click.echo(f"cancelled evaluation {c.evaluation} of {c.run_key} (was {c.was}"
                       + (f", job {c.cancelled_job}" if c.cancelled_job else "") + ")")
        if not stopped:
            click.echo("nothing to cancel")
        return
    if experiment:
        exps = led.experiments(experiment)
        if not exps:
            raise click.BadParameter(f"no experiment {experiment!r}", param_hint="--experiment")
        keys = [r.run_key for e in exps for r in led.runs(experiment_id=e.id, states=sorted(CANCELLABLE_RUN_STATES))]
    else:
        keys = [led.get_run(run_key).run_key]  # type: ignore[arg-type]
    done = cancel_runs(led, app.settings, keys, actor=app.actor, reason=reason)
    if as_json:
        echo_json("cancel", {"cancelled": [{**c.__dict__, "evaluation": None} for c in done]})
        return
    for c in done:
        click.echo(f"cancelled {c.run_key} (was {c.was}" + (f", job {c.cancelled_job}" if c.cancelled_job else "") + ")")
    if not done:
        click.echo("nothing to cancel")


@cli.command()
@click.argument("run_key", callback=RUN_KEY_VALUE, shell_complete=COMPLETE_RUN_KEY)
@click.option("--reason", required=True, callback=TEXT_VALUE,
              help="Why this run is tried again (recorded with your user name).")
@click.option("--evaluation", "outcome_set", callback=ARM_VALUE,
              help="Retry the run's evaluation after training of this outcome set instead (one that failed, "
                   "timed out, was lost or cancelled).")
@pass_app
def retry(app: App, run_key: str, reason: str, outcome_set: str | None) -> None:
    """Queue a new attempt of an ended run, by hand. Retries are never automatic for training errors,
    nor for evaluations after training (--evaluation NAME)."""
    from ..control.interventions import retry_run

    if outcome_set is not None:
        from ..contracts.evaluation_spec import evaluation_key
        from ..control.evaluations import retry_evaluation

        ev = retry_evaluation(app.ledger(), app.settings, evaluation_key(run_key, outcome_set),
                              actor=app.actor, reason=reason)
        click.echo(f"{run_key}: evaluation {ev.name} queued again")
        return

    n = retry_run(app.ledger(), app.settings, run_key, actor=app.actor, reason=reason)
    click.echo(f"{run_key}: queued for attempt {n}")


@cli.command()
@click.option("--queue", "queues", multiple=True, callback=NAME_VALUE, help="Queue(s) to reconcile (default GGPO_QUEUE).")
@click.option("--wait", is_flag=True, help="Repeat until no attempt of these queues is active.")
@click.option("--timeout", default=3600.0, show_default=True, type=click.FloatRange(min=0), callback=FINITE_VALUE,
              help="Seconds --wait waits at most.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def reconcile(app: App, queues: tuple[str, ...], wait: bool, timeout: float, as_json: bool) -> None:
    """Make the ledger agree with Slurm/local jobs, and Redis agree with the ledger (idempotent).

    Ended allocations are booked with their GPU-hours; a worker that died while submitting is
    resolved (the scheduler has the job: submitted; it does not: lost); a sequential design whose
    wave has ended gets its look (recorded; the next wave released, or a stopped arm's held runs
    cancelled); queued runs missing from Redis (after a flush or restart) are put back.
    """
    from ..config.identity import acting
    from ..control.reconcile import reconcile_now, wait_settled
    from ..ledger.read_only import require_service

    app.ledger()
    require_service(app.engine(), "ggpo-batch reconcile")
    names = list(queues) or [app.settings.queue]
    actor = acting(app.actor, "reconcile")
    if wait:
        with progress.shown():
            left = wait_settled(app.settings, names, timeout=timeout, actor=actor)
        if left:
            raise click.ClickException(f"{left} attempt(s) still active after {timeout:.0f} s")
    rep = reconcile_now(app.settings, names, actor=actor)
    if as_json:
        echo_json("reconcile", rep.__dict__)
    else:
        click.echo(f"polled {rep.polled}, ended {rep.ended}, started {rep.started}, resolved "
                   f"{rep.resolved_submitting} unsubmitted, re-queued {rep.requeued}; {rep.active} active"
                   + (f"; {rep.looks} look(s) of sequential designs taken" if rep.looks else ""))
    if rep.errors:
        click.echo(f"warning: {rep.errors} run(s) could not be reconciled (see the log, -v); the others were",
                   err=True)


@cli.command()
@click.argument("experiment", metavar="EXPERIMENT[@VERSION]", callback=experiment_at)
@click.option("--reason", callback=TEXT_VALUE, help="Why (recorded; default: released by you).")
@pass_app
def release(app: App, experiment: tuple[str, int | None], reason: str | None) -> None:
    """Put the held runs of EXPERIMENT (the latest version, or @VERSION) on the queue: held -> queued.
    Held runs (a canary's, a later wave's) are never queued otherwise; `cancel` cancels them."""
    from ..control.holds import release as release_held

    name, version = experiment
    with progress.shown():
        res = release_held(app.ledger(), app.settings, name, version, actor=app.actor, reason=reason)
    click.echo(f"{res.experiment} v{res.version}: {len(res.run_keys)} held run(s) released, {res.enqueued} queued on "
               f"{res.queue!r}" if res.run_keys else f"{res.experiment} v{res.version}: no held run")
