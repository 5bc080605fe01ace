"""build_snapshot: which Services are proxied, and how slices merge into a port's endpoints."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.model import (
    LABEL_SERVICE_PROXY_NAME,
    EndpointSlice,
    IPFamily,
    NodeConfig,
    Protocol,
    Service,
    ServicePortName,
    build_snapshot,
    parse_objects,
)

from .builders import NODE, addresses, endpoint, endpoint_slice, port, service, slice_port, snapshot_of


def _spn(port_name: str = "http", protocol: Protocol = Protocol.TCP) -> ServicePortName:
    return ServicePortName(namespace="ns", name="svc", port=port_name, protocol=protocol)


IGNORED: list[tuple[str, dict[str, Any]]] = [
    ("headless", service(cluster_ip="None")),
    ("ExternalName", service(type="ExternalName", externalName="db.example")),
    ("no ClusterIP", service(cluster_ip=None)),
    ("empty ClusterIP", service(cluster_ip="")),
    ("other proxy", service(labels={LABEL_SERVICE_PROXY_NAME: "other"})),
    ("proxy label with empty value", service(labels={LABEL_SERVICE_PROXY_NAME: ""})),
    ("no ports", service(ports=[])),
]


@pytest.mark.parametrize(("case", "raw"), IGNORED, ids=[c[0] for c in IGNORED])
def test_ignored_service_produces_nothing(case: str, raw: dict[str, Any]) -> None:
    """Services kube-proxy skips contribute no port to the snapshot, even with endpoints."""
    assert len(snapshot_of(raw, endpoint_slice())) == 0


def test_service_proxy_name_of_ours_is_served() -> None:
    """A Service labelled with our service-proxy-name is proxied."""
    raw = service(labels={LABEL_SERVICE_PROXY_NAME: "kproxy"})
    snap = snapshot_of(raw, node=NodeConfig(hostname=NODE, service_proxy_name="kproxy"))
    assert list(snap.family(IPFamily.IPv4)) == [_spn()]


def test_service_proxy_name_other_than_ours_is_skipped() -> None:
    """A Service labelled for a different proxy is skipped even when we have a proxy name."""
    raw = service(labels={LABEL_SERVICE_PROXY_NAME: "other"})
    assert len(snapshot_of(raw, node=NodeConfig(hostname=NODE, service_proxy_name="kproxy"))) == 0


def test_one_info_per_port() -> None:
    """Each Service port becomes one ServicePortInfo keyed by its ServicePortName."""
    raw = service(ports=[port("http", 80), port("dns", 53, protocol="UDP")])
    snap = snapshot_of(raw)
    assert set(snap.family(IPFamily.IPv4)) == {_spn("http"), _spn("dns", Protocol.UDP)}


def test_endpoint_port_comes_from_slice_not_target_port() -> None:
    """Slice ports match service ports by name; targetPort is never consulted (endpointslicecache.go)."""
    raw = service(ports=[port("http", 80, target=8080)])
    slc = endpoint_slice(endpoints=[endpoint("10.0.0.1")], ports=[slice_port("http", 9090)])
    info = snapshot_of(raw, slc).get(_spn())
    assert info is not None
    assert addresses(info.endpoints) == ["10.0.0.1:9090"]


def test_slice_port_with_other_name_yields_nothing() -> None:
    """A slice port named differently from every service port gives the service port no endpoints."""
    raw = service(ports=[port("http", 80, target=9090)])
    slc = endpoint_slice(ports=[slice_port("web", 9090)])
    info = snapshot_of(raw, slc).get(_spn())
    assert info is not None
    assert info.endpoints == ()


def test_slice_port_with_other_protocol_yields_nothing() -> None:
    """A slice port of the same name but another protocol does not match."""
    slc = endpoint_slice(ports=[slice_port("http", 8080, protocol="UDP")])
    info = snapshot_of(service(), slc).get(_spn())
    assert info is not None
    assert info.endpoints == ()


def test_unnamed_ports_match() -> None:
    """An unnamed service port matches an unnamed slice port."""
    raw = service(ports=[{"port": 80}])
    slc = endpoint_slice(ports=[slice_port(None, 8080)])
    info = snapshot_of(raw, slc).get("ns/svc")
    assert info is not None
    assert addresses(info.endpoints) == ["10.0.0.1:8080"]


def test_slices_of_other_services_are_ignored() -> None:
    """Only slices labelled with the Service's name (in its namespace) feed its endpoints."""
    other = endpoint_slice(name="x", service_name="other", endpoints=[endpoint("10.0.0.2")])
    elsewhere = endpoint_slice(name="y", namespace="prod", endpoints=[endpoint("10.0.0.3")])
    info = snapshot_of(service(), endpoint_slice(), other, elsewhere).get(_spn())
    assert info is not None
    assert addresses(info.endpoints) == ["10.0.0.1:8080"]


