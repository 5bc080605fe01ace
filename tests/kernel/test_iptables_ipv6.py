"""IPv6 single stack against the real kernel: the emulator predicts what ip6tables does.

kube-proxy runs one proxier per IP family; on an IPv6-only node it writes its rules with
``ip6tables-restore``. This test builds the IPv6 twin of the IPv4 harness
(:func:`tests.kernel.harness.topology6`: ULA addresses, pods behind a link-local gateway as
Calico routes IPv6 pods, DAD off, IPv6 forwarding on), renders an IPv6 cluster with
:class:`~kproxy.modes.iptables.IptablesRenderer` for ``IPFamily.IPv6`` (Services with ClusterIPs
in ``fd00:30::/108``, EndpointSlices of ``addressType: IPv6``), loads it into the node through
:class:`~kproxy.kernel.LinuxNetfilter` (``ip6tables``; kube-proxy's jump rules, then
``ip6tables-restore --noflush``), sends real TCP and UDP, and compares every answer with what
the emulator (an IPv6 :class:`~emulation.Node` of the same shape and a version-6 ruleset) says
for the same packet: the verdict (answered / connection refused / timeout), the endpoints that
answered, and the client address each endpoint saw (masquerading).

The cases cover ClusterIP from a pod, from the node and from the endpoint itself (hairpin),
TCP and UDP NodePorts from the external client, a pod and the node, ``externalTrafficPolicy:
Local`` (client address kept; no local endpoint: DROP), a LoadBalancer IP with source ranges
(allowed, and DROP for a blocked source), the health check node port, and a Service without
endpoints (REJECT on its ClusterIP, NodePort, external IP and LoadBalancer IP, TCP and UDP).

Two IPv6 specifics are checked on the way:

- No NodePorts on IPv6 loopback. ``route_localnet`` exists for IPv4 only and the kernel never
  routes ``::1`` off ``lo``, so kube-proxy's ``syncProxyRules`` (pkg/proxy/iptables/proxier.go)
  excludes it from the KUBE-NODEPORTS tail call (``-m addrtype --dst-type LOCAL ! -d ::1/128``)
  and writes no KUBE-FIREWALL localnet rule. A connection from the node to ``[::1]:NODEPORT``
  is therefore not translated and reaches whatever listens on ``[::1]`` there (the test runs a
  server on it).
- MASQUERADE picks an IPv6 source address by RFC 6724 (``nf_nat_masquerade_ipv6`` calls
  ``ipv6_dev_get_saddr``), over all interfaces for a global destination: out of a pod veth
  that has only the link-local gateway, the masqueraded source is a global address of another
  interface (here the node IP), never ``fe80::1``. The emulator used to take the veth's first
  address; ``emulation/node.py`` now selects as the kernel does
  (``tests/emulation/test_node_ipv6_source.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from emulation import Interface, ManualClock, Node, Packet, Route
from emulation.netfilter import Netns, Ruleset
from emulation.packet import Protocol
from kproxy.kernel import EmulatedNetfilter
from kproxy.model import Snapshot
from kproxy.model.names import IPFamily
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer
from kproxy.modes.iptables.mode import load_now, program
from tests.conftest import require_kernel
from tests.kernel.harness import V6, Answer, Probe, Topology, endpoint_name, topology6
from tests.scenarios import EP_PORT, HEALTH_PORT
from tests.unit.modes.kube import endpoint_slice, ep, port, service, snapshot_of

pytestmark = pytest.mark.kernel

NODE, OTHER = "node-a", "node-b"
#: A NodePort of a Service with endpoints; a server on ``[::1]`` of the node listens on it too.
LOOPBACK_PORT = 30003
A, B, R = (endpoint_name(ip, EP_PORT) for ip in (V6.pa, V6.pb, V6.remote))
#: Who answers a connection that is not translated, by destination port: the node's servers.
LOCAL_SERVERS = {HEALTH_PORT: f"node:{HEALTH_PORT}", LOOPBACK_PORT: endpoint_name("::1", LOOPBACK_PORT)}
#: The address masqueraded traffic leaves with, towards a pod veth (RFC 6724: the global address
#: sharing the longest prefix with the pod) as towards the other node (eth1's own address).
MASQ = V6.node_ip

#: Where a probe comes from: (harness namespace key, source address, interface on the node;
#: None for a packet the node itself sends).
SOURCES: dict[str, tuple[str, str, str | None]] = {
    "pod": ("pc", V6.pod_client, "vp3"),
    "hairpin": ("pa", V6.pa, "vp1"),
    "node": ("node", V6.node_ip, None),
    "loopback": ("node", "::1", None),
    "external": ("client", V6.external, "eth0"),
    "blocked": ("client", V6.blocked, "eth0"),
}

#: kube-proxy with pod traffic detection (``--cluster-cidr``), without, and ``--masquerade-all``.
CONFIGS: dict[str, IptablesConfig] = {
    "detect": IptablesConfig(family=IPFamily.IPv6, node_ips=(V6.node_ip,), cluster_cidr=(V6.cluster_cidr,)),
    "nodetect": IptablesConfig(family=IPFamily.IPv6, node_ips=(V6.node_ip,)),
    "masqall": IptablesConfig(
        family=IPFamily.IPv6, node_ips=(V6.node_ip,), cluster_cidr=(V6.cluster_cidr,), masquerade_all=True
    ),
}

# Service addresses: ClusterIPs in fd00:30::/108, LoadBalancer IPs in fd00:40::/64, an external IP.
CIP1, CIP2, CIP3, CIP5, CIP6, CIP7 = (f"fd00:30::4{i}" for i in (1, 2, 3, 5, 6, 7))
LB2, LB5, LB6 = "fd00:40::2", "fd00:40::5", "fd00:40::6"
EXT_IP6 = "fd00:50::6"


def _v6_slice(ns: str, name: str, eps: list[dict[str, Any]], tcp_udp: bool = False) -> dict[str, Any]:
    ports = [("p80", EP_PORT, "TCP"), ("p81", EP_PORT, "UDP")] if tcp_udp else [("p80", EP_PORT, "TCP")]
    return endpoint_slice(ns, name, eps, ports, family="IPv6")


def _ports(node_port: int | None = None, udp: bool = False) -> list[dict[str, Any]]:
    extra: dict[str, Any] = {"nodePort": node_port} if node_port else {}
    tcp = [port("p80", 80, "TCP", targetPort=EP_PORT, **extra)]
    return [*tcp, port("p81", 81, "UDP", targetPort=EP_PORT, **extra)] if udp else tcp


def cluster6() -> list[dict[str, Any]]:
    """The IPv6 Services and EndpointSlices (API dicts), modelled on the IPv4 scenario cluster."""
    lb, np_ = "LoadBalancer", "NodePort"
    return [
        # ClusterIP, TCP and UDP, one local endpoint (hairpin from it).
        service("ns1", "svc1", CIP1, _ports(udp=True)),
        _v6_slice("ns1", "svc1", [ep(V6.pa, NODE)], tcp_udp=True),
        # LoadBalancer, eTP=Local, only a remote endpoint: external traffic is dropped; the
        # health check node port answers from the node.
        service("ns2", "svc2", CIP2, _ports(30002), type=lb, externalTrafficPolicy="Local",
                healthCheckNodePort=HEALTH_PORT, ingress=[LB2]),
        _v6_slice("ns2", "svc2", [ep(V6.remote, OTHER)]),
        # NodePort, TCP and UDP on one node port, a local and a remote endpoint.
        service("ns3", "svc3", CIP3, _ports(LOOPBACK_PORT, udp=True), type=np_),
        _v6_slice("ns3", "svc3", [ep(V6.pb, NODE), ep(V6.remote, OTHER)], tcp_udp=True),
        # LoadBalancer with source ranges (eTP=Cluster), one local endpoint.
        service("ns5", "svc5", CIP5, _ports(30005), type=lb, loadBalancerSourceRanges=["fd00:ff::/121"],
                ingress=[LB5]),
        _v6_slice("ns5", "svc5", [ep(V6.pa, NODE)]),
        # No endpoints: REJECT on every address type, TCP and UDP.
        service("ns6", "svc6", CIP6, _ports(30006, udp=True), type=lb, externalIPs=[EXT_IP6], ingress=[LB6]),
        # NodePort, eTP=Local with a local and a remote endpoint.
        service("ns7", "svc7", CIP7, _ports(30007), type=np_, externalTrafficPolicy="Local"),
        _v6_slice("ns7", "svc7", [ep(V6.pa, NODE), ep(V6.remote, OTHER)]),
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Case6:
    """A packet and what kube-proxy's rules do with it under ``detect`` (the kernel and the
    emulator are compared under every configuration).

    Attributes:
        name: the test id.
        source: a key of :data:`SOURCES`.
        dst, dport, proto: where it goes.
        verdict: ACCEPT, DROP or REJECT.
        endpoints: the endpoints that may answer (empty: a server on the node, not translated).
        seen_as: the client address the endpoint sees; None: the source's own.
    """

    name: str
    source: str
    dst: str
    dport: int
    proto: Protocol = "tcp"
    verdict: str = "ACCEPT"
    endpoints: tuple[str, ...] = ()
    seen_as: str | None = None


# fmt: off
CASES: tuple[Case6, ...] = (
    Case6("clusterip-from-pod", "pod", CIP1, 80, endpoints=(A,)),
    Case6("clusterip-udp-from-pod", "pod", CIP1, 81, "udp", endpoints=(A,)),
    Case6("clusterip-from-node", "node", CIP1, 80, endpoints=(A,), seen_as=MASQ),
    Case6("clusterip-udp-from-node", "node", CIP1, 81, "udp", endpoints=(A,), seen_as=MASQ),
    Case6("clusterip-hairpin", "hairpin", CIP1, 80, endpoints=(A,), seen_as=MASQ),
    Case6("etp-local-no-local-eps-nodeport-external", "external", V6.node_ip, 30002, verdict="DROP"),
    Case6("etp-local-no-local-eps-lb-external", "external", LB2, 80, verdict="DROP"),
    Case6("health-check-node-port", "external", V6.node_ip, HEALTH_PORT),
    Case6("nodeport-from-external", "external", V6.node_ip, LOOPBACK_PORT, endpoints=(B, R), seen_as=MASQ),
    Case6("nodeport-udp-from-external", "external", V6.node_ip, LOOPBACK_PORT, "udp", endpoints=(B, R),
          seen_as=MASQ),
    Case6("nodeport-on-another-local-address", "external", V6.client_gw, LOOPBACK_PORT, endpoints=(B, R),
          seen_as=MASQ),
    Case6("nodeport-from-pod", "pod", V6.node_ip, LOOPBACK_PORT, endpoints=(B, R), seen_as=MASQ),
    Case6("nodeport-from-node", "node", V6.node_ip, LOOPBACK_PORT, endpoints=(B, R), seen_as=MASQ),
    Case6("no-nodeport-on-ipv6-loopback", "loopback", "::1", LOOPBACK_PORT),
    Case6("lb-from-allowed-external", "external", LB5, 80, endpoints=(A,), seen_as=MASQ),
    Case6("lb-from-blocked-external", "blocked", LB5, 80, verdict="DROP"),
    Case6("lb-nodeport-ignores-source-ranges", "blocked", V6.node_ip, 30005, endpoints=(A,), seen_as=MASQ),
    Case6("no-endpoints-clusterip", "pod", CIP6, 80, verdict="REJECT"),
    Case6("no-endpoints-clusterip-udp", "pod", CIP6, 81, "udp", verdict="REJECT"),
    Case6("no-endpoints-clusterip-from-node", "node", CIP6, 80, verdict="REJECT"),
    Case6("no-endpoints-nodeport", "external", V6.node_ip, 30006, verdict="REJECT"),
    Case6("no-endpoints-nodeport-udp", "external", V6.node_ip, 30006, "udp", verdict="REJECT"),
    Case6("no-endpoints-externalip", "external", EXT_IP6, 80, verdict="REJECT"),
    Case6("no-endpoints-lb-udp", "external", LB6, 81, "udp", verdict="REJECT"),
    Case6("etp-local-nodeport-external", "external", V6.node_ip, 30007, endpoints=(A,)),
    Case6("etp-local-nodeport-from-pod", "pod", V6.node_ip, 30007, endpoints=(A, R)),
)
# fmt: on

#: Attempts for a case with several endpoints: one is missed with probability 2 * 0.5 ** 20.
ATTEMPTS = 20
#: How long a TCP attempt may wait: past the first SYN retransmission (1 s), with a margin.
TCP_TIMEOUT_S = 2.0
#: How long a UDP attempt may wait.
UDP_TIMEOUT_S = 1.0


def node_model6() -> Node:
    """The IPv6 node namespace as the emulator sees it (what :func:`topology6` builds)."""
    return Node(
        interfaces=(
            Interface(name="eth0", addresses=(f"{V6.client_gw}/64",)),
            Interface(name="eth1", addresses=(f"{V6.node_ip}/64",)),
            *(Interface(name=dev, addresses=(f"{V6.pod_gw}/64",)) for _, dev in V6.links),
        ),
        routes=(
            *(Route(destination=f"{ip}/128", device=dev) for ip, dev in V6.links),
            Route(destination=V6.remote_pods, device="eth1", via=V6.node2_ip),
            Route(destination="default", device="eth1", via=V6.node2_ip, version=6),
        ),
    )


def _snapshot() -> Snapshot:
    return snapshot_of(cluster6(), hostname=NODE)


def load_emulator6(config: IptablesConfig) -> Netns:
    """An emulated IPv6 node holding kube-proxy's rules for :func:`cluster6` (a full sync)."""
    netns = Netns(node_model6(), ManualClock(), ruleset=Ruleset(6))
    load_now(EmulatedNetfilter(netns, IPFamily.IPv6), IptablesRenderer(config).render(_snapshot(), full=True))
    return netns


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """The emulator's view of a case: its verdict, the endpoints that may answer (a server on
    the node when nothing is translated) and the client addresses each of them may see."""

    verdict: str
    endpoints: frozenset[str]
    peers: dict[str, set[str]]


