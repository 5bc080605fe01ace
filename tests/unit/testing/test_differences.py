# ruff: noqa: E501  (cluster literals and test names are kept whole to stay readable)
"""Each documented difference between modes occurs, is named, and is never a silent tolerance."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.testing import (
    AFFINITY_TIMEOUT_BOUNDARY,
    KNOWN_DIFFERENCES,
    Cluster,
    NodeSpec,
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


IPVS_CLUSTER = Cluster(manifests=(
    _service("itp", "10.96.0.3", [{"name": "http", "port": 80}], internalTrafficPolicy="Local"),
    _slice("itp", [("10.244.1.4", "node-b")], [{"name": "http", "port": 8080}]),
    _service("itpnp", "10.96.0.4", [{"name": "http", "port": 80, "nodePort": 30004}], type="NodePort",
             internalTrafficPolicy="Local"),
    _slice("itpnp", [("10.244.1.5", "node-b")], [{"name": "http", "port": 8080}]),
    _service("etp", "10.96.0.5", [{"name": "http", "port": 80, "nodePort": 30005}], type="NodePort",
             externalTrafficPolicy="Local"),
    _slice("etp", [("10.244.1.6", "node-b")], [{"name": "http", "port": 8080}]),
    _service("np", "10.96.0.6", [{"name": "http", "port": 80, "nodePort": 30006}], type="NodePort"),
    _slice("np", [("10.244.1.7", "node-b")], [{"name": "http", "port": 8080}]),
    _service("empty", "10.96.0.7", [{"name": "http", "port": 80}], externalIPs=["192.168.99.7"]),
    _service("etpl", "10.96.0.8", [{"name": "http", "port": 80, "nodePort": 30008}], type="NodePort",
             externalTrafficPolicy="Local"),
    _slice("etpl", [("10.244.0.10", "node-a"), ("10.244.1.10", "node-b")], [{"name": "http", "port": 8080}]),
    _service("hp", "10.96.0.9", [{"name": "http", "port": 80}]),
    _slice("hp", [("10.244.1.11", "node-b")], [{"name": "http", "port": 8080}]),
    _service("fw", "10.96.0.10", [{"name": "http", "port": 80}], type="LoadBalancer", ingress="198.51.100.10",
             loadBalancerSourceRanges=["203.0.113.0/24"]),
    _service("fwe", "10.96.0.13", [{"name": "http", "port": 80}], type="LoadBalancer", ingress="198.51.100.13",
             loadBalancerSourceRanges=["203.0.113.0/24"]),
    _slice("fwe", [("10.244.1.13", "node-b")], [{"name": "http", "port": 8080}]),
    _service("lo", "10.96.0.14", [{"name": "http", "port": 80}]),
    _slice("lo", [("127.0.14.1", "node-a")], [{"name": "http", "port": 8080}]),
))

#: Cases of the ipvs differences, compared between iptables and ipvs: (packet, ipvs verdict).
IPVS_CASES = {
    "ipvs-internal-local-falls-back": Packet(src="10.244.0.9", dst="10.96.0.4", sport=40000, dport=80,
                                             origin=Origin.LOCAL_POD),
    "ipvs-external-local-falls-back": Packet(src="203.0.113.2", dst="192.168.0.2", sport=40000, dport=30005,
                                             target=Target.NODE_PORT),
    "ipvs-no-localhost-nodeports": Packet(src="127.0.0.1", dst="127.0.0.1", sport=40000, dport=30006,
                                          origin=Origin.LOCALHOST, target=Target.NODE_PORT),
    "ipvs-external-without-endpoints-from-node": Packet(src="192.168.0.2", dst="192.168.99.7", sport=40000,
                                                        dport=80, origin=Origin.NODE,
                                                        target=Target.EXTERNAL_IP),
    "ipvs-external-local-no-pod-short-circuit": Packet(src="10.244.0.9", dst="192.168.0.2", sport=40000,
                                                       dport=30008, origin=Origin.LOCAL_POD,
                                                       target=Target.NODE_PORT),
    "ipvs-no-hairpin-masquerade-remote": Packet(src="10.244.1.11", dst="10.96.0.9", sport=40000, dport=80,
                                                origin=Origin.REMOTE_POD),
    "ipvs-source-ranges-without-endpoints": Packet(src="10.244.0.9", dst="198.51.100.10", sport=40000,
                                                   dport=80, origin=Origin.LOCAL_POD,
                                                   target=Target.LOAD_BALANCER),
    "ipvs-loopback-real-servers-from-outside": Packet(src="10.244.0.9", dst="10.96.0.14", sport=40000,
                                                      dport=80, origin=Origin.LOCAL_POD),
    "ipvs-source-ranges-node-access": Packet(src="192.168.0.2", dst="198.51.100.13", sport=40000, dport=80,
                                             origin=Origin.NODE, target=Target.LOAD_BALANCER),
}


NFT_CLUSTER = Cluster(
    manifests=(
        _service("np", "10.96.0.6", [{"name": "http", "port": 80, "nodePort": 30006}], type="NodePort"),
        _slice("np", [("10.244.1.7", "node-b")], [{"name": "http", "port": 8080}]),
        _service("empty", "10.96.0.7", [{"name": "http", "port": 80}], externalIPs=["192.168.99.7"]),
        _service("fw", "10.96.0.10", [{"name": "http", "port": 80}], type="LoadBalancer", ingress="198.51.100.10",
                 loadBalancerSourceRanges=["203.0.113.0/24"]),
    ),
    node=NodeSpec(node_ips=("192.168.0.2", "192.168.0.5", "2001:db8::2")))

#: Cases of the nftables differences, compared between iptables and nftables.
NFT_CASES = {
    "nftables-no-localhost-nodeports": Packet(src="127.0.0.1", dst="127.0.0.1", sport=40000, dport=30006,
                                              origin=Origin.LOCALHOST, target=Target.NODE_PORT),
    "nftables-nodeports-on-primary-ip-only": Packet(src="203.0.113.2", dst="192.168.0.5", sport=40000,
                                                    dport=30006, target=Target.NODE_PORT),
    "nftables-external-without-endpoints-from-node": Packet(src="192.168.0.2", dst="192.168.99.7", sport=40000,
                                                            dport=80, origin=Origin.NODE, target=Target.EXTERNAL_IP),
    "nftables-source-ranges-without-endpoints": Packet(src="10.244.1.9", dst="198.51.100.10", sport=40000,
                                                       dport=80, origin=Origin.REMOTE_POD,
                                                       target=Target.LOAD_BALANCER),
}


def test_every_documented_difference_has_a_case() -> None:
    """The table and the cases below name the same differences (the --service-cidr one waits for the flag)."""
    assert {d.name for d in KNOWN_DIFFERENCES} == (set(CASES) | set(IPVS_CASES) | set(NFT_CASES)
                                                   | {"nftables-unallocated-clusterip-dropped"})


@pytest.mark.parametrize("name", sorted(NFT_CASES))
def test_the_nftables_difference_is_real_and_named(name: str) -> None:
    """iptables and nftables disagree on the case; with the table exactly that difference applies."""
    packet = NFT_CASES[name]
    with pytest.raises(NotEquivalent):
        assert_equivalent(NFT_CLUSTER, packet, ("iptables", "nftables"), differences=())
    result = assert_equivalent(NFT_CLUSTER, packet, ("iptables", "nftables"))
    assert [d.name for d in result.excused] == [name]


def test_nftables_rejects_an_undefined_clusterip_port_where_iptables_routes_it() -> None:
    """A ClusterIP's undefined port: nftables REJECTs it (cluster-ips-check), excused as clusterip-unknown-port."""
    packet = CASES["clusterip-unknown-port"]
    outcome = get_mode("nftables").outcome(CLUSTER, packet)
    assert outcome.verdict is Verdict.REJECT and not outcome.translated
    result = assert_equivalent(CLUSTER, packet, ("iptables", "nftables"))
    assert [d.name for d in result.excused] == ["clusterip-unknown-port"]


