"""The bind rule, the token's form, and the scrub every page and API body passes through."""

from __future__ import annotations

import pytest

from ggpo_batch.config.settings import dashboard_token
from ggpo_batch.dashboard.access import bind_problem, is_local, scrub
from ggpo_batch.errors import ConfigError


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "localhost", "::1", "[::1]"])
def test_a_loopback_bind_needs_no_token(host: str) -> None:
    assert is_local(host) and bind_problem(host, None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.7", "dashboard.example.org"])
def test_any_other_bind_needs_the_token(host: str) -> None:
    problem = bind_problem(host, None)
    assert problem is not None and "GGPO_DASHBOARD_TOKEN" in problem and host in problem
    assert bind_problem(host, "x" * 32) is None


@pytest.mark.parametrize("raw", ["short", "has space inside 1234", "semi;colon;0123456789", "quote\"0123456789abcdef"])
def test_a_token_too_short_or_unfit_for_a_header_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="GGPO_DASHBOARD_TOKEN: must be at least 16"):
        dashboard_token({"GGPO_DASHBOARD_TOKEN": raw})


def test_unset_token_is_none_and_a_set_one_is_hidden_wherever_it_appears() -> None:
    assert dashboard_token({}) is None and dashboard_token({"GGPO_DASHBOARD_TOKEN": "  "}) is None
    token = "tok-Ab12Cd34Ef56Gh78"
    assert dashboard_token({"GGPO_DASHBOARD_TOKEN": token}) == token
    shown = scrub({"cause": f"sent {token} to x", token: [f"({token})", 3]})
    assert token not in repr(shown)
    assert shown == {"cause": "sent *** to x", "***": ["(***)", 3]}


def test_scrub_hides_url_passwords_in_nested_values_and_keeps_the_rest() -> None:
    data = {"runs": [{"cause": "lost postgresql://ledger:pA55-w0rd@db:5432/x (timeout)", "steps": 4,
                      "log": ("redis://:s3cr3t-redis@cache:6379/0 refused",)}], "gpu_hours": 1.5}
    shown = scrub(data)
    assert "pA55-w0rd" not in repr(shown) and "s3cr3t-redis" not in repr(shown)
    assert shown["runs"][0]["cause"] == "lost postgresql://ledger:***@db:5432/x (timeout)"
    assert shown["runs"][0]["log"] == ["redis://:***@cache:6379/0 refused"]
    assert shown["runs"][0]["steps"] == 4 and shown["gpu_hours"] == 1.5