def test_endpoints_of_several_slices_merge() -> None:
    """Endpoints of all the Service's slices are merged."""
    a = endpoint_slice(name="svc-a", endpoints=[endpoint("10.0.0.1")])
    b = endpoint_slice(name="svc-b", endpoints=[endpoint("10.0.0.2")])
    info = snapshot_of(service(), a, b).get(_spn())
    assert info is not None
    assert addresses(info.endpoints) == ["10.0.0.1:8080", "10.0.0.2:8080"]


@pytest.mark.parametrize("terminating_first", [True, False])
def test_duplicate_endpoint_keeps_the_non_terminating_copy(terminating_first: bool) -> None:
    """The same ip:port in two slices is one endpoint, the non-terminating copy winning (addEndpoints)."""
    old = endpoint("10.0.0.1", ready=False, serving=True, terminating=True)
    new = endpoint("10.0.0.1", ready=True)
    first, second = (old, new) if terminating_first else (new, old)
    a = endpoint_slice(name="svc-a", endpoints=[first])
    b = endpoint_slice(name="svc-b", endpoints=[second])
    info = snapshot_of(service(), a, b).get(_spn())
    assert info is not None
    assert [(e.address, e.ready, e.terminating) for e in info.endpoints] == [("10.0.0.1:8080", True, False)]


def test_endpoints_sort_by_address_string() -> None:
    """Endpoints are ordered by their ``ip:port`` text, so 10.0.0.10 sorts before 10.0.0.9."""
    slc = endpoint_slice(endpoints=[endpoint(ip) for ip in ("10.0.0.9", "10.0.0.10", "10.0.0.100")],
                         ports=[slice_port("http", 80)])
    info = snapshot_of(service(), slc).get(_spn())
    assert info is not None
    assert addresses(info.endpoints) == ["10.0.0.100:80", "10.0.0.10:80", "10.0.0.9:80"]


def test_endpoint_is_local_by_node_name() -> None:
    """An endpoint whose nodeName is this node's hostname is local; others are not."""
    slc = endpoint_slice(endpoints=[endpoint("10.0.0.1", node=NODE), endpoint("10.0.0.2", node="x"),
                                    endpoint("10.0.0.3")])
    info = snapshot_of(service(), slc).get(_spn())
    assert info is not None
    assert [e.is_local for e in info.endpoints] == [True, False, False]


def test_empty_hostname_makes_nothing_local() -> None:
    """With no hostname, even an endpoint without nodeName is not local."""
    slc = endpoint_slice(endpoints=[endpoint("10.0.0.1")])
    info = snapshot_of(service(), slc, node=NodeConfig(hostname="")).get(_spn())
    assert info is not None
    assert not info.endpoints[0].is_local


def test_last_service_of_a_name_wins() -> None:
    """Two Services with one namespace/name: the later one is built."""
    snap = snapshot_of(service(ports=[port("a", 80)]), service(ports=[port("b", 81)]))
    assert [spn.port for spn in snap.family(IPFamily.IPv4)] == ["b"]


def test_snapshot_marks_every_port_changed() -> None:
    """A snapshot built from scratch lists every ServicePortName as changed."""
    snap = snapshot_of(service(ports=[port("a", 80), port("b", 81)]))
    assert snap.changed == {_spn("a"), _spn("b")}


# --- dual-stack ------------------------------------------------------------------------------