def test_nftables_serving_a_nodeport_on_the_primary_ip_is_never_excused() -> None:
    """A NodePort on the primary IP from outside: iptables and nftables agree exactly, nothing excused."""
    packet = Packet(src="203.0.113.2", dst="192.168.0.2", sport=40000, dport=30006, target=Target.NODE_PORT)
    result = compare(NFT_CLUSTER, packet, ("iptables", "nftables"))
    assert result.equivalent and not result.excused
    assert dict(result.outcomes["nftables"].endpoints) == {"10.244.1.7:8080": 1.0}


@pytest.mark.parametrize("name", sorted(IPVS_CASES))
def test_the_ipvs_difference_is_real_and_named(name: str) -> None:
    """iptables and ipvs disagree on the case; with the table exactly that difference applies."""
    packet = IPVS_CASES[name]
    with pytest.raises(NotEquivalent):
        assert_equivalent(IPVS_CLUSTER, packet, ("iptables", "ipvs"), differences=())
    result = assert_equivalent(IPVS_CLUSTER, packet, ("iptables", "ipvs"))
    assert [d.name for d in result.excused] == [name]


def test_internal_local_only_port_is_rejected_by_ipvs_where_iptables_drops() -> None:
    """An internal-only Local port: CategorizeEndpoints leaves no cluster endpoint, the VS is empty."""
    packet = Packet(src="10.244.0.9", dst="10.96.0.3", sport=40000, dport=80, origin=Origin.LOCAL_POD)
    result = compare(IPVS_CLUSTER, packet, ("iptables", "ipvs"))
    assert result.outcomes["iptables"].verdict is Verdict.DROP
    assert result.outcomes["ipvs"].verdict is Verdict.REJECT
    assert [d.name for d in result.excused] == ["ipvs-internal-local-falls-back"]


