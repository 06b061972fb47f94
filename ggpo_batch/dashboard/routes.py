"""The dashboard's ASGI app: routes, pages rendered from the templates, the JSON API.

Every page is rendered on the server from `views` (the library calls the CLI uses); a few lines of
JavaScript (static/dashboard.js) refresh the parts marked live from their fragment routes. Every
body passes through `access.scrub` before it leaves; with a token, `access.TokenGate` guards every
route. Read-only: GET (and HEAD) only.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..common import limits
from ..common import schemas
from ..config.settings import Settings
from ..contracts.states import RUN_STATES
from ..errors import GgpoError, LedgerError
from . import views
from .access import TokenGate, is_local, scrub
from .operations import operation_routes

# Seconds between refreshes of the live parts (run tables, a run's attempts and logs; the index).
LIVE_EVERY_MS = 2000
INDEX_EVERY_MS = 10000
RESULTS_EVERY_MS = 60000
CURVES_EVERY_MS = 5000  # the curves: a running job's file grows a point a step (train/live_progress.py)
# A page waits this long for an unreachable ledger to answer again (the CLI: 120 s), then is a 503.
LEDGER_RETRY_SECONDS = 10
# No script, style or image from anywhere else; plots are data: URIs; no framing.
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class BadRequest(GgpoError):
    """A query parameter that cannot be used: 400."""


def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _when(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        v = datetime.fromtimestamp(v, tz=UTC)
    return v.strftime("%Y-%m-%d %H:%M:%S") if isinstance(v, datetime) else str(v)


def _templates() -> Environment:
    env = Environment(loader=PackageLoader("ggpo_batch.dashboard", "templates"),
                      autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    env.filters["when"] = _when
    env.globals.update(live_every=LIVE_EVERY_MS, index_every=INDEX_EVERY_MS, results_every=RESULTS_EVERY_MS,
                       curves_every=CURVES_EVERY_MS)
    return env


def _json_text(data: Any) -> str:
    # The same serialization as `status --json` (sort_keys, default=str), after the scrub; strict JSON:
    # a figure that is not finite (a live file's, a ledger's from elsewhere) is null, never Infinity/NaN.
    return json.dumps(_finite(scrub(data)), indent=2, sort_keys=True, default=str, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _version(request: Request) -> int | None:
    raw = request.query_params.get("version")
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"version={raw!r}: must be a whole number") from None
    problem = limits.version_problem(value)
    if problem:
        raise BadRequest(f"version: {problem}")
    return value


def _name(request: Request, key: str = "name", check: Callable[[str], str | None] = limits.name_problem) -> str:
    value = request.path_params[key]
    problem = check(value)
    if problem:
        raise BadRequest(f"{key}: {problem}")
    return value


def _status_args(request: Request) -> dict[str, Any]:
    """`status`'s options as query parameters: experiment, state (repeatable), runs, limit."""
    q = request.query_params
    experiment = q.get("experiment") or None
    if experiment is not None and (problem := limits.name_problem(experiment)):
        raise BadRequest(f"experiment: {problem}")
    states = q.getlist("state")
    bad = [s for s in states if s not in RUN_STATES]
    if bad:
        raise BadRequest(f"state={bad[0]!r}: states are {', '.join(RUN_STATES)}")
    limit = None
    if q.get("limit") not in (None, ""):
        try:
            limit = int(q["limit"])
        except ValueError:
            raise BadRequest(f"limit={q['limit']!r}: must be a whole number >= 0") from None
        if limit < 0 or (problem := limits.count_problem(limit)):
            raise BadRequest(f"limit={q['limit']!r}: must be a whole number >= 0")
    return {"experiment": experiment, "states": states, "all_runs": q.get("runs") in ("1", "true", "yes"),
            "limit": limit}


def _float_arg(request: Request, key: str, default: float, lo: float, hi: float) -> float:
    raw = request.query_params.get(key)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not lo <= value <= hi:
        raise BadRequest(f"{key}={raw!r}: must be a number from {lo:g} to {hi:g}")
    return value


def _costs_args(request: Request) -> dict[str, Any]:
    """`costs`' options as query parameters: by (user | experiment | queue | month), since (YYYY-MM-DD)."""
    from datetime import date

    from ..contracts.accounting import COST_GROUPS

    q = request.query_params
    by = q.get("by") or "user"
    if by not in COST_GROUPS:
        raise BadRequest(f"by={by!r}: one of {', '.join(COST_GROUPS)}")
    since = None
    if q.get("since"):
        try:
            since = date.fromisoformat(q["since"])
        except ValueError:
            raise BadRequest(f"since={q['since']!r}: a day, YYYY-MM-DD") from None
    return {"by": by, "since": since}