def predict(netns: Netns, case: Case6) -> Prediction:
    """Enumerate the case's first packet in the emulated node and summarise the outcomes."""
    _, src, iif = SOURCES[case.source]
    packet = Packet(
        src=src, dst=case.dst, sport=40000, dport=case.dport, protocol=case.proto, in_interface=iif
    )
    outcomes = netns.enumerate(packet)
    verdicts = {o.verdict for _, o in outcomes}
    assert len(verdicts) == 1, f"{case.name}: the emulator's outcomes disagree: {verdicts}"
    peers: dict[str, set[str]] = {}
    for _, o in outcomes:
        if o.verdict == "ACCEPT":
            where = o.destination if o.dnat else LOCAL_SERVERS.get(o.packet.dport, o.destination)
            peers.setdefault(where, set()).add(o.packet.src)
    return Prediction(verdict=verdicts.pop(), endpoints=frozenset(peers), peers=peers)  # fmt: skip


@pytest.fixture(scope="module")
def node6() -> Iterator[Topology]:
    require_kernel("ip6tables-restore", "ip6tables-save", "ip6tables", "sysctl")
    loopback = ("node", "::1", LOOPBACK_PORT, LOCAL_SERVERS[LOOPBACK_PORT], False)
    with topology6(extra_servers=[loopback]) as topo:
        yield topo