def test_ipvs_fallback_to_other_endpoints_is_not_excused() -> None:
    """The fallback predicate insists on exactly the cluster endpoints."""
    difference = next(d for d in KNOWN_DIFFERENCES if d.name == "ipvs-internal-local-falls-back")
    packet = IPVS_CASES["ipvs-internal-local-falls-back"]
    outcomes = dict(compare(IPVS_CLUSTER, packet, ("iptables", "ipvs")).outcomes)
    assert difference.applies(IPVS_CLUSTER, packet, outcomes)
    from dataclasses import replace

    from kproxy.testing.outcome import EndpointShares
    outcomes["ipvs"] = replace(outcomes["ipvs"], endpoints=EndpointShares({"10.244.9.9:8080": 1.0}))
    assert not difference.applies(IPVS_CLUSTER, packet, outcomes)


def test_ipvs_spreads_first_connections_of_an_affinity_service() -> None:
    """With ClientIP affinity, ipvs' shares are of first connections (persistence expired between them)."""
    cluster = Cluster(manifests=(
        _service("aff", "10.96.0.8", [{"name": "http", "port": 80}], sessionAffinity="ClientIP"),
        _slice("aff", [("10.244.1.8", "node-b"), ("10.244.1.9", "node-b")], [{"name": "http", "port": 8080}]),
    ))
    packet = Packet(src="10.244.0.9", dst="10.96.0.8", sport=40000, dport=80, origin=Origin.LOCAL_POD)
    result = assert_equivalent(cluster, packet, ("iptables", "ipvs"))
    assert set(result.outcomes["ipvs"].endpoints) == {"10.244.1.8:8080", "10.244.1.9:8080"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_difference_is_real_and_named(name: str) -> None:
    """Without the table the modes disagree on the case; with it exactly that difference applies."""
    packet = CASES[name]
    modes = ("userspace", "iptables")
    with pytest.raises(NotEquivalent):
        assert_equivalent(CLUSTER, packet, modes, differences=())
    result = assert_equivalent(CLUSTER, packet, modes)
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


def test_ipvs_masquerade_is_that_of_any_sampled_connection() -> None:
    """A pod reaching its own endpoint through the ClusterIP is masqueraded (KUBE-LOOP-BACK) on that
    connection only; ipvs' masquerade, as iptables', is whether any connection is."""
    cluster = Cluster(manifests=(
        _service("self", "10.96.0.11", [{"name": "http", "port": 80}]),
        _slice("self", [("10.244.0.12", "node-a"), ("10.244.1.12", "node-b")], [{"name": "http", "port": 8080}]),
    ))
    packet = Packet(src="10.244.0.12", dst="10.96.0.11", sport=40000, dport=80, origin=Origin.LOCAL_POD)
    result = assert_equivalent(cluster, packet, ("iptables", "ipvs"))
    assert result.outcomes["ipvs"].masquerade is True
