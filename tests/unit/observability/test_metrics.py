"""Metric names, buckets and registries follow kube-proxy and stay per object."""

from __future__ import annotations

import pytest

from kproxy.errors import ConfigError
from kproxy.model import NodeConfig, build_snapshot, parse_objects
from kproxy.observability import (
    NETWORK_PROGRAMMING_BUCKETS,
    SYNC_DURATION_BUCKETS,
    ProxyMetrics,
    health_check_ports,
    local_ready_endpoints,
    parse_trigger_time,
)
from kproxy.observability.http import parse_bind_address
from tests.fakeapi import endpoint_slice, service


def test_sync_buckets_are_exponential_from_one_millisecond() -> None:
    """ExponentialBuckets(0.001, 2, 15): 1 ms to 16.384 s."""
    assert len(SYNC_DURATION_BUCKETS) == 15
    assert SYNC_DURATION_BUCKETS[0] == 0.001 and SYNC_DURATION_BUCKETS[-1] == pytest.approx(16.384)


def test_network_programming_buckets_are_kube_proxys() -> None:
    """0, 0.25, 0.5, then 1..59 s, 60..115 s by 5, 120..300 s by 30."""
    b = NETWORK_PROGRAMMING_BUCKETS
    assert b[:4] == (0.0, 0.25, 0.5, 1.0)
    assert len(b) == 1 + 2 + 59 + 12 + 7
    assert b[-1] == 300.0 and 115.0 in b and 59.0 in b


def test_each_metrics_object_has_its_own_registry() -> None:
    """Two ProxyMetrics in one process do not share (or collide on) a registry."""
    a, b = ProxyMetrics(wall=lambda: 1.0), ProxyMetrics(wall=lambda: 2.0)
    a.synced(0.01)
    assert b"kubeproxy_sync_proxy_rules_duration_seconds_count 1.0" in a.render()
    assert b"kubeproxy_sync_proxy_rules_duration_seconds_count 0.0" in b.render()


def test_timestamps_are_per_ip_family() -> None:
    """Last sync and last queued timestamps carry kube-proxy's ip_family label."""
    m = ProxyMetrics(families=("IPv4", "IPv6"), wall=lambda: 42.0)
    m.queued()
    m.synced(0.1)
    text = m.render().decode()
    assert 'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 42.0' in text
    assert 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 42.0' in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-02T03:04:05Z", 1704164645.0),
        ("2024-01-02T03:04:05.5Z", 1704164645.5),
        ("2024-01-02T03:04:05.123456789Z", 1704164645.123456),
        ("", None),
        ("yesterday", None),
    ],
)
def test_trigger_time_parsing(text: str, expected: float | None) -> None:
    """RFC 3339 trigger times (with up to nanoseconds) become epoch seconds; bad ones are None."""
    got = parse_trigger_time(text)
    assert got == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:10256", ("127.0.0.1", 10256)),
        ("0.0.0.0", ("0.0.0.0", 10256)),
        ("[::1]:9", ("::1", 9)),
        ("::", ("::", 10256)),
        ("", None),
    ],
)
def test_bind_addresses_as_kube_proxy_writes_them(text: str, expected: tuple[str, int] | None) -> None:
    """IP:PORT, a bare IP (default port appended), [IPv6]:PORT, and "" (disabled)."""
    assert parse_bind_address(text, default_port=10256, flag="--healthz-bind-address") == expected


@pytest.mark.parametrize("text", ["localhost:10256", "1.2.3.4:99999", "[::1"])
def test_bad_bind_address_names_the_flag(text: str) -> None:
    """A malformed address is a ConfigError naming the flag."""
    with pytest.raises(ConfigError, match="--metrics-bind-address"):
        parse_bind_address(text, default_port=10249, flag="--metrics-bind-address")


def test_health_check_ports_and_local_ready_endpoint_counts() -> None:
    """Only Services with a healthCheckNodePort are served; counts are distinct local ready IPs."""
    lb = service(
        "lb", "10.96.0.70", type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=32000
    )
    lb["spec"]["ports"][0]["nodePort"] = 30080
    raw = [
        lb,
        service("plain", "10.96.0.71"),
        endpoint_slice("lb", ["10.0.0.1", "10.0.0.2"], 80, name="lb-a", node_name="node-a"),
        endpoint_slice("lb", ["10.0.0.3"], 80, name="lb-b", node_name="node-b"),
        endpoint_slice("lb", ["10.0.0.4"], 80, name="lb-c", node_name="node-a", ready=False),
    ]
    result = parse_objects({"apiVersion": "v1", "kind": "List", "items": raw})
    assert not result.problems
    from kproxy.model import EndpointSlice, Service

    services = [o for o in result.objects if isinstance(o, Service)]
    slices = [o for o in result.objects if isinstance(o, EndpointSlice)]
    snap = build_snapshot(services, slices, NodeConfig(hostname="node-a"))
    assert {str(k): v for k, v in health_check_ports(snap).items()} == {"default/lb": 32000}
    assert {str(k): v for k, v in local_ready_endpoints(snap).items()} == {"default/lb": 2}
