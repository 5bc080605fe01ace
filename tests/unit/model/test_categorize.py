"""Per-node categorisation: cluster/local endpoints, traffic policies, topology, affinity, health checks.

Expectations follow kube-proxy's ``pkg/proxy/topology.go`` (CategorizeEndpoints,
topologyModeFromHints) and ``pkg/proxy/serviceport.go`` (UsesClusterEndpoints, UsesLocalEndpoints).
"""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.model import NodeConfig, ServicePortInfo, TopologyMode

from .builders import NODE, OTHER_NODE, addresses, endpoint, endpoint_slice, port, service, snapshot_of

READY_LOCAL = endpoint("10.0.0.1", node=NODE)
READY_REMOTE = endpoint("10.0.0.2", node=OTHER_NODE)
TERM_LOCAL = endpoint("10.0.0.3", ready=False, serving=True, terminating=True, node=NODE)
TERM_REMOTE = endpoint("10.0.0.4", ready=False, serving=True, terminating=True, node=OTHER_NODE)
NOT_READY = endpoint("10.0.0.5", ready=False, serving=False, node=NODE)
TERM_NOT_SERVING = endpoint("10.0.0.6", ready=False, serving=False, terminating=True, node=NODE)


def _info(*endpoints: Any, node: NodeConfig | None = None, **svc: Any) -> ServicePortInfo:
    raw = service(**svc)
    info = snapshot_of(raw, endpoint_slice(endpoints=list(endpoints)), node=node).get("ns/svc:http")
    assert info is not None
    return info


def _ips(eps: Any) -> list[str]:
    return [a.rsplit(":", 1)[0] for a in addresses(eps)]


@pytest.mark.parametrize(
    ("endpoints", "cluster"),
    [
        ([READY_LOCAL, READY_REMOTE, TERM_REMOTE, NOT_READY], ["10.0.0.1", "10.0.0.2"]),
        ([TERM_LOCAL, TERM_REMOTE, NOT_READY, TERM_NOT_SERVING], ["10.0.0.3", "10.0.0.4"]),
        ([NOT_READY, TERM_NOT_SERVING], []),
        ([], []),
    ],
    ids=["ready", "serving-terminating fallback", "none usable", "no endpoints"],
)
def test_cluster_endpoints_are_ready_else_serving_terminating(endpoints: list[Any],
                                                              cluster: list[str]) -> None:
    """Cluster endpoints are the ready ones, or the serving-and-terminating ones when none is ready."""
    info = _info(*endpoints)
    assert _ips(info.cluster_endpoints) == cluster
    assert info.has_any_endpoints == bool(cluster)


@pytest.mark.parametrize(
    ("endpoints", "local"),
    [
        ([READY_LOCAL, READY_REMOTE, TERM_LOCAL], ["10.0.0.1"]),
        ([READY_REMOTE, TERM_LOCAL, TERM_REMOTE], ["10.0.0.3"]),
        ([READY_REMOTE, NOT_READY, TERM_NOT_SERVING], []),
    ],
    ids=["local ready", "local terminating fallback", "nothing local usable"],
)
def test_local_endpoints_apply_the_same_rule_on_this_node(endpoints: list[Any], local: list[str]) -> None:
    """Local endpoints are this node's ready ones, else this node's serving-and-terminating ones."""
    info = _info(*endpoints, internalTrafficPolicy="Local")
    assert _ips(info.local_endpoints) == local


def test_internal_policy_local_uses_local_endpoints() -> None:
    """With internalTrafficPolicy Local, ClusterIP traffic goes to local endpoints only."""
    info = _info(READY_LOCAL, READY_REMOTE, internalTrafficPolicy="Local")
    assert info.internal_policy_local
    assert _ips(info.internal_endpoints) == ["10.0.0.1"]


def test_internal_policy_local_without_external_access_has_no_cluster_endpoints() -> None:
    """ITP Local on a port nobody reaches from outside never uses cluster endpoints (UsesClusterEndpoints)."""
    info = _info(READY_LOCAL, READY_REMOTE, internalTrafficPolicy="Local")
    assert info.cluster_endpoints == ()
    assert _ips(info.all_reachable_endpoints) == ["10.0.0.1"]


