"""Commands that price seeds: plan (before enqueue) and advise (after results). Both only read."""

from __future__ import annotations

import click

from .app import (
    ARM_VALUE,
    FINITE_VALUE,
    VERSION_VALUE,
    App,
    cli,
    echo_json,
    pass_reader,
)
from .report_cmds import _which


def _sigma(ctx: click.Context, param: click.Parameter, value: str | None) -> float | str | None:
    if value is None or value == "ledger":
        return value
    try:
        sigma = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: 'ledger' or a number > 0", ctx=ctx, param=param) from None
    if not (sigma > 0 and sigma < float("inf")):
        raise click.BadParameter(f"{value!r}: 'ledger' or a number > 0", ctx=ctx, param=param)
    return sigma


def _sources(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[tuple[str, int | None]]:
    return [w for v in values for w in _which(ctx, param, (v,))]


_METRIC = click.option("--metric", callback=ARM_VALUE,
                       help="The metric: eval_reward | exposed_reward | unexposed_reward, or a record metric the "
                            "report pairs (steps, allocated_gpu_hours, ...); default: the spec's [power] metric, "
                            "else eval_reward.")


@cli.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(path_type=str))
@_METRIC
@click.option("--effect", type=float, callback=FINITE_VALUE,
              help="The smallest arm - baseline difference worth detecting, in the metric's units (default: the "
                   "spec's [power] effect).")
@click.option("--effect-sd", type=float, callback=FINITE_VALUE, help="The same as d_z: in sds of the differences.")
@click.option("--power", "target", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Power to reach (default: the spec's, else 0.8).")
@click.option("--alpha", type=click.FloatRange(0, 0.5, min_open=True),
              help="Two-sided, over the family of arms (default: the spec's, else 0.05).")
@click.option("--sigma", callback=_sigma, help="ledger (default) or the sd of the paired differences.")
@click.option("--from", "sources", multiple=True, callback=_sources, metavar="EXPERIMENT[@V]",
              help="Only these experiments' runs for sigma (repeatable; default: the newest 50 of the method).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_reader
def plan(app: App, spec_file: str, metric: str | None, effect: float | None, effect_sd: float | None,
         target: float | None, alpha: float | None, sigma: float | str | None, sources: list[tuple[str, int | None]],
         as_json: bool) -> None:
    """How many seeds each arm of SPEC needs to detect the effect against its baseline (paired by
    seed, two-sided t, exact noncentral-t power, Holm over the arms by default: planned at alpha /
    arms), a robust count at sigma's 80 % upper confidence limit, the GPU-hours that costs (the cost
    guard's per-run estimate), the smallest difference the spec's own seeds detect, and whether it
    fits the caps. Sigma (the sd of arm - baseline per seed) is pooled from the ledger's earlier
    experiments of the method and metric, named with their degrees of freedom, or --sigma. A
    sequential [power] design shows its waves' boundaries. Writes nothing.

    \b
    --json: {"spec", "experiment", "metric", "direction", "baseline", "arms_compared", "alpha",
    "alpha_per_arm", "multiplicity", "power", "effect", "effect_sd", "sigma": {"value", "source", "df",
    "experiments"}, "spec_seeds", "mde_at_spec_seeds": {"value", "sd"}, "arms": {ARM: {"seeds",
    "seeds_robust", "gpu_hours_per_run", "gpu_hours", "gpu_hours_robust", "mde_at_spec_seeds",
    "mde_sd_at_spec_seeds"}}, "baseline_row", "total": {"seeds", "seeds_robust", "gpu_hours",
    "gpu_hours_robust", "gpu_hours_at_spec_seeds", "max_gpu_hours", "within_caps", "caps"},
    "cost_basis", "design": {"kind", ...}}
    """
    from ..control.planning import plan as make_plan
    from ..control.planning import text
    from ..spec.parse import load_spec

    if effect is not None and effect_sd is not None:
        raise click.UsageError("give --effect or --effect-sd, not both")
    spec = load_spec(spec_file)
    p = make_plan(app.ledger(), app.settings, spec, metric=metric, effect=effect, effect_sd=effect_sd, power=target,
                  alpha=alpha, sigma=sigma, sources=sources or None, user=app.settings.user)
    if as_json:
        echo_json("plan", p)
        return
    for line in text(p):
        click.echo(line)


@cli.command()
@click.argument("experiment", nargs=1, callback=lambda c, p, v: _which(c, p, (v,))[0],
                metavar="EXPERIMENT[@VERSION]")
@_METRIC
@click.option("--version", "version", type=int, callback=VERSION_VALUE, help="Experiment version (default: the latest).")
@click.option("--baseline", callback=ARM_VALUE, help="As report --baseline (default: the spec's).")
@click.option("--outcomes", "outcome_set", callback=ARM_VALUE, help="As report --outcomes (default: training).")
@click.option("--max-seeds", type=click.IntRange(2, 1000),
              help="The most seeds per arm a recommendation may ask for (default: the spec's [power], else 10).")
@click.option("--max-gpu-hours", type=float, callback=FINITE_VALUE,
              help="The budget a recommendation must fit (default: the experiment's cap).")
@click.option("--sigma", type=float, callback=FINITE_VALUE,
              help="The sd of the paired differences (default: pooled over this experiment's comparisons).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_reader
def advise(app: App, experiment: tuple[str, int | None], metric: str | None, version: int | None,
           baseline: str | None, outcome_set: str | None, max_seeds: int | None, max_gpu_hours: float | None,
           sigma: float | None, as_json: bool) -> None:
    """Per arm against the baseline: the paired difference with its interval and p (Holm over the
    arms), the smallest difference the seeds run detect, and a verdict: stop (detected after the
    correction, or the seeds the effect needs ran and did not detect it), add N seeds (their GPU-h at
    the measured cost per run, and the probability they end in a decision), or not worth it (no
    number of seeds, more than --max-seeds, or more GPU-h than the cap leaves: `decide` records it).
    Read-only.

    \b
    --json: {"experiment", "version", "metric", "baseline", "alpha", "alpha_per_arm", "multiplicity",
    "power", "effect", "effect_source", "sigma": {"value", "df", "source"}, "max_seeds",
    "spent_gpu_hours", "cap_gpu_hours", "remaining_gpu_hours", "arms": {ARM: {"n", "mean", "ci95",
    "p", "p_adjusted", "per_seed", "effect", "mde", "seeds_needed", "seeds_needed_robust", "add_seeds",
    "add_gpu_hours", "predictive_success", "look", "verdict", "reason"}}}; "look" (a sequential [power]
    design: the look the seeds reach, its |t| and boundary, crossed, futile, the next wave) decides the
    verdict then, and the next wave is the planned one.
    """
    from ..reporting.advice import advise as make_advice
    from ..reporting.advice import text

    name, at = experiment
    if at is not None and version is not None and at != version:
        raise click.UsageError(f"{name}@{at} and --version {version} disagree")
    if sigma is not None and sigma <= 0:
        raise click.UsageError("--sigma must be > 0")
    a = make_advice(app.ledger(), name, version=at if at is not None else version, metric=metric, baseline=baseline,
                    outcomes=outcome_set, max_seeds=max_seeds, max_gpu_hours=max_gpu_hours, sigma=sigma)
    if as_json:
        echo_json("advise", a)
        return
    for line in text(a):
        click.echo(line)
