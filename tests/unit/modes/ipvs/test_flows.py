# ruff: noqa: E501  (the case table keeps one case per line)
"""kube-proxy's ipvs mode through whole-packet traces: netfilter, ipsets and IPVS on one emulated node.

The cluster and topology are :mod:`tests.scenarios`' (kube-proxy's proxier_test.go
services); the node IPs are both of the node's addresses, so NodePorts answer on each, as
kube-proxy's ipvs proxier puts a virtual server on every node address.
"""

from __future__ import annotations

import asyncio

import pytest

from emulation import ManualClock
from kproxy.kernel.ipvs_node import IpvsNode
from kproxy.modes.ipvs import IpvsConfig
from kproxy.modes.ipvs.mode import IpvsMode
from kproxy.trace.ipvs import trace_ipvs
from tests.scenarios import (
    CASES,
    CLIENT_GW,
    NODE,
    NODE_IP,
    PA,
    PB,
    REMOTE,
    case_packet,
    cluster,
    node_model,
)
from tests.unit.modes.kube import snapshot_of

A, B, R = f"{PA}:8080", f"{PB}:8080", f"{REMOTE}:8080"
CONFIG = IpvsConfig(node_ips=(NODE_IP, CLIENT_GW), cluster_cidr=("10.0.0.0/8",))

# name -> (verdict, endpoint shares over 4 new connections, masquerade)
EXPECTED: dict[str, tuple[str, dict[str, float], bool]] = {
    "clusterip-from-pod": ("ACCEPT", {A: 1.0}, False),
    "clusterip-from-node": ("ACCEPT", {A: 1.0}, True),             # ! -s 10.0.0.0/8 -> KUBE-MARK-MASQ
    "clusterip-from-external": ("ACCEPT", {A: 1.0}, True),
    "clusterip-hairpin": ("ACCEPT", {A: 1.0}, True),               # KUBE-LOOP-BACK dst,dst,src -> MASQUERADE
    "clusterip-udp-from-pod": ("ACCEPT", {A: 1.0}, False),
    "clusterip-wrong-protocol": ("REJECT", {}, False),             # KUBE-IPVS-FILTER: NEW to a KUBE-IPVS-IPS address
    "etp-local-no-local-eps-nodeport-external": ("ACCEPT", {R: 1.0}, False),  # cluster fallback (PR 97081)
    "etp-local-no-local-eps-lb-external": ("ACCEPT", {R: 1.0}, False),
    "health-check-node-port": ("ACCEPT", {}, False),
    "nodeport-from-external": ("ACCEPT", {B: 0.5, R: 0.5}, True),
    "nodeport-udp-from-external": ("ACCEPT", {B: 0.5, R: 0.5}, True),
    "nodeport-on-another-local-address": ("ACCEPT", {B: 0.5, R: 0.5}, True),
    "nodeport-from-pod": ("ACCEPT", {B: 0.5, R: 0.5}, True),
    "nodeport-from-node": ("ACCEPT", {B: 0.5, R: 0.5}, True),
    "nodeport-from-localhost": ("ACCEPT", {}, False),              # no virtual server on loopback
    "externalip-from-external": ("ACCEPT", {A: 0.5, B: 0.5}, True),
    # persistence: one client, one endpoint; rr starts at the list head, the last added (10.180.1.1)
    "lb-from-allowed-external": ("ACCEPT", {R: 1.0}, True),
    "lb-from-blocked-external": ("DROP", {}, False),               # KUBE-SOURCE-RANGES-FIREWALL
    "lb-nodeport-ignores-source-ranges": ("ACCEPT", {R: 1.0}, True),
    "no-endpoints-clusterip": ("REJECT", {}, False),               # ip_vs_leave: ICMP port unreachable
    "no-endpoints-clusterip-from-node": ("REJECT", {}, False),
    "no-endpoints-nodeport": ("REJECT", {}, False),
    "no-endpoints-externalip": ("REJECT", {}, False),
    "no-endpoints-lb": ("REJECT", {}, False),
    "etp-local-nodeport-external": ("ACCEPT", {A: 1.0}, False),    # KUBE-NODE-PORT-LOCAL-TCP: RETURN
    "etp-local-nodeport-from-node": ("ACCEPT", {A: 1.0}, False),    # -LOCAL set: RETURN before the mark
    "etp-local-clusterip-from-pod": ("ACCEPT", {A: 0.5, R: 0.5}, False),
    "itp-local-from-pod": ("ACCEPT", {B: 1.0}, False),
    "itp-local-no-local-endpoints": ("REJECT", {}, False),         # empty virtual server
    "terminating-ready-wins": ("ACCEPT", {R: 1.0}, False),
    "terminating-fallback": ("ACCEPT", {B: 1.0}, False),
    "terminating-etp-local-external-uses-local-terminating": ("ACCEPT", {A: 1.0}, False),
    "sctp-clusterip": ("ACCEPT", {A: 1.0}, False),
}