def _probe(case: Case6) -> Probe:
    """Several attempts where endpoints are chosen at random, two for one endpoint, one for a
    DROP or REJECT. A TCP attempt waits past one SYN retransmission: see
    :func:`test_kernel_agrees_with_the_emulator_ipv6` for why a refused IPv6 connect needs it."""
    ns, src, _ = SOURCES[case.source]
    count = ATTEMPTS if len(case.endpoints) > 1 else 2 if case.verdict == "ACCEPT" else 1
    timeout = TCP_TIMEOUT_S if case.proto == "tcp" else UDP_TIMEOUT_S
    return Probe(ns=ns, src=src, dst=case.dst, port=case.dport, proto=case.proto, count=count,
                 timeout_s=timeout)  # fmt: skip


def _problem(case: Case6, want: Prediction, got: list[Answer]) -> str | None:
    """Why the kernel's answers disagree with the emulator's prediction; None if they agree."""
    kinds = {a.kind for a in got}
    eps = {a.endpoint for a in got if a.endpoint}
    peers = {(a.endpoint, a.peer) for a in got if a.endpoint and a.peer}
    ok = kinds == {want.verdict} and eps == set(want.endpoints)
    ok = ok and all(peer in want.peers.get(e, set()) for e, peer in peers)
    if ok:
        return None
    return (f"{case.name}: kernel {sorted(kinds)} {sorted(eps)} peers {sorted(peers)}; "
            f"emulator {want.verdict} {sorted(want.endpoints)} peers {want.peers}")  # fmt: skip


