"""Unit tests of the pure round-robin balancer (kube-proxy's roundrobin.go semantics)."""

from __future__ import annotations

import random

import pytest

from kproxy.errors import InvalidArgument, NoEndpointsError
from kproxy.modes.userspace import DEFAULT_AFFINITY_TTL_S, RoundRobinBalancer

EPS = ["10.0.0.3:80", "10.0.0.1:80", "10.0.0.2:80"]


def test_round_robin_in_address_order() -> None:
    """Without affinity endpoints are handed out in sorted address order, cycling."""
    lb = RoundRobinBalancer(EPS)
    got = [lb.next_endpoint("1.1.1.1", 0.0) for _ in range(6)]
    assert got == ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"] * 2


def test_no_endpoints_raises() -> None:
    """An empty balancer raises NoEndpointsError naming the service port."""
    lb = RoundRobinBalancer(name="ns/web:http")
    with pytest.raises(NoEndpointsError, match="ns/web:http"):
        lb.next_endpoint("1.1.1.1", 0.0)


def test_affinity_reused_and_refreshed_within_ttl() -> None:
    """A client keeps its endpoint while each gap is under the TTL, since every hit refreshes it."""
    lb = RoundRobinBalancer(EPS, affinity_ttl_s=10)
    first = lb.next_endpoint("1.1.1.1", 100.0)
    assert [lb.next_endpoint("1.1.1.1", 100.0 + 9 * k) for k in range(1, 5)] == [first] * 4
    assert lb.affinity["1.1.1.1"] == (first, 136.0)


def test_affinity_expires_at_exactly_ttl() -> None:
    """At now - last_used == ttl the entry no longer holds and the next endpoint is recorded."""
    lb = RoundRobinBalancer(EPS, affinity_ttl_s=10)
    first = lb.next_endpoint("1.1.1.1", 0.0)
    second = lb.next_endpoint("1.1.1.1", 10.0)
    assert second != first
    assert lb.affinity["1.1.1.1"] == (second, 10.0)


def test_affinity_is_per_client_ip() -> None:
    """Different client IPs get different endpoints by round robin and each keeps its own."""
    lb = RoundRobinBalancer(EPS, affinity_ttl_s=10)
    a = lb.next_endpoint("1.1.1.1", 0.0)
    b = lb.next_endpoint("2.2.2.2", 0.0)
    assert a != b
    assert lb.next_endpoint("1.1.1.1", 1.0) == a and lb.next_endpoint("2.2.2.2", 1.0) == b


def test_reset_affinity_moves_on_and_records() -> None:
    """reset_affinity skips the held endpoint (a retry after a failed dial) and records the new one."""
    lb = RoundRobinBalancer(EPS, affinity_ttl_s=10)
    first = lb.next_endpoint("1.1.1.1", 0.0)
    retry = lb.next_endpoint("1.1.1.1", 0.0, reset_affinity=True)
    assert retry != first
    assert lb.next_endpoint("1.1.1.1", 1.0) == retry


def test_update_drops_stale_affinity_and_continues_rotation() -> None:
    """A changed endpoint set drops entries for endpoints that left and continues after the last pick."""
    lb = RoundRobinBalancer(EPS, affinity_ttl_s=10)
    a = lb.next_endpoint("1.1.1.1", 0.0)  # 10.0.0.1
    b = lb.next_endpoint("2.2.2.2", 0.0)  # 10.0.0.2
    assert lb.update(["10.0.0.2:80", "10.0.0.4:80"])
    assert "1.1.1.1" not in lb.affinity and lb.affinity["2.2.2.2"][0] == b
    assert lb.next_endpoint("3.3.3.3", 0.0) == "10.0.0.4:80"  # after 10.0.0.2, not back to the start
    assert a == "10.0.0.1:80"


