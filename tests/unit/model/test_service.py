"""parse_service: v1 Service defaults (pkg/apis/core/v1/defaults.go) and validation."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.errors import InvalidObject
from kproxy.model import (
    DEFAULT_AFFINITY_TIMEOUT_S,
    Protocol,
    Service,
    ServiceType,
    TrafficPolicy,
    parse_objects,
    parse_service,
)

from .builders import port, service


def _ok(raw: dict[str, Any]) -> Service:
    svc, problems = parse_service(raw, source="svc.yaml")
    assert problems == [], [str(p) for p in problems]
    return svc


def test_defaults_of_a_minimal_service() -> None:
    """An empty type, protocol and targetPort default to ClusterIP, TCP and the port."""
    svc = _ok(service(ports=[{"port": 80}]))
    assert svc.type is ServiceType.ClusterIP
    assert svc.namespace == "ns"
    (p,) = svc.ports
    assert (p.name, p.protocol, p.port, p.target_port, p.node_port) == ("", Protocol.TCP, 80, 80, 0)


def test_missing_namespace_defaults_to_default() -> None:
    """A Service without ``metadata.namespace`` lives in ``default``."""
    raw = service()
    del raw["metadata"]["namespace"]
    assert _ok(raw).namespace == "default"


@pytest.mark.parametrize("target", [None, 0, ""])
def test_empty_target_port_defaults_to_port(target: Any) -> None:
    """A targetPort of 0 or "" (or none) becomes the port (SetDefaults_Service)."""
    raw = service(ports=[{"port": 80, "targetPort": target}])
    assert _ok(raw).ports[0].target_port == 80


@pytest.mark.parametrize(("target", "expected"), [(8080, 8080), ("8080", 8080), ("http-alt", "http-alt")])
def test_target_port_number_or_name(target: Any, expected: int | str) -> None:
    """A numeric targetPort is a number and any other string a container port name."""
    assert _ok(service(ports=[port(target=target)])).ports[0].target_port == expected


def test_traffic_policies_default_to_cluster() -> None:
    """Without traffic policies both default to Cluster."""
    svc = _ok(service(type="NodePort"))
    assert svc.external_traffic_policy is TrafficPolicy.Cluster
    assert svc.internal_traffic_policy is TrafficPolicy.Cluster


@pytest.mark.parametrize(
    ("spec", "timeout"),
    [
        ({}, None),
        ({"sessionAffinity": "None"}, None),
        ({"sessionAffinity": "ClientIP"}, DEFAULT_AFFINITY_TIMEOUT_S),
        ({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {}}},
         DEFAULT_AFFINITY_TIMEOUT_S),
        ({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}, 60),
    ],
)
def test_session_affinity_timeout(spec: dict[str, Any], timeout: int | None) -> None:
    """ClientIP affinity takes ``timeoutSeconds``, defaulting to 10800 s; None means no affinity."""
    assert _ok(service(**spec)).session_affinity_timeout_s == timeout


def test_default_affinity_timeout_is_three_hours() -> None:
    """v1.DefaultClientIPServiceAffinitySeconds is 10800."""
    assert DEFAULT_AFFINITY_TIMEOUT_S == 10800


def test_headless_service_is_marked_headless() -> None:
    """``clusterIP: None`` parses as headless with no cluster IPs."""
    svc = _ok(service(cluster_ip="None"))
    assert svc.headless
    assert svc.cluster_ips == ()


def test_cluster_ips_are_canonical_primary_first() -> None:
    """``clusterIPs`` keep their order and IPv6 is printed compressed, as Go prints it."""
    svc = _ok(service(cluster_ips=["fd00:0:0::0a", "10.96.0.10"]))
    assert svc.cluster_ips == ("fd00::a", "10.96.0.10")


def test_lb_ingress_in_proxy_mode_and_hostnames_are_left_out() -> None:
    """Only VIP-mode ingress IPs are load-balancer IPs (proxyutil.IsVIPMode)."""
    svc = _ok(service(type="LoadBalancer", ingress=[
        {"ip": "1.1.1.1"}, {"ip": "2.2.2.2", "ipMode": "Proxy"}, {"hostname": "lb.example"},
        {"ip": "3.3.3.3", "ipMode": "VIP"}]))
    assert svc.load_balancer_ips == ("1.1.1.1", "3.3.3.3")


def test_source_ranges_drop_host_bits() -> None:
    """loadBalancerSourceRanges are read sloppily, as Go's ParseCIDRSloppy does."""
    svc = _ok(service(type="LoadBalancer", loadBalancerSourceRanges=[" 10.1.2.3/8 "]))
    assert svc.load_balancer_source_ranges == ("10.0.0.0/8",)


