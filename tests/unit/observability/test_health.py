"""ProxyHealth follows kube-proxy's healthz semantics, with an injected clock."""

from __future__ import annotations

import json

import pytest

from kproxy.errors import InvalidArgument
from kproxy.observability import ProxyHealth, go_time
from kproxy.sync import FakeClock


def _health(timeout_s: float = 60.0) -> tuple[ProxyHealth, FakeClock]:
    clock = FakeClock()
    return ProxyHealth(timeout_s, clock=clock, wall=lambda: 1_700_000_000.0 + clock.now()), clock


def test_healthy_while_starting_up_even_with_an_old_queued_change() -> None:
    """Before the first successful sync the proxy is healthy, as kube-proxy's start-up rule."""
    health, clock = _health()
    health.queued()
    clock.advance(600)
    assert health.is_healthy()


def test_unhealthy_once_the_oldest_change_waited_the_timeout() -> None:
    """After a sync, a change waiting exactly the timeout makes /healthz and /livez answer 503."""
    health, clock = _health(60)
    health.updated()
    health.queued()
    clock.advance(59.999)
    assert health.healthz().status == 200
    clock.advance(0.001)
    assert health.healthz().status == 503
    assert health.livez().status == 503


def test_new_changes_do_not_reset_the_oldest() -> None:
    """Changes arriving while syncs fail keep the first queued time, so the proxy turns unhealthy."""
    health, clock = _health(60)
    health.updated()
    for _ in range(7):
        health.queued()
        clock.advance(10)
    assert not health.is_healthy()


def test_healthy_again_after_a_successful_sync() -> None:
    """A successful sync forgets the queued change."""
    health, clock = _health(60)
    health.updated()
    health.queued()
    clock.advance(120)
    health.updated()
    assert health.is_healthy()


def test_ineligible_node_fails_healthz_but_not_livez() -> None:
    """nodeEligible false makes /healthz 503 while /livez stays 200."""
    health, _ = _health()
    health.node_eligible = False
    assert health.healthz().status == 503
    assert json.loads(health.healthz().body)["nodeEligible"] is False
    assert health.livez().status == 200


def test_body_is_kube_proxys_json_with_go_times() -> None:
    """Healthy answers report lastUpdated equal to currentTime, as kube-proxy does."""
    health, _ = _health()
    doc = json.loads(health.healthz().body)
    assert doc == {
        "lastUpdated": "2023-11-14 22:13:20 +0000 UTC",
        "currentTime": "2023-11-14 22:13:20 +0000 UTC",
        "nodeEligible": True,
    }
    assert set(json.loads(health.livez().body)) == {"lastUpdated", "currentTime"}


def test_unhealthy_body_reports_the_last_update() -> None:
    """An unhealthy answer's lastUpdated is the last successful sync, not now."""
    health, clock = _health(1)
    health.updated()
    health.queued()
    clock.advance(2.5)
    doc = json.loads(health.healthz().body)
    assert doc["lastUpdated"] == "2023-11-14 22:13:20 +0000 UTC"
    assert doc["currentTime"] == "2023-11-14 22:13:22.5 +0000 UTC"


@pytest.mark.parametrize(
    ("epoch", "text"),
    [
        (None, "0001-01-01 00:00:00 +0000 UTC"),
        (0.0, "1970-01-01 00:00:00 +0000 UTC"),
        (1.25, "1970-01-01 00:00:01.25 +0000 UTC"),
        (1.123456789, "1970-01-01 00:00:01.123456789 +0000 UTC"),
    ],
)
def test_go_time_matches_gos_string_format(epoch: float | None, text: str) -> None:
    """go_time prints Go's time.Time.String() layout in UTC, fractions without trailing zeros."""
    assert go_time(epoch) == text


def test_timeout_must_be_positive() -> None:
    """A zero health timeout is refused, naming the argument."""
    with pytest.raises(InvalidArgument, match="timeout_s"):
        ProxyHealth(0, clock=FakeClock(), wall=lambda: 0.0)