def test_internal_policy_local_with_no_local_endpoint_still_has_any() -> None:
    """ITP Local with only remote endpoints has no internal endpoints but reports endpoints exist."""
    info = _info(READY_REMOTE, internalTrafficPolicy="Local")
    assert info.internal_endpoints == ()
    assert info.has_any_endpoints


def test_internal_policy_cluster_uses_cluster_endpoints() -> None:
    """By default ClusterIP traffic uses every cluster endpoint and no local list is computed."""
    info = _info(READY_LOCAL, READY_REMOTE)
    assert _ips(info.internal_endpoints) == ["10.0.0.1", "10.0.0.2"]
    assert info.local_endpoints == ()


@pytest.mark.parametrize("svc_type", ["NodePort", "LoadBalancer"])
def test_external_policy_local_uses_local_endpoints_externally(svc_type: str) -> None:
    """ETP Local sends external traffic to local endpoints; cluster endpoints stay for short-circuiting."""
    info = _info(READY_LOCAL, READY_REMOTE, type=svc_type, externalTrafficPolicy="Local",
                 ports=[port("http", 80, node_port=30080)])
    assert info.external_policy_local
    assert _ips(info.external_endpoints) == ["10.0.0.1"]
    assert _ips(info.cluster_endpoints) == ["10.0.0.1", "10.0.0.2"]
    assert _ips(info.internal_endpoints) == ["10.0.0.1", "10.0.0.2"]


def test_external_policy_cluster_uses_cluster_endpoints_externally() -> None:
    """With ETP Cluster external traffic uses every cluster endpoint."""
    info = _info(READY_LOCAL, READY_REMOTE, type="NodePort", ports=[port("http", 80, node_port=30080)])
    assert not info.external_policy_local
    assert _ips(info.external_endpoints) == ["10.0.0.1", "10.0.0.2"]


def test_external_policy_local_ignored_for_plain_cluster_ip() -> None:
    """ETP Local on a ClusterIP Service without external IPs does nothing (apiservice.ExternalPolicyLocal)."""
    info = _info(READY_LOCAL, READY_REMOTE, externalTrafficPolicy="Local")
    assert not info.external_policy_local
    assert info.local_endpoints == ()


def test_external_policy_local_applies_to_cluster_ip_with_external_ips() -> None:
    """A ClusterIP Service with external IPs is externally accessible, so ETP Local applies."""
    info = _info(READY_LOCAL, READY_REMOTE, externalTrafficPolicy="Local", externalIPs=["1.2.3.4"])
    assert info.external_policy_local
    assert _ips(info.external_endpoints) == ["10.0.0.1"]


def test_all_reachable_merges_cluster_and_local() -> None:
    """With both policies in use, all-reachable is the union of cluster and local endpoints."""
    info = _info(READY_REMOTE, TERM_LOCAL, type="NodePort", externalTrafficPolicy="Local",
                 ports=[port("http", 80, node_port=30080)])
    assert _ips(info.cluster_endpoints) == ["10.0.0.2"]
    assert _ips(info.local_endpoints) == ["10.0.0.3"]
    assert _ips(info.all_reachable_endpoints) == ["10.0.0.2", "10.0.0.3"]


# --- topology --------------------------------------------------------------------------------

ZONED = NodeConfig(hostname=NODE, zone="z1")


def _zoned(ip: str, hints: list[str] | None, **kw: Any) -> Any:
    return endpoint(ip, zone_hints=hints, **kw)