# --- invalid input ---------------------------------------------------------------------------

BAD_PARTS: list[tuple[str, dict[str, Any], str]] = [
    ("bad external IP", {"externalIPs": ["1.2.3.4", "not-an-ip"]}, "spec.externalIPs[1]"),
    ("scoped external IP", {"externalIPs": ["fe80::1%eth0"]}, "spec.externalIPs[0]"),
    ("bad source range", {"loadBalancerSourceRanges": ["10.0.0.0/33"]}, "spec.loadBalancerSourceRanges[0]"),
    ("source range without prefix", {"loadBalancerSourceRanges": ["10.0.0.1"]},
     "spec.loadBalancerSourceRanges[0]"),
    ("unknown affinity", {"sessionAffinity": "Cookie"}, "spec.sessionAffinity"),
    ("affinity timeout too long", {"sessionAffinity": "ClientIP",
                                   "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 86401}}},
     "spec.sessionAffinityConfig.clientIP.timeoutSeconds"),
    ("unknown traffic policy", {"externalTrafficPolicy": "Nearby"}, "spec.externalTrafficPolicy"),
]


@pytest.mark.parametrize(("case", "spec", "field"), BAD_PARTS, ids=[c[0] for c in BAD_PARTS])
def test_bad_part_is_reported_and_the_service_kept(case: str, spec: dict[str, Any], field: str) -> None:
    """A bad optional field is reported with source, object and field, and the Service still parses."""
    svc, problems = parse_service(service(**spec), source="svc.yaml")
    assert svc.name == "svc"
    assert [p.field for p in problems] == [field]
    message = str(problems[0])
    assert "svc.yaml" in message and "Service ns/svc" in message and field in message


BAD_PORTS: list[tuple[str, dict[str, Any], str]] = [
    ("port zero", port("bad", 0), "spec.ports[0].port"),
    ("port too large", port("bad", 65536), "spec.ports[0].port"),
    ("port not a number", {"name": "bad", "port": "eighty"}, "spec.ports[0].port"),
    ("port missing", {"name": "bad"}, "spec.ports[0].port"),
    ("unknown protocol", port("bad", 81, protocol="ICMP"), "spec.ports[0].protocol"),
    ("targetPort too large", port("bad", 81, target=70000), "spec.ports[0].targetPort"),
    ("nodePort on ClusterIP", port("bad", 81, node_port=30001), "spec.ports[0].nodePort"),
]


@pytest.mark.parametrize(("case", "bad", "field"), BAD_PORTS, ids=[c[0] for c in BAD_PORTS])
def test_bad_port_is_skipped_and_the_good_port_kept(case: str, bad: dict[str, Any], field: str) -> None:
    """One invalid port is reported by field; the Service keeps its other, valid port."""
    svc, problems = parse_service(service(ports=[bad, port("http", 80)]), source="svc.yaml")
    assert [(p.name, p.port) for p in svc.ports] == [("http", 80)]
    assert [p.field for p in problems] == [field]
    assert "Service ns/svc" in str(problems[0]) and field in str(problems[0])


def test_duplicate_port_name_keeps_the_first() -> None:
    """Of two ports with one name the first is kept and the second reported."""
    svc, problems = parse_service(service(ports=[port("http", 80), port("http", 81)]))
    assert [p.port for p in svc.ports] == [80]
    assert [p.field for p in problems] == ["spec.ports[1].name"]


def test_same_name_with_other_protocol_is_a_duplicate() -> None:
    """Port names are unique within a Service whatever the protocol (validation.go validateServicePort)."""
    raw = service(ports=[port("dns", 53, protocol="UDP"), port("dns", 53, protocol="TCP")])
    svc, problems = parse_service(raw)
    assert [(p.name, p.protocol) for p in svc.ports] == [("dns", Protocol.UDP)]
    assert [p.field for p in problems] == ["spec.ports[1].name"]


def test_two_unnamed_ports_are_rejected() -> None:
    """Several ports must all be named; two unnamed ports leave no valid port, so the Service is refused."""
    with pytest.raises(InvalidObject, match=r"spec\.ports"):
        parse_service(service(ports=[{"port": 80}, {"port": 81}]))


def test_unnamed_port_among_several_is_skipped() -> None:
    """An unnamed port next to a named one is reported and the named one kept."""
    svc, problems = parse_service(service(ports=[port("http", 80), {"port": 81}]))
    assert [p.name for p in svc.ports] == ["http"]
    assert [p.field for p in problems] == ["spec.ports[1].name"]


REJECTED: list[tuple[str, dict[str, Any], str]] = [
    ("wrong kind", {**service(), "kind": "Pod"}, "kind"),
    ("wrong apiVersion", {**service(), "apiVersion": "v2"}, "apiVersion"),
    ("bad name", {**service(), "metadata": {"name": "Web_1", "namespace": "ns"}}, "metadata.name"),
    ("unspecified cluster IP", service(cluster_ip="0.0.0.0"), "spec.clusterIP"),
    ("clusterIP differs from clusterIPs[0]",
     {**service(), "spec": {**service()["spec"], "clusterIPs": ["10.96.0.99"]}}, "spec.clusterIP"),
    ("missing name", {**service(), "metadata": {"namespace": "ns"}}, "metadata.name"),
    ("bad cluster IP", service(cluster_ip="10.96.0.300"), "spec.clusterIP"),
    ("bad type", service(type="Internal"), "spec.type"),
    ("two cluster IPs of one family", service(cluster_ips=["10.0.0.1", "10.0.0.2"]), "spec.clusterIPs"),
    ("no valid port", service(ports=[port("a", 0)]), "spec.ports"),
]


@pytest.mark.parametrize(("case", "raw", "field"), REJECTED, ids=[c[0] for c in REJECTED])
def test_unservable_service_raises_invalid_object(case: str, raw: dict[str, Any], field: str) -> None:
    """A Service that cannot be served at all raises InvalidObject naming source and field."""
    with pytest.raises(InvalidObject) as info:
        parse_service(raw, source="svc.yaml")
    assert info.value.field == field
    assert info.value.source == "svc.yaml"
    assert "svc.yaml" in str(info.value) and field in str(info.value)


def test_parse_objects_reports_rejected_service_without_raising() -> None:
    """Through parse_objects an unservable Service becomes a problem, not an exception."""
    result = parse_objects(service(cluster_ip="bogus"), source="svc.yaml")
    assert result.objects == []
    assert [p.field for p in result.problems] == ["spec.clusterIP"]


def test_invalid_object_is_a_value_error() -> None:
    """InvalidObject can be caught as ValueError."""
    assert issubclass(InvalidObject, ValueError)


def test_null_node_ports_mean_unset() -> None:
    """``nodePort: null`` and ``healthCheckNodePort: null`` (as JSON dumps write them) mean none."""
    raw = service(type="LoadBalancer", healthCheckNodePort=None,
                  ports=[{"name": "http", "port": 80, "nodePort": None}])
    svc = _ok(raw)
    assert (svc.ports[0].node_port, svc.health_check_node_port) == (0, 0)


def test_same_port_and_protocol_twice_keeps_the_first() -> None:
    """Two ports with the same number and protocol are invalid; the second is reported and left out."""
    from kproxy.model import parse_service

    raw = service(ports=[{"name": "a", "port": 80}, {"name": "b", "port": 80}])
    svc, problems = parse_service(raw, source="svc.yaml")
    assert [p.name for p in svc.ports] == ["a"]
    assert [p.field for p in problems] == ["spec.ports[1].port"]


def test_invalid_port_name_is_reported() -> None:
    """A port name that is not a DNS-1123 label is reported and that port left out."""
    from kproxy.model import parse_service

    raw = service(ports=[{"name": "HTTP_8080", "port": 80}, {"name": "ok", "port": 81}])
    svc, problems = parse_service(raw, source="svc.yaml")
    assert [p.name for p in svc.ports] == ["ok"]
    assert [p.field for p in problems] == ["spec.ports[0].name"]
