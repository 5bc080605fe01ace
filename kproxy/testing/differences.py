"""The real differences between kube-proxy's modes, each a named, tested exception.

Theory of operation: a :class:`KnownDifference` names the modes that deviate, says why, and
carries a predicate over the cluster, the packet and every mode's outcome. The predicate is tight:
it holds only when the packet is of the documented kind *and* the deviating mode answered exactly
as documented, so a deviating mode that does anything else is still reported. A mode excused by a
difference is left out of that packet's comparison; the remaining modes must agree.

===========================================  =========  ==============================================
name                                         deviates   what happens
===========================================  =========  ==============================================
``clusterip-unknown-port``                   userspace  A ClusterIP on a port (or protocol) no service
                                             ipvs       port uses: iptables has no rule, so the packet
                                                        is routed on unchanged; the userspace mode has
                                                        no listener there, so the connection is
                                                        refused; ipvs binds the ClusterIP on
                                                        kube-ipvs0 and KUBE-IPVS-FILTER rejects it.
``sctp-not-served-by-userspace``             userspace  An SCTP service port: iptables DNATs it as any
                                                        other; the userspace mode never served SCTP
                                                        (no listener, refused).
``external-traffic-not-served-by-userspace`` userspace  A NodePort, external IP or load-balancer IP:
                                                        iptables serves (or drops, or rejects) it; the
                                                        userspace mode serves ClusterIPs only, so the
                                                        packet passes unchanged.
``internal-local-without-local-endpoints``   userspace  ``internalTrafficPolicy: Local`` with endpoints
                                                        only on other nodes: iptables DROPs (kube-proxy's
                                                        "has no local endpoints" rule); the userspace
                                                        listener has nothing to hand out and refuses.
``affinity-timeout-boundary``                userspace  (session affinity, see :func:`affinity_holds`)
                                                        A client idle for *exactly* the timeout: the
                                                        iptables ``recent --rcheck --seconds T`` match
                                                        still holds (the kernel compares with >=), the
                                                        userspace balancer has expired it (``idle < T``
                                                        holds, as roundrobin.go).
===========================================  =========  ==============================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kproxy.model import Protocol, ServicePortInfo
from kproxy.testing.cluster import Cluster, Packet
from kproxy.testing.modes import _external_kind
from kproxy.testing.outcome import Outcome, Verdict

__all__ = [
    "AFFINITY_TIMEOUT_BOUNDARY",
    "KNOWN_DIFFERENCES",
    "KnownDifference",
    "affinity_holds",
    "applicable_differences",
]

Predicate = Callable[[Cluster, Packet, Mapping[str, Outcome]], bool]


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownDifference:
    """A documented, real difference between modes (see the module docstring).

    Attributes:
        name: a stable, kebab-case name.
        modes: the modes that deviate (left out of the comparison when it applies).
        explanation: what each mode does and why.
        applies: ``(cluster, packet, outcomes by mode) -> bool``; true only when the packet is of
            the documented kind and every deviating mode present answered as documented.
    """

    name: str
    modes: frozenset[str]
    explanation: str
    applies: Predicate

    def __str__(self) -> str:
        return f"{self.name} ({', '.join(sorted(self.modes))}): {self.explanation}"


def _clusterip_ports(cluster: Cluster, packet: Packet) -> list[ServicePortInfo]:
    return [i for i in cluster.snapshot if i.family is packet.family and i.cluster_ip == packet.dst]


def _served_port(cluster: Cluster, packet: Packet) -> ServicePortInfo | None:
    return next((i for i in _clusterip_ports(cluster, packet)
                 if i.port == packet.dport and i.protocol is packet.protocol), None)


def _answered(outcomes: Mapping[str, Outcome], mode: str, verdict: Verdict, translated: bool = False) -> bool:
    o = outcomes.get(mode)
    return o is None or (o.verdict is verdict and o.translated == translated)


def _unknown_port(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    return (bool(_clusterip_ports(cluster, packet)) and _served_port(cluster, packet) is None
            and _answered(outcomes, "userspace", Verdict.REJECT)
            and _answered(outcomes, "ipvs", Verdict.REJECT))


def _sctp(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = _served_port(cluster, packet)
    return (info is not None and info.protocol is Protocol.SCTP
            and _answered(outcomes, "userspace", Verdict.REJECT))


def _external(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    return (not _clusterip_ports(cluster, packet) and _external_kind(cluster, packet) is not None
            and _answered(outcomes, "userspace", Verdict.ACCEPT))


def _internal_local(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = _served_port(cluster, packet)
    return (info is not None and info.protocol is not Protocol.SCTP and info.internal_policy_local
            and not info.local_endpoints and info.has_any_endpoints
            and _answered(outcomes, "userspace", Verdict.REJECT))


KNOWN_DIFFERENCES: tuple[KnownDifference, ...] = (
    KnownDifference(
        name="clusterip-unknown-port", modes=frozenset({"userspace", "ipvs"}), applies=_unknown_port,
        explanation="a ClusterIP on a port or protocol no service port uses: iptables has no rule and "
                    "routes the packet on unchanged; the userspace mode has no listener and refuses it; "
                    "ipvs binds ClusterIPs on kube-ipvs0 and its KUBE-IPVS-FILTER rejects it"),
    KnownDifference(
        name="sctp-not-served-by-userspace", modes=frozenset({"userspace"}), applies=_sctp,
        explanation="an SCTP service port: iptables DNATs it like TCP and UDP; the userspace mode never "
                    "served SCTP, so there is no listener and the connection is refused"),
    KnownDifference(
        name="external-traffic-not-served-by-userspace", modes=frozenset({"userspace"}), applies=_external,
        explanation="a NodePort, external IP or load-balancer IP: iptables serves, drops or rejects it by "
                    "policy; the userspace mode serves ClusterIPs only and lets the packet pass unchanged"),
    KnownDifference(
        name="internal-local-without-local-endpoints", modes=frozenset({"userspace"}),
        applies=_internal_local,
        explanation="internalTrafficPolicy Local with endpoints only elsewhere: iptables DROPs (kube-proxy's "
                    "'has no local endpoints' rule); the userspace listener has none to hand out and "
                    "refuses"),
)


def applicable_differences(
    cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome],
    differences: tuple[KnownDifference, ...] = KNOWN_DIFFERENCES,
) -> tuple[KnownDifference, ...]:
    """The differences of ``differences`` whose predicate holds for this packet and these outcomes."""
    return tuple(d for d in differences if d.modes & set(outcomes) and d.applies(cluster, packet, outcomes))


#: Session affinity at exactly the timeout (see the module docstring and :func:`affinity_holds`).
AFFINITY_TIMEOUT_BOUNDARY = KnownDifference(
    name="affinity-timeout-boundary", modes=frozenset({"userspace"}),
    applies=lambda cluster, packet, outcomes: False,  # not a per-packet difference: see affinity_holds
    explanation="a client idle for exactly timeoutSeconds: iptables' recent match still holds it (the "
                "kernel keeps stamps with now - stamp <= seconds); the userspace balancer expires it "
                "(idle < timeout)")


def affinity_holds(mode: str, idle_s: float, timeout_s: float) -> bool:
    """Whether ``mode`` still sends a client idle for ``idle_s`` seconds to its previous endpoint.

    ``userspace``: ``idle_s < timeout_s`` (roundrobin.go); the kernel modes (iptables' ``recent``
    match) ``idle_s <= timeout_s``. They differ only at the boundary: :data:`AFFINITY_TIMEOUT_BOUNDARY`.
    """
    return idle_s < timeout_s if mode == "userspace" else idle_s <= timeout_s
