# ruff: noqa: E501  (cluster literals and test names are kept whole to stay readable)
"""Each documented difference between modes occurs, is named, and is never a silent tolerance."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.testing import (
    AFFINITY_TIMEOUT_BOUNDARY,
    KNOWN_DIFFERENCES,
    Cluster,
    NotEquivalent,
    Origin,
    Packet,
    Target,
    Verdict,
    affinity_holds,
    assert_equivalent,
    compare,
    get_mode,
)


def _service(name: str, ip: str, ports: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    ingress = spec.pop("ingress", None)
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "ns", "name": name},
                            "spec": {"clusterIP": ip, "ports": ports, **spec}}
    if ingress:
        body["status"] = {"loadBalancer": {"ingress": [{"ip": ingress}]}}
    return body


def _slice(name: str, endpoints: list[tuple[str, str]], ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "ns", "name": f"{name}-1", "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "ports": ports,
            "endpoints": [{"addresses": [ip], "nodeName": node} for ip, node in endpoints]}


CLUSTER = Cluster(manifests=(
    _service("web", "10.96.0.1", [{"name": "http", "port": 80}], type="LoadBalancer", ingress="198.51.100.1"),
    _slice("web", [("10.244.0.2", "node-a"), ("10.244.1.2", "node-b")], [{"name": "http", "port": 8080}]),
    _service("sctp", "10.96.0.2", [{"name": "s", "port": 80, "protocol": "SCTP"}]),
    _slice("sctp", [("10.244.1.3", "node-b")], [{"name": "s", "port": 9, "protocol": "SCTP"}]),
    _service("itp", "10.96.0.3", [{"name": "http", "port": 80}], internalTrafficPolicy="Local"),
    _slice("itp", [("10.244.1.4", "node-b")], [{"name": "http", "port": 8080}]),
))

CASES = {
    "clusterip-unknown-port": Packet(src="10.244.0.9", dst="10.96.0.1", sport=40000, dport=81,
                                     origin=Origin.LOCAL_POD, target=Target.UNKNOWN_PORT),
    "sctp-not-served-by-userspace": Packet(src="10.244.0.9", dst="10.96.0.2", sport=40000, dport=80,
                                           protocol="SCTP", origin=Origin.LOCAL_POD),  # type: ignore[arg-type]
    "external-traffic-not-served-by-userspace": Packet(src="203.0.113.2", dst="198.51.100.1", sport=40000,
                                                       dport=80, target=Target.LOAD_BALANCER),
    "internal-local-without-local-endpoints": Packet(src="10.244.0.9", dst="10.96.0.3", sport=40000, dport=80,
                                                     origin=Origin.LOCAL_POD),
}


def test_every_documented_difference_has_a_case() -> None:
    """The table and the cases below name the same differences."""
    assert {d.name for d in KNOWN_DIFFERENCES} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_difference_is_real_and_named(name: str) -> None:
    """Without the table the modes disagree on the case; with it exactly that difference applies."""
    packet = CASES[name]
    with pytest.raises(NotEquivalent):
        assert_equivalent(CLUSTER, packet, differences=())
    result = assert_equivalent(CLUSTER, packet)
    assert [d.name for d in result.excused] == [name]


def test_a_deviation_other_than_documented_is_still_reported() -> None:
    """A userspace answer unlike the documented one is not excused (the predicate checks it)."""
    difference = next(d for d in KNOWN_DIFFERENCES if d.name == "clusterip-unknown-port")
    packet = CASES["clusterip-unknown-port"]
    accepted = get_mode("iptables").outcome(CLUSTER, packet)
    assert not difference.applies(CLUSTER, packet, {"userspace": accepted})


def test_a_served_clusterip_port_is_never_excused() -> None:
    """Traffic to a served ClusterIP port matches no difference and the modes agree on it exactly."""
    packet = Packet(src="10.244.0.9", dst="10.96.0.1", sport=40000, dport=80, origin=Origin.LOCAL_POD)
    result = compare(CLUSTER, packet)
    assert result.equivalent and not result.excused
    assert dict(result.outcomes["iptables"].endpoints) == {"10.244.0.2:8080": 0.5, "10.244.1.2:8080": 0.5}


def test_the_failure_message_shows_outcomes_and_traces_side_by_side() -> None:
    """A NotEquivalent message carries the packet, both outcomes, the mismatch and each trace."""
    with pytest.raises(NotEquivalent) as info:
        assert_equivalent(CLUSTER, CASES["internal-local-without-local-endpoints"], differences=())
    text = str(info.value)
    assert "userspace" in text.splitlines()[3] and "iptables" in text.splitlines()[3]
    assert "MISMATCH: userspace and iptables disagree on verdict" in text
    assert "trace of iptables:" in text and "has no local endpoints" in text
    assert info.value.comparison.outcomes["iptables"].verdict is Verdict.DROP


def test_affinity_boundary_differs_exactly_at_the_timeout() -> None:
    """At exactly the timeout iptables keeps the client, the userspace balancer does not; elsewhere they agree."""
    svc = _service("sticky", "10.96.0.9", [{"name": "http", "port": 80}], sessionAffinity="ClientIP",
                   sessionAffinityConfig={"clientIP": {"timeoutSeconds": 10}})
    eps = _slice("sticky", [(f"10.244.1.{i}", "node-b") for i in range(2, 6)], [{"name": "http", "port": 8080}])
    cluster = Cluster(manifests=(svc, eps))
    packet = Packet(src="10.244.0.9", dst="10.96.0.9", sport=40000, dport=80, origin=Origin.LOCAL_POD)
    userspace = get_mode("userspace").connections(cluster, packet, [0.0, 10.0])
    assert userspace[0] != userspace[1]
    assert not affinity_holds("userspace", 10.0, 10.0)
    for seed_sport in range(40000, 40010):
        iptables = get_mode("iptables").connections(cluster, Packet(
            src="10.244.0.9", dst="10.96.0.9", sport=seed_sport, dport=80, origin=Origin.LOCAL_POD), [0.0, 10.0])
        assert iptables[0] == iptables[1]
    assert affinity_holds("iptables", 10.0, 10.0) and AFFINITY_TIMEOUT_BOUNDARY.modes == {"userspace"}
