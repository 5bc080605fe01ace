# ruff: noqa: E501  (cluster literals and test names are kept whole to stay readable)
"""The strategies validate their arguments eagerly and generate consistent clusters."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.errors import InvalidArgument
from kproxy.model import IPFamily
from kproxy.testing import (
    Cluster,
    NodeSpec,
    Origin,
    Packet,
    Target,
    clusters,
    endpoint_slices,
    packets,
    services,
)

SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "ns", "name": "svc0"},
           "spec": {"clusterIPs": ["10.96.0.1"], "ports": [{"port": 80}]}}


@pytest.mark.parametrize(("factory", "kwargs", "named"), [
    (services, {"min_ports": 3, "max_ports": 2}, "min_ports"),
    (services, {"max_ports": 9}, "max_ports"),
    (services, {"families": ()}, "families"),
    (services, {"families": ("IPv5",)}, "families"),
    (services, {"types": ("ExternalName",)}, "types"),
    (services, {"protocols": ("ICMP",)}, "protocols"),
    (services, {"index": 200}, "index"),
    (services, {"session_affinity": "yes"}, "session_affinity"),
    (clusters, {"min_services": 5, "max_services": 1}, "min_services"),
    (clusters, {"max_endpoints": -1}, "max_endpoints"),
    (clusters, {"node": "node-a"}, "node"),
])
def test_bad_bounds_are_rejected_when_the_strategy_is_built(factory: Any, kwargs: dict[str, Any], named: str) -> None:
    """An impossible or malformed argument raises InvalidArgument naming it, before any draw."""
    with pytest.raises(InvalidArgument, match=named):
        factory(**kwargs)


def test_endpoint_slices_need_a_service_dict() -> None:
    """endpoint_slices() refuses something that is not a Service with ports and cluster IPs."""
    with pytest.raises(InvalidArgument, match="service"):
        endpoint_slices({"kind": "Service"})
    with pytest.raises(InvalidArgument, match="max_slices"):
        endpoint_slices(SERVICE, max_slices=9)


def test_packets_refuse_an_impossible_restriction() -> None:
    """packets() of a cluster without load balancers, restricted to them, raises instead of being empty."""
    cluster = Cluster(manifests=(SERVICE,))
    with pytest.raises(InvalidArgument, match="no packet is possible"):
        packets(cluster, targets=(Target.LOAD_BALANCER,))
    with pytest.raises(InvalidArgument, match="cluster"):
        packets("cluster")  # type: ignore[arg-type]


def test_node_spec_validates_its_addresses() -> None:
    """A local pod CIDR outside the cluster CIDR, or a node IP that is no address, is refused; two of a family are not."""
    with pytest.raises(InvalidArgument, match="local_pod_cidrs"):
        NodeSpec(local_pod_cidrs=("10.99.0.0/24",))
    with pytest.raises(InvalidArgument, match="node_ips"):
        NodeSpec(node_ips=("192.168.0.2", "192.168.0.300"))
    assert NodeSpec(node_ips=("192.168.0.2", "192.168.0.3")).node_ip(4) == "192.168.0.2"  # the first is primary


@settings(max_examples=60, deadline=None, derandomize=True)
@given(clusters(max_services=4))
def test_generated_clusters_parse_without_problems(cluster: Cluster) -> None:
    """Every generated manifest is valid and the Services never share an address or NodePort."""
    addresses = [a for s in cluster.services for a in (*s.cluster_ips, *s.external_ips, *s.load_balancer_ips)]
    node_ports = [p.node_port for s in cluster.services for p in s.ports if p.node_port]
    assert len(addresses) == len(set(addresses))
    assert len(set(node_ports)) == len(set(node_ports))
    assert len(cluster.services) == sum(1 for m in cluster.manifests if m["kind"] == "Service")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.data())
def test_packets_match_their_declared_origin_and_family(data: st.DataObject) -> None:
    """Localhost packets go to the node's own addresses, and every packet is of a proxied family."""
    cluster = data.draw(clusters())
    packet = data.draw(packets(cluster))
    assert packet.family in cluster.node.families
    if packet.origin is Origin.LOCALHOST:
        assert packet.dst in ("127.0.0.1", "::1")


def test_single_family_nodes_get_single_family_packets() -> None:
    """A node proxying only IPv6 is only sent IPv6 packets."""
    node = NodeSpec(families=(IPFamily.IPv6,))

    @settings(max_examples=30, deadline=None, derandomize=True)
    @given(st.data())
    def check(data: st.DataObject) -> None:
        cluster = data.draw(clusters(node=node))
        assert data.draw(packets(cluster)).family is IPFamily.IPv6

    check()


def test_endpoint_slices_accept_a_service_with_only_cluster_ip() -> None:
    """A Service with spec.clusterIP and no spec.clusterIPs (written before dual-stack) gets slices of that family."""
    legacy = {**SERVICE, "spec": {"clusterIP": "10.96.0.1", "ports": [{"port": 80}]}}

    @settings(max_examples=20, deadline=None, derandomize=True)
    @given(endpoint_slices(legacy, min_endpoints=1))
    def check(slices: list[dict[str, Any]]) -> None:
        assert all(s["addressType"] == "IPv4" for s in slices)

    check()


def test_services_refuse_a_namespace_that_is_not_a_dns_label() -> None:
    """services(namespace="Bad_NS") raises InvalidArgument naming namespace, as the API server would refuse it."""
    with pytest.raises(InvalidArgument, match="namespace"):
        services(namespace="Bad_NS")


def test_cluster_refuses_an_object_of_another_kind() -> None:
    """Cluster(manifests=({"kind": "Garbage"},)) raises InvalidArgument naming the item instead of ignoring it."""
    with pytest.raises(InvalidArgument, match=r"manifests\[1\]: .*'Garbage'"):
        Cluster(manifests=(SERVICE, {"kind": "Garbage"}))


@pytest.mark.parametrize(("make", "named"), [
    (lambda: NodeSpec(node_ips=("192.168.0.2", "node-a")), "node_ips"),
    (lambda: NodeSpec(families=()), "families"),
    (lambda: Packet(src="10.0.0.1", dst="fd00::1", sport=1, dport=1), "src"),
])
def test_messages_name_the_argument_not_internal_attributes(make: Any, named: str) -> None:
    """Errors name the argument (node_ips=, src=) and never show internal names such as self.node_ips=."""
    with pytest.raises(InvalidArgument, match=named) as info:
        make()
    assert "self." not in str(info.value)
