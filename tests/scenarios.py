# ruff: noqa: E501  (the case table keeps one case per line)
"""One cluster, one node topology and a table of packet-flow cases: the scenario of the flow
suite run on both executors (``tests/kernel/test_iptables_flows.py``), which the other kernel
suites, the ipvs mode's flows (``tests/unit/modes/ipvs/test_flows.py``) and the command tests
build on.

The cluster follows kube-proxy's ``proxier_test.go`` (``TestOverallIPTablesRules``,
``TestNoEndpointsReject``, ``TestLoadBalancer``, ``TestNodePorts``, ``TestHealthCheckNodePort``,
``TestExternalTrafficPolicyLocal/Cluster``, ``TestInternalTrafficPolicy``,
``TestEndpointsTerminating*``, ``TestMasqueradeRule``), with endpoints that exist in the kernel
harness: pods ``10.180.0.1`` and ``10.180.0.2`` on this node (``node-a``) and ``10.180.1.1`` on
``node-b``, reached through the node. Every endpoint serves TCP and UDP on port 8080.

The topology (what the harness builds and :func:`node_model` describes to the emulator)::

    client ns  203.0.113.2/24, .130/24 --eth0-- 203.0.113.1/24  NODE  192.168.0.2/24 --eth1-- 192.168.0.3/24  node-b ns
                                                                 |  |  |                    (pod 10.180.1.1 on its lo)
                    pod pa 10.180.0.1 --vp1-- 169.254.1.1/32 ----+  |  +---- vp3 -- pod pc 10.0.0.2 (a client pod)
                    pod pb 10.180.0.2 --vp2-- 169.254.1.1/32 -------+

Masquerading out of a pod veth picks 169.254.1.1; out of eth1, 192.168.0.2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from emulation import Interface, ManualClock, Node, Packet, Route
from emulation.netfilter import Netns
from kproxy.kernel import EmulatedNetfilter
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer
from kproxy.modes.iptables.mode import load_now
from kproxy.trace import trace_packet
from tests.unit.modes.kube import endpoint_slice, ep, port, service, snapshot_of

NODE = "node-a"
OTHER = "node-b"
NODE_IP = "192.168.0.2"
NODE2_IP = "192.168.0.3"
CLIENT_GW = "203.0.113.1"
POD_GW = "169.254.1.1"
EXTERNAL = "203.0.113.2"
BLOCKED = "203.0.113.130"
POD_CLIENT = "10.0.0.2"
PA, PB, REMOTE = "10.180.0.1", "10.180.0.2", "10.180.1.1"
EP_PORT = 8080
HEALTH_PORT = 30000
#: The veth on the node that leads to each pod.
POD_LINKS = {PA: "vp1", PB: "vp2", POD_CLIENT: "vp3"}


def node_model() -> Node:
    """The node namespace as the emulator sees it (see the module docstring)."""
    return Node(
        interfaces=(
            Interface(name="eth0", addresses=(f"{CLIENT_GW}/24",)),
            Interface(name="eth1", addresses=(f"{NODE_IP}/24",)),
            *(Interface(name=dev, addresses=(f"{POD_GW}/32",)) for dev in POD_LINKS.values()),
        ),
        routes=(
            *(Route(destination=f"{ip}/32", device=dev) for ip, dev in POD_LINKS.items()),
            Route(destination="10.180.1.0/24", device="eth1", via=NODE2_IP),
            Route(destination="default", device="eth1", via=NODE2_IP),
        ),
        route_localnet=True,
    )


#: The three configurations of the masquerade matrix.
CONFIGS: dict[str, IptablesConfig] = {
    "detect": IptablesConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",)),
    "nodetect": IptablesConfig(node_ips=(NODE_IP,)),
    "masqall": IptablesConfig(node_ips=(NODE_IP,), cluster_cidr=("10.0.0.0/8",), masquerade_all=True),
}


def _slice(ns: str, name: str, eps: list[dict[str, Any]], ports: list[tuple[str, int, str]]) -> dict[str, Any]:
    return endpoint_slice(ns, name, eps, ports)


TCP = [("p80", EP_PORT, "TCP")]
TERMINATING = {"ready": False, "serving": True, "terminating": True}


def cluster() -> list[dict[str, Any]]:
    """The Services and EndpointSlices (API dicts)."""
    return [
        # ClusterIP, TCP and UDP ports (TestOverallIPTablesRules svc1; hairpin).
        service("ns1", "svc1", "172.30.0.41", [port("p80", 80, targetPort=EP_PORT), port("p81", 81, "UDP", targetPort=EP_PORT)]),
        _slice("ns1", "svc1", [ep(PA, NODE)], [("p80", EP_PORT, "TCP"), ("p81", EP_PORT, "UDP")]),
        # LoadBalancer, eTP=Local, only a remote endpoint (svc2): external traffic is dropped.
        service("ns2", "svc2", "172.30.0.42", [port("p80", 80, targetPort=EP_PORT, nodePort=30002)], type="LoadBalancer",
                externalTrafficPolicy="Local", healthCheckNodePort=HEALTH_PORT, externalIPs=["192.168.99.22"], ingress=["1.2.3.4"]),
        _slice("ns2", "svc2", [ep(REMOTE, OTHER)], TCP),
        # NodePort, TCP and UDP on the same node port, a local and a remote endpoint (svc3).
        service("ns3", "svc3", "172.30.0.43", [port("p80", 80, targetPort=EP_PORT, nodePort=30003),
                                               port("p81", 81, "UDP", targetPort=EP_PORT, nodePort=30003)], type="NodePort"),
        _slice("ns3", "svc3", [ep(PB, NODE), ep(REMOTE, OTHER)], [("p80", EP_PORT, "TCP"), ("p81", EP_PORT, "UDP")]),
        # ClusterIP with an external IP (svc4).
        service("ns4", "svc4", "172.30.0.44", [port("p80", 80, targetPort=EP_PORT)], externalIPs=["192.168.99.33"]),
        _slice("ns4", "svc4", [ep(PA, NODE), ep(PB, NODE)], TCP),
        # LoadBalancer, eTP=Cluster, source ranges, ClientIP affinity (svc5).
        service("ns5", "svc5", "172.30.0.45", [port("p80", 80, targetPort=EP_PORT, nodePort=30005)], type="LoadBalancer",
                loadBalancerSourceRanges=[" 203.0.113.0/25"], sessionAffinity="ClientIP", ingress=["5.6.7.8"]),
        _slice("ns5", "svc5", [ep(PA, NODE), ep(REMOTE, OTHER)], TCP),
        # No endpoints at all: REJECT on every address type (TestNoEndpointsReject).
        service("ns6", "svc6", "172.30.0.46", [port("p80", 80, targetPort=EP_PORT, nodePort=30006)], type="LoadBalancer",
                externalIPs=["192.168.99.66"], ingress=["9.10.11.12"]),
        # NodePort, eTP=Local with a local endpoint (TestExternalTrafficPolicyLocal).
        service("ns7", "svc7", "172.30.0.47", [port("p80", 80, targetPort=EP_PORT, nodePort=30007)], type="NodePort",
                externalTrafficPolicy="Local"),
        _slice("ns7", "svc7", [ep(PA, NODE), ep(REMOTE, OTHER)], TCP),
        # internalTrafficPolicy=Local (TestInternalTrafficPolicy): with and without local endpoints.
        service("ns8", "svc8", "172.30.0.48", [port("p80", 80, targetPort=EP_PORT)], internalTrafficPolicy="Local"),
        _slice("ns8", "svc8", [ep(PB, NODE), ep(REMOTE, OTHER)], TCP),
        service("ns9", "svc9", "172.30.0.49", [port("p80", 80, targetPort=EP_PORT)], internalTrafficPolicy="Local"),
        _slice("ns9", "svc9", [ep(REMOTE, OTHER)], TCP),
        # Terminating endpoints (TestEndpointsTerminating*): ready ones win; else serving-terminating.
        service("ns10", "svc10", "172.30.0.50", [port("p80", 80, targetPort=EP_PORT)]),
        _slice("ns10", "svc10", [ep(PA, NODE, **TERMINATING), ep(REMOTE, OTHER)], TCP),
        service("ns11", "svc11", "172.30.0.51", [port("p80", 80, targetPort=EP_PORT)]),
        _slice("ns11", "svc11", [ep(PB, NODE, **TERMINATING)], TCP),
        service("ns12", "svc12", "172.30.0.52", [port("p80", 80, targetPort=EP_PORT, nodePort=30012)], type="NodePort",
                externalTrafficPolicy="Local"),
        _slice("ns12", "svc12", [ep(PA, NODE, **TERMINATING), ep(REMOTE, OTHER)], TCP),
        # SCTP (emulator only: no SCTP sockets on the test machines).
        service("ns13", "svc13", "172.30.0.53", [port("p80", 80, "SCTP", targetPort=EP_PORT)]),
        _slice("ns13", "svc13", [ep(PA, NODE)], [("p80", EP_PORT, "SCTP")]),
    ]


# Where a packet comes from: the namespace it is sent from in the kernel harness, and its source.
SOURCES = {
    "pod": ("pc", POD_CLIENT),
    "hairpin": ("pa", PA),
    "node": ("node", NODE_IP),
    "localhost": ("node", "127.0.0.1"),
    "external": ("client", EXTERNAL),
    "blocked": ("client", BLOCKED),
}

M = tuple[bool, bool, bool]  # masquerade under (detect, nodetect, masqall)
ALL: M = (True, True, True)
NONE: M = (False, False, False)
OUTSIDE: M = (True, False, True)   # ClusterIP from outside the pod CIDR
POD: M = (False, False, True)      # ClusterIP from a pod


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """A packet and what kube-proxy's rules do with it.

    Attributes:
        name: the case's name (the test id).
        source: a key of :data:`SOURCES`.
        dst, dport, proto: where it goes.
        verdict: ACCEPT, DROP or REJECT.
        endpoints: ``{"ip:port": probability}``; empty when not translated.
        masq: masquerade under each of :data:`CONFIGS` (detect, nodetect, masqall).
        verdicts: a per-configuration verdict where it differs (``{"nodetect": "DROP"}``).
        overrides: per-configuration endpoints where they differ.
        kernel: the kernel harness can send it (False for SCTP, and for packets whose fate in
            the kernel depends on more than netfilter, such as a closed port answering RST).
        sticky: ClientIP affinity: after the first connection, a client keeps its endpoint.
    """

    name: str
    source: str
    dst: str
    dport: int
    proto: str = "tcp"
    verdict: str = "ACCEPT"
    endpoints: dict[str, float] = field(default_factory=dict)
    masq: M = NONE
    verdicts: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, dict[str, float]] = field(default_factory=dict)
    kernel: bool = True
    sticky: bool = False

    def verdict_for(self, config: str) -> str:
        """The verdict under ``config``."""
        return self.verdicts.get(config, self.verdict)

    def endpoints_for(self, config: str) -> dict[str, float]:
        """The endpoints under ``config``."""
        return self.overrides.get(config, self.endpoints)

    def masq_for(self, config: str) -> bool:
        """Whether it is masqueraded under ``config``."""
        return self.masq[list(CONFIGS).index(config)]


A, B, R = f"{PA}:{EP_PORT}", f"{PB}:{EP_PORT}", f"{REMOTE}:{EP_PORT}"
HALF = 0.5

CASES: tuple[Case, ...] = (
    # ClusterIP (svc1): pod, node, localhost-less external, hairpin, UDP.
    Case(name="clusterip-from-pod", source="pod", dst="172.30.0.41", dport=80, endpoints={A: 1.0}, masq=POD),
    Case(name="clusterip-from-node", source="node", dst="172.30.0.41", dport=80, endpoints={A: 1.0}, masq=OUTSIDE),
    Case(name="clusterip-from-external", source="external", dst="172.30.0.41", dport=80, endpoints={A: 1.0}, masq=OUTSIDE),
    Case(name="clusterip-hairpin", source="hairpin", dst="172.30.0.41", dport=80, endpoints={A: 1.0}, masq=ALL),
    Case(name="clusterip-udp-from-pod", source="pod", dst="172.30.0.41", dport=81, proto="udp", endpoints={A: 1.0}, masq=POD),
    Case(name="clusterip-udp-from-node", source="node", dst="172.30.0.41", dport=81, proto="udp", endpoints={A: 1.0}, masq=OUTSIDE),
    Case(name="clusterip-wrong-protocol", source="pod", dst="172.30.0.41", dport=81, proto="tcp", verdict="ACCEPT", kernel=False),
    # svc2: LoadBalancer eTP=Local without local endpoints.
    Case(name="etp-local-no-local-eps-nodeport-external", source="external", dst=NODE_IP, dport=30002, verdict="DROP"),
    Case(name="etp-local-no-local-eps-lb-external", source="external", dst="1.2.3.4", dport=80, verdict="DROP"),
    Case(name="etp-local-no-local-eps-externalip-external", source="external", dst="192.168.99.22", dport=80, verdict="DROP"),
    Case(name="etp-local-no-local-eps-lb-from-pod-short-circuit", source="pod", dst="1.2.3.4", dport=80, endpoints={R: 1.0},
         verdicts={"nodetect": "DROP"}, overrides={"nodetect": {}}),
    Case(name="etp-local-no-local-eps-lb-from-node", source="node", dst="1.2.3.4", dport=80, endpoints={R: 1.0}, masq=ALL),
    Case(name="etp-local-no-local-eps-clusterip-from-pod", source="pod", dst="172.30.0.42", dport=80, endpoints={R: 1.0}, masq=POD),
    Case(name="health-check-node-port", source="external", dst=NODE_IP, dport=HEALTH_PORT),
    # svc3: NodePort, eTP=Cluster, TCP and UDP.
    Case(name="nodeport-from-external", source="external", dst=NODE_IP, dport=30003, endpoints={B: HALF, R: HALF}, masq=ALL),
    Case(name="nodeport-udp-from-external", source="external", dst=NODE_IP, dport=30003, proto="udp", endpoints={B: HALF, R: HALF}, masq=ALL),
    Case(name="nodeport-on-another-local-address", source="external", dst=CLIENT_GW, dport=30003, endpoints={B: HALF, R: HALF}, masq=ALL),
    Case(name="nodeport-from-pod", source="pod", dst=NODE_IP, dport=30003, endpoints={B: HALF, R: HALF}, masq=ALL),
    Case(name="nodeport-from-node", source="node", dst=NODE_IP, dport=30003, endpoints={B: HALF, R: HALF}, masq=ALL),
    Case(name="nodeport-from-localhost", source="localhost", dst="127.0.0.1", dport=30003, endpoints={B: HALF, R: HALF}, masq=ALL),
    Case(name="nodeport-wrong-port", source="external", dst=NODE_IP, dport=30999, kernel=False),
    # svc4: external IP.
    Case(name="externalip-from-external", source="external", dst="192.168.99.33", dport=80, endpoints={A: HALF, B: HALF}, masq=ALL),
    Case(name="externalip-from-pod", source="pod", dst="192.168.99.33", dport=80, endpoints={A: HALF, B: HALF}, masq=ALL),
    # svc5: LoadBalancer with source ranges (TestLoadBalancer).
    Case(name="lb-from-allowed-external", source="external", dst="5.6.7.8", dport=80, endpoints={A: HALF, R: HALF}, masq=ALL, sticky=True),
    Case(name="lb-from-blocked-external", source="blocked", dst="5.6.7.8", dport=80, verdict="DROP"),
    Case(name="lb-nodeport-ignores-source-ranges", source="blocked", dst=NODE_IP, dport=30005, endpoints={A: HALF, R: HALF}, masq=ALL, sticky=True),
    # svc6: no endpoints: REJECT for every address type.
    Case(name="no-endpoints-clusterip", source="pod", dst="172.30.0.46", dport=80, verdict="REJECT"),
    Case(name="no-endpoints-clusterip-from-node", source="node", dst="172.30.0.46", dport=80, verdict="REJECT"),
    Case(name="no-endpoints-nodeport", source="external", dst=NODE_IP, dport=30006, verdict="REJECT"),
    Case(name="no-endpoints-externalip", source="external", dst="192.168.99.66", dport=80, verdict="REJECT"),
    Case(name="no-endpoints-lb", source="external", dst="9.10.11.12", dport=80, verdict="REJECT"),
    Case(name="no-endpoints-nodeport-from-localhost", source="localhost", dst="127.0.0.1", dport=30006, verdict="REJECT"),
    # svc7: eTP=Local with a local endpoint: external traffic keeps its source.
    Case(name="etp-local-nodeport-external", source="external", dst=NODE_IP, dport=30007, endpoints={A: 1.0}),
    Case(name="etp-local-nodeport-from-pod", source="pod", dst=NODE_IP, dport=30007, endpoints={A: HALF, R: HALF},
         overrides={"nodetect": {A: 1.0}}),
    Case(name="etp-local-nodeport-from-node", source="node", dst=NODE_IP, dport=30007, endpoints={A: HALF, R: HALF}, masq=ALL),
    Case(name="etp-local-nodeport-from-localhost", source="localhost", dst="127.0.0.1", dport=30007, endpoints={A: HALF, R: HALF}, masq=ALL),
    Case(name="etp-local-clusterip-from-pod", source="pod", dst="172.30.0.47", dport=80, endpoints={A: HALF, R: HALF}, masq=POD),
    # svc8, svc9: internalTrafficPolicy=Local.
    Case(name="itp-local-from-pod", source="pod", dst="172.30.0.48", dport=80, endpoints={B: 1.0}, masq=POD),
    Case(name="itp-local-from-node", source="node", dst="172.30.0.48", dport=80, endpoints={B: 1.0}, masq=OUTSIDE),
    Case(name="itp-local-no-local-endpoints", source="pod", dst="172.30.0.49", dport=80, verdict="DROP"),
    # svc10-12: terminating endpoints.
    Case(name="terminating-ready-wins", source="pod", dst="172.30.0.50", dport=80, endpoints={R: 1.0}, masq=POD),
    Case(name="terminating-fallback", source="pod", dst="172.30.0.51", dport=80, endpoints={B: 1.0}, masq=POD),
    Case(name="terminating-etp-local-external-uses-local-terminating", source="external", dst=NODE_IP, dport=30012, endpoints={A: 1.0}),
    Case(name="terminating-etp-local-clusterip-uses-ready", source="pod", dst="172.30.0.52", dport=80, endpoints={R: 1.0}, masq=POD),
    # svc13: SCTP.
    Case(name="sctp-clusterip", source="pod", dst="172.30.0.53", dport=80, proto="sctp", endpoints={A: 1.0}, masq=POD, kernel=False),
)


IN_INTERFACE = {"pod": "vp3", "hairpin": "vp1", "node": None, "localhost": None, "external": "eth0", "blocked": "eth0"}
SPORT = 40000


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """What the emulator says happens to a case's packet.

    Attributes:
        verdict: ACCEPT, DROP or REJECT (the most probable).
        endpoints: ``{"ip:port": probability}`` of the accepted translated outcomes.
        masq: an accepted outcome was masqueraded.
        peers: ``{"ip:port": source address the endpoint sees}``.
        uncertain: an unknown match or target was met.
    """

    verdict: str
    endpoints: dict[str, float]
    masq: bool
    peers: dict[str, set[str]]
    uncertain: bool


def load_emulator(config: IptablesConfig, docs: list[dict[str, Any]] | None = None) -> Netns:
    """An emulated node (:func:`node_model`) holding kube-proxy's rules for ``docs`` (default
    :func:`cluster`), loaded as :class:`~kproxy.kernel.EmulatedNetfilter` loads a full sync."""
    snapshot = snapshot_of(cluster() if docs is None else docs, hostname=NODE)
    netns = Netns(node_model(), ManualClock())
    load_now(EmulatedNetfilter(netns), IptablesRenderer(config).render(snapshot))
    return netns


def case_packet(case: Case, sport: int = SPORT) -> Packet:
    """The case's first packet as it reaches the node."""
    return Packet(src=SOURCES[case.source][1], dst=case.dst, sport=sport, dport=case.dport,
                  protocol=case.proto, in_interface=IN_INTERFACE[case.source])  # type: ignore[arg-type]


def predict(netns: Netns, case: Case, sport: int = SPORT) -> Prediction:
    """Enumerate the case's packet (from source port ``sport``) in ``netns`` and summarise it."""
    result = trace_packet(netns, case_packet(case, sport))
    peers: dict[str, set[str]] = {}
    for _, o in result.outcomes:
        if o.verdict == "ACCEPT" and o.dnat:
            peers.setdefault(o.destination, set()).add(o.packet.src)
    return Prediction(verdict=result.verdict, endpoints={e.address: e.probability for e in result.endpoints},
                      masq=result.masquerade, peers=peers, uncertain=any(o.uncertain for _, o in result.outcomes))
