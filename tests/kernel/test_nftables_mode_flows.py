"""Real connections through kube-proxy's nftables rules reach the endpoints the rules send them to.

The node topology of :mod:`tests.kernel.harness` (a node namespace, pods behind veths, a second
node with a remote pod, an external client) gets the nftables mode's full sync of the scenario
cluster (:func:`tests.scenarios.cluster`) through :class:`~kproxy.kernel.LinuxNftables`.
Every case of the shared table the kernel can carry is sent as real TCP connections and UDP
datagrams (IPv4); the answers must match the case: the verdict (answered, refused, timed out),
the endpoints that answered, and whether the endpoint saw the client's own address or the node's
(masquerade). The documented nftables differences from iptables are cases of their own: no
localhost NodePorts, NodePorts only on ``--nodeport-addresses`` (the primary IP by default),
REJECT for an undefined port of a ClusterIP and DROP for an unallocated ClusterIP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kproxy.kernel.nftables import LinuxNftables
from kproxy.model.names import IPFamily
from kproxy.modes.nftables import NftablesConfig, NftablesMode
from tests.conftest import require_kernel
from tests.kernel.harness import Answer, Probe, Topology, topology
from tests.scenarios import CASES, CLIENT_GW, NODE, NODE_IP, POD_GW, SOURCES, Case, cluster
from tests.unit.modes.kube import snapshot_of

pytestmark = pytest.mark.kernel

#: Attempts for a case with several endpoints: each is missed with probability 0.5 ** 20.
ATTEMPTS = 20

CONFIG = NftablesConfig(node_ips=(NODE_IP, CLIENT_GW, POD_GW), cluster_cidr=("10.0.0.0/8",),
                        service_cidrs=("172.30.0.0/16",))

#: The node's own addresses: what an endpoint sees of a masqueraded connection.
NODE_ADDRESSES = {NODE_IP, CLIENT_GW, POD_GW}

#: Cases of the shared table whose nftables answer differs from iptables' (see NFT_CASES).
IPTABLES_ONLY = {"nodeport-from-localhost", "etp-local-nodeport-from-localhost",
                 "no-endpoints-nodeport-from-localhost", "nodeport-on-another-local-address"}

#: The nftables-only expectations (kube-proxy's TestClusterIPGeneral, TestNodePorts, KEP-3866).
NFT_CASES = (
    Case(name="clusterip-undefined-port-rejected", source="pod", dst="172.30.0.41", dport=9999,
         verdict="REJECT"),
    Case(name="unallocated-clusterip-dropped", source="pod", dst="172.30.0.99", dport=80, verdict="DROP"),
    Case(name="no-localhost-nodeports", source="localhost", dst="127.0.0.1", dport=30003, verdict="REJECT"),
    Case(name="nodeport-only-on-primary-ip", source="external", dst=CLIENT_GW, dport=30003, verdict="REJECT"),
)


@pytest.fixture(scope="module")
def node() -> Iterator[Topology]:
    require_kernel("nft")
    with topology() as topo:
        kernel = LinuxNftables(IPFamily.IPv4, netns=topo.names["node"], timeout_s=30.0)
        mode = NftablesMode(CONFIG, kernel, now=lambda: 0.0)
        asyncio.run(mode.apply(snapshot_of(cluster(), hostname=NODE)))
        yield topo


def _probe(case: Case) -> Probe:
    ns, src = SOURCES[case.source]
    several = len(case.endpoints) > 1 or case.sticky
    return Probe(ns=ns, src=src, dst=case.dst, port=case.dport, proto=case.proto,
                 count=ATTEMPTS if several else 2, timeout_s=1.0)


def _problem(case: Case, answers: list[Answer]) -> str:
    kinds = {a.kind for a in answers}
    eps = {a.endpoint for a in answers if a.endpoint}
    got = f"{case.name}: kernel {sorted(kinds)} {sorted(eps)}"
    if kinds != {case.verdict_for("detect")}:
        return got + f"; expected {case.verdict_for('detect')}"
    want = set(case.endpoints_for("detect")) or ({"node:30000"} if case.verdict == "ACCEPT" else set())
    if (case.sticky and not (len(eps) == 1 and eps <= want)) or (not case.sticky and eps != want):
        return got + f"; expected endpoints {sorted(want)}"
    source = SOURCES[case.source][1]
    masq = case.masq_for("detect") and case.endpoints
    for a in answers:
        if not a.endpoint or a.endpoint == "node:30000":
            continue
        if (a.peer not in NODE_ADDRESSES) if masq else (a.peer != source):
            return got + f"; {a.endpoint} saw {a.peer}, expected {'a node address' if masq else source}"
    return ""


def test_connections_reach_the_endpoints_the_rules_choose(node: Topology) -> None:
    """Every kernel-capable case (ClusterIP, NodePort, external and LB IPs, TCP and UDP)."""
    cases = [c for c in (*CASES, *NFT_CASES) if c.kernel and c.name not in IPTABLES_ONLY]
    answers = node.probe([_probe(c) for c in cases])
    problems = [p for c, a in zip(cases, answers, strict=True) if (p := _problem(c, a))]
    assert not problems, "\n".join(problems)
