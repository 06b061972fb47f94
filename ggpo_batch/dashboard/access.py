"""Who may read the dashboard, and what it may never show.

Bind rule: 127.0.0.1 (or another loopback address) by default; any other address only with a token
(GGPO_DASHBOARD_TOKEN, read by `config.dashboard_token`). With a token, every request carries it:
`Authorization: Bearer TOKEN` (scripts, the API), or `?token=TOKEN` once in a browser, which sets a
cookie and redirects to the same page without the token in its address. The cookie holds an HMAC of
the token, not the token. No token: 401; a wrong one: 403.

Secrets: every string a page or the API shows passes through `scrub` (ggpo_batch/config/masking.py, as every
command's output: URL passwords, the configured DB/Redis/MLflow passwords, the token itself).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import (
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)

from ..config.masking import scrub  # noqa: F401  (every page and API body is masked as the CLI's output is)
from ..config.settings import DASHBOARD_TOKEN_ENV

COOKIE = "ggpo_dashboard"
# Open without the token: the favicon (an empty 204: a browser asks for it even on the 401 page) and
# the health probe (a load balancer's or Prometheus' blackbox check; its body names no secret).
OPEN_PATHS = frozenset({"/favicon.ico", "/healthz"})
LOCAL_NAMES = ("localhost",)


def is_local(host: str) -> bool:
    """True for a loopback address (127.0.0.0/8, ::1) or `localhost`."""
    if host.lower() in LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_problem(host: str, token: str | None) -> str | None:
    """Why the dashboard may not listen on `host`, or None."""
    if is_local(host) or token:
        return None
    return (f"--host {host} is not a loopback address: the dashboard would be readable by anyone who can reach "
            f"this machine; set {DASHBOARD_TOKEN_ENV} (every request must then carry it), or bind 127.0.0.1 and "
            f"use an SSH tunnel")


def _session_value(token: str) -> str:
    return hmac.new(token.encode(), b"ggpo-dashboard-session", hashlib.sha256).hexdigest()


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _refused(request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status, headers={"WWW-Authenticate": "Bearer"})
    return PlainTextResponse(message + "\n", status_code=status, headers={"WWW-Authenticate": "Bearer"})


class TokenGate:
    """ASGI middleware: with a token configured, a request without it gets 401, a wrong one 403."""

    def __init__(self, app: Callable[..., Awaitable[None]], token: str | None) -> None:
        self.app = app
        self.token = token
        self.session = _session_value(token) if token else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if self.token is None or scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        response = self._check(request)
        if response is None:
            await self.app(scope, receive, send)
        else:
            await response(scope, receive, send)

    def _check(self, request: Request) -> Response | None:
        assert self.token is not None and self.session is not None
        given = request.query_params.get("token")
        if given is not None:
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return _refused(request, 403, "wrong dashboard token")
            # Into a cookie, and out of the address bar (history, a screenshot, a shared link).
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = request.url.path + ("?" + urlencode(rest) if rest else "")
            redirect = RedirectResponse(target, status_code=303)
            redirect.set_cookie(COOKIE, self.session, httponly=True, samesite="strict", path="/")
            return redirect
        bearer = _bearer(request)
        if bearer is not None:
            return None if hmac.compare_digest(bearer.encode(), self.token.encode()) else \
                _refused(request, 403, "wrong dashboard token")
        cookie = request.cookies.get(COOKIE)
        if cookie is not None:
            return None if hmac.compare_digest(cookie.encode(), self.session.encode()) else \
                _refused(request, 403, "stale dashboard cookie: open the dashboard with ?token=... again")
        return _refused(request, 401, f"this dashboard needs its token ({DASHBOARD_TOKEN_ENV}): open it with "
                                      f"?token=... once, or send the header Authorization: Bearer ...")