@pytest.mark.parametrize(
    ("endpoints", "node", "cluster", "mode"),
    [
        ([_zoned("10.0.0.1", ["z1"]), _zoned("10.0.0.2", ["z2"])], ZONED, ["10.0.0.1"],
         TopologyMode.PREFER_SAME_ZONE),
        ([_zoned("10.0.0.1", ["z1"]), _zoned("10.0.0.2", None)], ZONED, ["10.0.0.1", "10.0.0.2"],
         TopologyMode.NONE),
        ([_zoned("10.0.0.1", ["z2"]), _zoned("10.0.0.2", ["z3"])], ZONED, ["10.0.0.1", "10.0.0.2"],
         TopologyMode.NONE),
        ([_zoned("10.0.0.1", ["z1"]), _zoned("10.0.0.2", ["z2"])], NodeConfig(hostname=NODE),
         ["10.0.0.1", "10.0.0.2"], TopologyMode.NONE),
        ([_zoned("10.0.0.1", ["z1"]), _zoned("10.0.0.2", None, ready=False)], ZONED, ["10.0.0.1"],
         TopologyMode.PREFER_SAME_ZONE),
    ],
    ids=["all hinted, one for us", "one hint missing", "no hint for our zone", "node has no zone",
         "unready endpoint's missing hint ignored"],
)
def test_zone_hints_narrow_cluster_endpoints(endpoints: list[Any], node: NodeConfig, cluster: list[str],
                                             mode: TopologyMode) -> None:
    """Zone hints narrow cluster endpoints only when every ready endpoint is hinted and one names our zone."""
    info = _info(*endpoints, node=node)
    assert (_ips(info.cluster_endpoints), info.topology) == (cluster, mode)


@pytest.mark.parametrize(
    ("endpoints", "cluster", "mode"),
    [
        ([endpoint("10.0.0.1", node_hints=[NODE], zone_hints=["z2"]),
          endpoint("10.0.0.2", node_hints=[OTHER_NODE], zone_hints=["z1"])],
         ["10.0.0.1"], TopologyMode.PREFER_SAME_NODE),
        ([endpoint("10.0.0.1", node_hints=[NODE], zone_hints=["z1"]),
          endpoint("10.0.0.2", zone_hints=["z1"])],
         ["10.0.0.1", "10.0.0.2"], TopologyMode.PREFER_SAME_ZONE),
        ([endpoint("10.0.0.1", node_hints=[OTHER_NODE], zone_hints=["z1"]),
          endpoint("10.0.0.2", node_hints=[OTHER_NODE], zone_hints=["z2"])],
         ["10.0.0.1"], TopologyMode.PREFER_SAME_ZONE),
    ],
    ids=["node hint for us", "node hint missing: zone", "no node hint for us: zone"],
)
def test_node_hints_take_precedence_over_zone_hints(endpoints: list[Any], cluster: list[str],
                                                    mode: TopologyMode) -> None:
    """PreferSameNode applies when every ready endpoint has a node hint and one names us, else zone hints."""
    info = _info(*endpoints, node=ZONED)
    assert (_ips(info.cluster_endpoints), info.topology) == (cluster, mode)


def test_topology_does_not_narrow_local_endpoints() -> None:
    """With ETP Local, local endpoints ignore hints pointing elsewhere."""
    eps = [endpoint("10.0.0.1", node=NODE, zone_hints=["z2"]), endpoint("10.0.0.2", zone_hints=["z1"])]
    info = _info(*eps, node=ZONED, type="NodePort", externalTrafficPolicy="Local",
                 ports=[port("http", 80, node_port=30080)])
    assert _ips(info.cluster_endpoints) == ["10.0.0.2"]
    assert _ips(info.local_endpoints) == ["10.0.0.1"]


# --- affinity and health checks --------------------------------------------------------------

@pytest.mark.parametrize(
    ("spec", "timeout"),
    [({}, None), ({"sessionAffinity": "ClientIP"}, 10800),
     ({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 30}}}, 30)],
)
def test_session_affinity_reaches_the_port(spec: dict[str, Any], timeout: int | None) -> None:
    """ClientIP affinity and its timeout (default 10800 s) are carried to every port."""
    info = _info(**spec)
    assert (info.session_affinity, info.session_affinity_timeout_s) == (timeout is not None, timeout)


@pytest.mark.parametrize(
    ("svc_type", "etp", "expected"),
    [("LoadBalancer", "Local", 32000), ("LoadBalancer", "Cluster", 0), ("NodePort", "Local", 0)],
)
def test_health_check_node_port_only_for_local_load_balancers(svc_type: str, etp: str, expected: int) -> None:
    """The health check node port is kept only for a LoadBalancer with ETP Local (NeedsHealthCheck)."""
    info = _info(type=svc_type, externalTrafficPolicy=etp, healthCheckNodePort=32000,
                 ports=[port("http", 80, node_port=30080)])
    assert info.health_check_node_port == expected