def create_app(settings: Settings, *, token: str | None = None, host: str = "127.0.0.1") -> Starlette:
    """The dashboard over the ledger of `settings` (opened now: a ledger behind its schema fails here,
    before anything listens). `token`: required on every request; `host`: the bind address (a
    loopback bind answers only to loopback Host names, against DNS rebinding)."""
    from ..ledger import connect

    ledger = connect(settings.db_url, retry_seconds=LEDGER_RETRY_SECONDS, reading=True)  # it writes nothing
    templates = _templates()

    def page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
        html = templates.get_template(template).render(request=request, **scrub(context))
        return HTMLResponse(scrub(html), status_code=status_code, headers=_SECURITY_HEADERS)

    def api(data: Any, status_code: int = 200) -> Response:
        return Response(_json_text(data), status_code=status_code, media_type="application/json",
                        headers=_SECURITY_HEADERS)

    def handled(fn: Callable[[Request], Response], *, json_api: bool = False) -> Callable[[Request], Response]:
        """A sync endpoint (Starlette runs it in its threadpool) with the error contract: an unknown
        experiment or run is 404, a bad parameter 400, an unreachable ledger 503, each with one line
        saying what was wrong (scrubbed like everything else)."""

        def endpoint(request: Request) -> Response:
            try:
                return fn(request)
            except GgpoError as exc:
                code, message = (404 if isinstance(exc, LedgerError) else 400), exc.message
            except (OperationalError, InterfaceError) as exc:  # the ledger's database went away: try later
                code, message = 503, f"the ledger database is unavailable: {str(exc.orig or exc).strip()[:300]}"
            if json_api:
                return api({"error": message}, code)
            return page(request, "error.html", code, message=message, code=code)

        return endpoint

    def index(request: Request) -> Response:
        return page(request, "index.html", data=views.experiments_index(ledger, settings))

    def index_fragment(request: Request) -> Response:
        return page(request, "_index.html", data=views.experiments_index(ledger, settings))

    def experiment(request: Request) -> Response:
        name, version = _name(request), _version(request)
        live = views.experiment_live(ledger, settings, name, version)
        results = views.experiment_results(ledger, name, live["version"])
        curves = views.experiment_curves_view(ledger, settings, name, live["version"])
        return page(request, "experiment.html", live=live, results=results, curves=curves)

    def experiment_runs(request: Request) -> Response:
        return page(request, "_runs.html", live=views.experiment_live(ledger, settings, _name(request), _version(request)))

    def experiment_results(request: Request) -> Response:
        return page(request, "_results.html",
                    results=views.experiment_results(ledger, _name(request), _version(request)))

    def experiment_curves(request: Request) -> Response:
        return page(request, "_curves.html",
                    curves=views.experiment_curves_view(ledger, settings, _name(request), _version(request)))

    def api_curves(request: Request) -> Response:
        from ..reporting.learning_curves import experiment_curves

        return api(schemas.versioned("curves", experiment_curves(ledger, _name(request), _version(request),
                                                         jobs_dir=settings.jobs_dir)))

    def run(request: Request) -> Response:
        return page(request, "run.html", view=views.run_view(ledger, settings, _name(request, "run_key",
                                                                                      limits.run_key_problem)))

    def run_fragment(request: Request) -> Response:
        return page(request, "_run.html", view=views.run_view(ledger, settings, _name(request, "run_key",
                                                                                       limits.run_key_problem)))

    def nightly(request: Request) -> Response:
        nights = int(_float_arg(request, "nights", views.NIGHTS, 1, 365))
        return page(request, "nightly.html", data=views.nightly_view(
            ledger, nights=nights, threshold=_float_arg(request, "threshold", views.THRESHOLD, 0, 1e6))["components"])

    def costs(request: Request) -> Response:
        from ..contracts.accounting import COST_GROUPS
        from ..reporting.spending import cost_view

        view = cost_view(ledger, **_costs_args(request), default_queue=settings.queue)
        return page(request, "costs.html", view=view, groups=COST_GROUPS)

    def api_costs(request: Request) -> Response:
        from ..reporting.spending import cost_view

        return api(schemas.versioned("costs", cost_view(ledger, **_costs_args(request), default_queue=settings.queue)))

    def api_status(request: Request) -> Response:
        return api(schemas.versioned("status", views.status_document(ledger, settings, **_status_args(request))))

    def api_components(request: Request) -> Response:
        nights = int(_float_arg(request, "nights", views.NIGHTS, 1, 365))
        return api(schemas.versioned("components", views.nightly_view(
            ledger, nights=nights, threshold=_float_arg(request, "threshold", views.THRESHOLD, 0, 1e6))))

    def api_experiment(request: Request) -> Response:
        from ..reporting.report import experiment_report

        name, version = _name(request), _version(request)
        live = views.experiment_live(ledger, settings, name, version)
        return api(schemas.versioned("dashboard_experiment",
                             {"status": live, "report": experiment_report(ledger, name, version=live["version"])}))

    def api_run(request: Request) -> Response:
        return api(schemas.versioned("dashboard_run",
                             views.run_view(ledger, settings, _name(request, "run_key", limits.run_key_problem))))

    routes = [
        Route("/", handled(index)),
        Route("/fragments/index", handled(index_fragment)),
        Route("/experiments/{name}", handled(experiment)),
        Route("/fragments/experiments/{name}/runs", handled(experiment_runs)),
        Route("/fragments/experiments/{name}/results", handled(experiment_results)),
        Route("/fragments/experiments/{name}/curves", handled(experiment_curves)),
        Route("/runs/{run_key}", handled(run)),
        Route("/fragments/runs/{run_key}", handled(run_fragment)),
        Route("/nightly", handled(nightly)),
        Route("/costs", handled(costs)),
        Route("/favicon.ico", lambda _request: Response(status_code=204)),  # none: no 404 in the console
        Route("/api/status", handled(api_status, json_api=True)),
        Route("/api/components", handled(api_components, json_api=True)),
        Route("/api/costs", handled(api_costs, json_api=True)),
        Route("/api/experiments/{name}", handled(api_experiment, json_api=True)),
        Route("/api/experiments/{name}/curves", handled(api_curves, json_api=True)),
        Route("/api/runs/{run_key}", handled(api_run, json_api=True)),
        *operation_routes(ledger, settings),  # /metrics, /healthz
        Mount("/static", StaticFiles(packages=[("ggpo_batch.dashboard", "static")]), name="static"),
    ]

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        ledger.engine.dispose()

    hosts = ["127.0.0.1", "localhost", "::1", "[::1]"] if is_local(host) else ["*"]
    middleware = [Middleware(TokenGate, token=token), Middleware(TrustedHostMiddleware, allowed_hosts=hosts)]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