def test_rotation_continues_after_a_removed_last_endpoint() -> None:
    """When the endpoint handed out last leaves, the rotation goes on with the one after its place."""
    lb = RoundRobinBalancer(EPS)
    assert lb.next_endpoint("1.1.1.1", 0.0) == "10.0.0.1:80"
    assert lb.next_endpoint("1.1.1.1", 0.0) == "10.0.0.2:80"
    lb.update(["10.0.0.1:80", "10.0.0.3:80"])
    got = [lb.next_endpoint("1.1.1.1", 0.0) for _ in range(3)]
    assert got == ["10.0.0.3:80", "10.0.0.1:80", "10.0.0.3:80"]


def test_one_flapping_endpoint_does_not_starve_the_others() -> None:
    """With five endpoints and one flapping every two picks, the four steady ones share the picks evenly."""
    eps = [f"10.0.0.{i}:80" for i in range(1, 6)]
    lb = RoundRobinBalancer(eps)
    got = []
    for i in range(20):
        if i % 2 == 0:
            lb.update(eps if (i // 2) % 2 else eps[:-1])
        got.append(lb.next_endpoint("1.1.1.1", 0.0))
    assert [got.count(ep) for ep in eps[:-1]] == [5, 5, 5, 5], got


def test_update_with_same_set_is_a_no_op() -> None:
    """The same endpoints in another order change nothing, not even the rotation index."""
    lb = RoundRobinBalancer(EPS)
    lb.next_endpoint("1.1.1.1", 0.0)
    assert not lb.update(reversed(EPS))
    assert lb.next_endpoint("1.1.1.1", 0.0) == "10.0.0.2:80"


def test_empty_update_wipes_affinity() -> None:
    """Losing every endpoint wipes the whole affinity map, as roundrobin.go's resetService."""
    lb = RoundRobinBalancer(EPS, affinity_ttl_s=10)
    lb.next_endpoint("1.1.1.1", 0.0)
    lb.update([])
    assert dict(lb.affinity) == {} and lb.endpoints == ()


def test_injected_rng_shuffles_deterministically() -> None:
    """With an injected Random the order is a seeded shuffle, reproducible for the same seed."""
    eps = [f"10.0.0.{i}:80" for i in range(10)]
    one = RoundRobinBalancer(eps, rng=random.Random(7)).endpoints
    two = RoundRobinBalancer(eps, rng=random.Random(7)).endpoints
    assert one == two and sorted(one) == sorted(eps)


def test_zero_ttl_means_default_and_negative_raises() -> None:
    """A TTL of 0 means 10800 s as in roundrobin.go, and a negative TTL is rejected."""
    assert RoundRobinBalancer(EPS, affinity_ttl_s=0).affinity_ttl_s == DEFAULT_AFFINITY_TTL_S
    with pytest.raises(InvalidArgument, match="affinity_ttl_s"):
        RoundRobinBalancer(EPS, affinity_ttl_s=-1)


def test_cleanup_stale_affinity() -> None:
    """cleanup_stale_affinity drops only entries whose age reached the TTL."""
    lb = RoundRobinBalancer(EPS, affinity_ttl_s=10)
    lb.next_endpoint("1.1.1.1", 0.0)
    lb.next_endpoint("2.2.2.2", 5.0)
    assert lb.cleanup_stale_affinity(10.0) == 1
    assert set(lb.affinity) == {"2.2.2.2"}


def test_connection_counts() -> None:
    """acquire and release keep per-endpoint counts, also for an endpoint that left, and reject underflow."""
    lb = RoundRobinBalancer(EPS)
    lb.acquire("10.0.0.1:80")
    lb.acquire("10.0.0.1:80")
    lb.acquire("10.0.0.2:80")
    lb.update(["10.0.0.2:80"])
    assert lb.active_connections("10.0.0.1:80") == 2 and lb.active_connections() == 3
    lb.release("10.0.0.1:80")
    lb.release("10.0.0.1:80")
    assert dict(lb.connection_counts()) == {"10.0.0.2:80": 1}
    with pytest.raises(InvalidArgument):
        lb.release("10.0.0.1:80")