DUAL = {"cluster_ip": "10.96.0.10", "cluster_ips": ["10.96.0.10", "fd00::10"]}


def test_dual_stack_service_has_one_info_per_family() -> None:
    """A dual-stack Service yields one ServicePortInfo per family, each with its own cluster IP."""
    snap = snapshot_of(service(**DUAL))
    assert snap.get(_spn(), IPFamily.IPv4).cluster_ip == "10.96.0.10"  # type: ignore[union-attr]
    assert snap.get(_spn(), IPFamily.IPv6).cluster_ip == "fd00::10"  # type: ignore[union-attr]
    assert len(snap) == 2


def test_addresses_are_filtered_per_family() -> None:
    """External IPs, load-balancer IPs and source ranges go to the info of their own family."""
    raw = service(**DUAL, type="LoadBalancer", ports=[port("http", 80, node_port=30080)],
                  externalIPs=["1.1.1.1", "2001:db8::1"],
                  loadBalancerSourceRanges=["1.0.0.0/8", "2001:db8::/32"],
                  ingress=[{"ip": "5.5.5.5"}, {"ip": "2001:db8::5"}])
    snap = snapshot_of(raw)
    v4, v6 = snap.get(_spn(), IPFamily.IPv4), snap.get(_spn(), IPFamily.IPv6)
    assert v4 is not None and v6 is not None
    assert (v4.external_ips, v4.load_balancer_ips, v4.load_balancer_source_ranges) == (
        ("1.1.1.1",), ("5.5.5.5",), ("1.0.0.0/8",))
    assert (v6.external_ips, v6.load_balancer_ips, v6.load_balancer_source_ranges) == (
        ("2001:db8::1",), ("2001:db8::5",), ("2001:db8::/32",))


def test_slices_feed_the_family_of_their_address_type() -> None:
    """IPv4 slices feed the IPv4 info and IPv6 slices the IPv6 info."""
    v4 = endpoint_slice(name="svc-4", endpoints=[endpoint("10.0.0.1")])
    v6 = endpoint_slice(name="svc-6", address_type="IPv6", endpoints=[endpoint("fd00::1")])
    snap = snapshot_of(service(**DUAL), v4, v6)
    assert addresses(snap.get(_spn(), IPFamily.IPv4).endpoints) == ["10.0.0.1:8080"]  # type: ignore[union-attr]
    assert addresses(snap.get(_spn(), IPFamily.IPv6).endpoints) == ["[fd00::1]:8080"]  # type: ignore[union-attr]


def test_ipv4_only_node_drops_ipv6() -> None:
    """NodeConfig.ip_families=(IPv4,) builds no IPv6 info."""
    snap = snapshot_of(service(**DUAL), node=NodeConfig(hostname=NODE, ip_families=(IPFamily.IPv4,)))
    assert [info.family for info in snap] == [IPFamily.IPv4]


def test_single_stack_ipv6_service_on_ipv4_node_is_absent() -> None:
    """An IPv6-only Service has nothing to proxy on an IPv4-only node."""
    raw = service(cluster_ip="fd00::10")
    assert len(snapshot_of(raw, node=NodeConfig(hostname=NODE, ip_families=(IPFamily.IPv4,)))) == 0


def test_wrong_family_endpoint_breaks_neither_endpoints_nor_services() -> None:
    """A wrong-family address is reported; its slice's other endpoints and other Services still build."""
    bad = endpoint_slice(endpoints=[endpoint("fd00::1"), endpoint("10.0.0.1")])
    other = service(name="other", cluster_ip="10.96.0.11")
    results = [parse_objects(o, source="m.yaml") for o in (service(), bad, other)]
    problems = [p for r in results for p in r.problems]
    objs = [o for r in results for o in r.objects]
    assert [p.field for p in problems] == ["endpoints[0].addresses[0]"]
    snap = build_snapshot([o for o in objs if isinstance(o, Service)],
                          [o for o in objs if isinstance(o, EndpointSlice)], NodeConfig(hostname=NODE))
    assert addresses(snap.get(_spn()).endpoints) == ["10.0.0.1:8080"]  # type: ignore[union-attr]
    assert snap.get("ns/other:http") is not None