@pytest.fixture(scope="module")
def node() -> IpvsNode:
    """The scenario cluster programmed by the ipvs mode into an emulated node."""
    node = IpvsNode(node_model(), ManualClock())
    asyncio.run(IpvsMode.emulated(CONFIG, node).apply(snapshot_of(cluster(), hostname=NODE)))
    return node


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_ipvs_flow(node: IpvsNode, name: str) -> None:
    """The case's packet gets kube-proxy's ipvs-mode verdict, endpoints and masquerade."""
    case = next(c for c in CASES if c.name == name)
    verdict, endpoints, masq = EXPECTED[name]
    result = trace_ipvs(node, case_packet(case), connections=4)
    got = {e.address: e.probability for e in result.endpoints}
    assert (result.verdict, got, result.masquerade) == (verdict, endpoints, masq), result.trace


def test_trace_shows_netfilter_and_ipvs_in_order(node: IpvsNode) -> None:
    """One trace holds PREROUTING, INPUT, the IPVS step, then OUTPUT and POSTROUTING."""
    case = next(c for c in CASES if c.name == "nodeport-from-external")
    result = trace_ipvs(node, case_packet(case))
    hooks = [t.hook for t in result.trace]
    first_ipvs = hooks.index("LOCAL_IN")
    assert "PREROUTING" in hooks[:first_ipvs] and "INPUT" in hooks[:first_ipvs]
    assert "POSTROUTING" in hooks[first_ipvs:]
    assert result.virtual_server == f"TCP {NODE_IP}:30003"
    assert result.real_server in (B, R)
    assert any(t.chain == "KUBE-POSTROUTING" and "MASQUERADE" in t.rule for t in result.trace)


def test_node_originated_packet_meets_ipvs_at_local_out(node: IpvsNode) -> None:
    """A packet the node sends meets IPVS at LOCAL_OUT, after nat OUTPUT marked it."""
    case = next(c for c in CASES if c.name == "clusterip-from-node")
    result = trace_ipvs(node, case_packet(case))
    hooks = [t.hook for t in result.trace]
    assert "LOCAL_OUT" in hooks and "INPUT" not in hooks
    assert hooks.index("OUTPUT") < hooks.index("LOCAL_OUT")


def test_enumerate_changes_nothing(node: IpvsNode) -> None:
    """Tracing twice gives the same answer: the IPVS table is not advanced by a trace."""
    case = next(c for c in CASES if c.name == "nodeport-from-external")
    assert trace_ipvs(node, case_packet(case)).real_server == trace_ipvs(node, case_packet(case)).real_server
    assert not list(node.ipvs.entries())


def test_arriving_packet_to_a_loopback_real_server_is_dropped_as_ip_vs_nat_xmit() -> None:
    """From a pod, IPVS does not DNAT to a loopback real server ('stopping DNAT to loopback address')."""
    from kproxy.testing import Cluster, NodeSpec
    from kproxy.testing.cluster import Origin, Packet, Target
    from kproxy.testing.modes import get_mode

    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lo", "namespace": "t"},
           "spec": {"clusterIP": "10.96.50.1", "ports": [{"port": 80}]}}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "lo-1", "namespace": "t", "labels": {"kubernetes.io/service-name": "lo"}},
           "addressType": "IPv4", "ports": [{"port": 8080}],
           "endpoints": [{"addresses": ["127.0.50.1"], "nodeName": "node-a"}]}
    cluster = Cluster(manifests=(svc, eps), node=NodeSpec(hostname="node-a"))
    outcome = get_mode("ipvs").outcome(cluster, Packet(
        origin=Origin.EXTERNAL, target=Target.CLUSTER_IP, src="203.0.113.9", sport=40000,
        dst="10.96.50.1", dport=80))
    assert outcome.verdict.value == "DROP"