def test_cases_say_what_kube_proxy_does() -> None:
    """Under ``detect`` the emulator gives each case its verdict, endpoints and client address,
    so agreeing with the kernel below means agreeing on kube-proxy's behaviour."""
    emulator = load_emulator6(CONFIGS["detect"])
    wrong = []
    for case in CASES:
        want = predict(emulator, case)
        local = {LOCAL_SERVERS[case.dport]} if case.verdict == "ACCEPT" and not case.endpoints else set()
        endpoints = set(case.endpoints) | local
        seen = {e: {case.seen_as or SOURCES[case.source][1]} for e in endpoints}
        if (want.verdict, set(want.endpoints), want.peers) != (case.verdict, endpoints, seen):
            wrong.append(f"{case.name}: emulator {want.verdict} {want.peers}")
    assert not wrong, "\n".join(wrong)


def test_no_ipv4_only_rules() -> None:
    """The IPv6 rules send NodePorts to KUBE-NODEPORTS on every local address but ``::1`` and
    write no localnet firewall rule (``route_localnet`` is IPv4 only)."""
    text = IptablesRenderer(CONFIGS["detect"]).render(_snapshot(), full=True).text
    assert "-m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS" in text
    assert "127.0.0.0/8" not in text
    assert ":KUBE-FIREWALL" not in text


@pytest.mark.parametrize("config", list(CONFIGS))
def test_kernel_agrees_with_the_emulator_ipv6(node6: Topology, config: str) -> None:
    """Every case, under each configuration: the kernel's verdict is the emulator's, the
    endpoints that answered are those the emulator may choose, and each saw the client address
    the emulator predicts.

    A refused IPv6 TCP connect takes one SYN retransmission here (about 1 s): the ICMPv6 port
    unreachable for the first SYN comes back while ``connect`` still holds the socket lock, so
    ``tcp_v6_err`` can only record it as a soft error (``TcpExtLockDroppedIcmps``); the error
    for the retransmitted SYN, handled from the timer, aborts the connect with ECONNREFUSED.
    The same IPv4 connect is refused at once on the test kernel. Hence :data:`TCP_TIMEOUT_S`.
    """
    asyncio.run(program(node6.kernel, IptablesRenderer(CONFIGS[config]).render(_snapshot(), full=True)))
    emulator = load_emulator6(CONFIGS[config])
    answers = node6.probe([_probe(c) for c in CASES])
    problems = [p for c, got in zip(CASES, answers, strict=True)
                if (p := _problem(c, predict(emulator, c), got))]  # fmt: skip
    assert not problems, "\n".join(problems)
