"""Does each mode keep a ClientIP-affinity client on one endpoint? (``kproxy verify``'s second pass.)

The packet comparison looks at first packets only: a node whose ``-m recent --rcheck`` rule was
deleted still spreads a first connection as the right one does, so it passes. This pass opens
several connections from one client, within the Service's ``timeoutSeconds``, through each mode
(:meth:`~kproxy.testing.ModeAdapter.connections`, state kept between them), and reports a mode
that sends them to more than one endpoint. kube-proxy's ``sessionAffinity: ClientIP`` promises one
endpoint per client IP until the client has been idle for the timeout, in every mode
(``pkg/proxy/iptables/proxier.go`` writes ``-m recent --rcheck --seconds T --reap``; the ipvs
mode a persistent virtual server; the userspace proxier a sticky map).

Each affinity service port is tried from three clients of the packet strategies (a pod on another
node, an external client inside the source ranges, the node itself) on each of its addresses
(ClusterIP, NodePort, external and load-balancer IPs). A mode that does not translate the first
connection there has nothing to keep and is skipped for that client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kproxy.errors import InvalidArgument
from kproxy.model import Protocol, ServicePortInfo
from kproxy.testing.cluster import Cluster, Origin, Packet, Target
from kproxy.testing.modes import ModeAdapter, get_mode
from kproxy.testing.strategies import _sources, _targets

__all__ = ["AFFINITY_CONNECTIONS", "AffinityBreak", "affinity_breaks", "affinity_clients"]

#: Connections per client: with two endpoints, a mode without affinity that picks at random
#: keeps one endpoint for all of them with probability 2**-(N-1).
AFFINITY_CONNECTIONS = 12

_ORIGINS = (Origin.REMOTE_POD, Origin.EXTERNAL, Origin.NODE)


@dataclass(frozen=True, slots=True, kw_only=True)
class AffinityBreak:
    """A mode that sent one client's connections to several endpoints within the timeout.

    Attributes:
        mode: the mode's name.
        packet: the first connection's packet (later ones differ in source port only).
        service: the service port (``namespace/name:port``).
        timeout_s: its affinity timeout, seconds.
        endpoints: where the connections went, in order (None: not translated).
    """

    mode: str
    packet: Packet
    service: str
    timeout_s: float
    endpoints: tuple[str | None, ...]

    def __str__(self) -> str:
        went = ", ".join(e or "-" for e in self.endpoints)
        return (f"{self.mode}: sessionAffinity ClientIP of {self.service} (timeoutSeconds "
                f"{self.timeout_s:g}) did not hold: {len(self.endpoints)} connections from {self.packet.src} "
                f"within {len(self.endpoints) - 1} s went to {went}")


def affinity_clients(cluster: Cluster, *, connections: int = AFFINITY_CONNECTIONS
                     ) -> list[tuple[Packet, ServicePortInfo]]:
    """The clients :func:`affinity_breaks` tries: each first packet with its service port.

    Service ports with affinity, TCP or UDP, with at least two endpoints for the address aimed at,
    and a timeout longer than the ``connections`` seconds the clients take.
    """
    out: list[tuple[Packet, ServicePortInfo]] = []
    for family in cluster.node.families:
        version = 6 if str(family) == "IPv6" else 4
        for target, dst, dport, proto, info in _targets(cluster, version):
            if info is None or not info.session_affinity or proto is Protocol.SCTP:
                continue
            reachable = info.internal_endpoints if target is Target.CLUSTER_IP else info.external_endpoints
            if len(reachable) < 2 or float(info.session_affinity_timeout_s or 0) <= connections - 1:
                continue
            for origin in _ORIGINS:
                sources = _sources(cluster, version, origin)
                if sources:
                    out.append((Packet(src=sources[0], dst=dst, sport=40000, dport=dport, protocol=proto,
                                       origin=origin, target=target), info))
    return out


def affinity_breaks(cluster: Cluster, modes: Sequence[str | ModeAdapter], *,
                    connections: int = AFFINITY_CONNECTIONS) -> list[AffinityBreak]:
    """Every mode and client for which affinity did not hold (see the module docstring).

    Args:
        cluster: the cluster and node.
        modes: the modes (names or adapters).
        connections: connections per client, one second apart (>= 2).

    Raises:
        InvalidArgument: an unknown mode, or ``connections`` < 2.
    """
    if connections < 2:
        raise InvalidArgument(f"connections must be >= 2, got {connections}")
    adapters = [get_mode(m) for m in modes]
    times = [float(i) for i in range(connections)]
    out: list[AffinityBreak] = []
    for packet, info in affinity_clients(cluster, connections=connections):
        for adapter in adapters:
            went = adapter.connections(cluster, packet, times)
            if went[0] is not None and len(set(went)) > 1:
                out.append(AffinityBreak(mode=adapter.name, packet=packet, service=str(info.name),
                                         timeout_s=float(info.session_affinity_timeout_s or 0),
                                         endpoints=tuple(went)))
    return out
