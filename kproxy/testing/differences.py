"""The real differences between kube-proxy's modes, each a named, tested exception.

Theory of operation: a :class:`KnownDifference` names the modes that deviate, says why, and
carries a predicate over the cluster, the packet and every mode's outcome. The predicate is tight:
it holds only when the packet is of the documented kind *and* the deviating mode answered exactly
as documented, so a deviating mode that does anything else is still reported. A mode excused by a
difference is left out of that packet's comparison; the remaining modes must agree.

================================================  =========  ==============================================
name                                              deviates   what happens
================================================  =========  ==============================================
``clusterip-unknown-port``                        userspace  A ClusterIP on a port (or protocol) no service
                                                  ipvs       port uses: iptables has no rule, so the packet
                                                  nftables   is routed on unchanged; the userspace mode has
                                                             no listener there, so the connection is
                                                             refused; ipvs binds the ClusterIP on
                                                             kube-ipvs0 and KUBE-IPVS-FILTER rejects it;
                                                             nftables' ``cluster-ips-check`` rejects it.
``nftables-no-localhost-nodeports``               nftables   A NodePort on 127.0.0.1 / ::1: the nftables
                                                             proxier has no localhost NodePorts (KEP-3866,
                                                             no route_localnet), so the packet reaches the
                                                             host untranslated; iptables may DNAT it.
``nftables-nodeports-on-primary-ip-only``         nftables   A NodePort on a node address other than the
                                                             family's primary IP, with no
                                                             ``--nodeport-addresses``: the nftables default
                                                             is ``primary``, so it is delivered untranslated;
                                                             iptables accepts NodePorts on every local
                                                             address.
``nftables-external-without-endpoints-from-node`` nftables   As the ipvs one: the node sends to an external
                                                             or LB IP of a port without endpoints; the
                                                             nftables filter-output chain jumps to
                                                             service-endpoints-check, which rejects it;
                                                             iptables routes it out unchanged.
``nftables-source-ranges-without-endpoints``      nftables   As the ipvs one: an LB IP with source ranges
                                                             and no endpoints, from outside the ranges:
                                                             iptables REJECTs ("has no endpoints"); the
                                                             nftables firewall-check DROPs first.
``nftables-unallocated-clusterip-dropped``        nftables   (with ``--service-cidr``) An address of a
                                                             service CIDR that is no ClusterIP: nftables
                                                             DROPs it; iptables routes it on unchanged.
``sctp-not-served-by-userspace``                  userspace  An SCTP service port: iptables DNATs it as any
                                                             other; the userspace mode never served SCTP
                                                             (no listener, refused).
``external-traffic-not-served-by-userspace``      userspace  A NodePort, external IP or load-balancer IP:
                                                             iptables serves (or drops, or rejects) it; the
                                                             userspace mode serves ClusterIPs only, so the
                                                             packet passes unchanged.
``internal-local-without-local-endpoints``        userspace  ``internalTrafficPolicy: Local`` with endpoints
                                                             only on other nodes: iptables DROPs (kube-proxy's
                                                             "has no local endpoints" rule); the userspace
                                                             listener has nothing to hand out and refuses.
``ipvs-internal-local-falls-back``                ipvs       ``internalTrafficPolicy: Local`` with no usable
                                                             local endpoint but endpoints elsewhere:
                                                             iptables DROPs ("has no local endpoints");
                                                             kube-proxy's ipvs ``syncEndpoint`` gives the
                                                             ClusterIP virtual server the *cluster*
                                                             endpoints instead (PR 97081): it forwards to
                                                             them, or, when the categorisation leaves none
                                                             (an internal-only Local port), the empty
                                                             virtual server answers ICMP port unreachable.
``ipvs-external-local-falls-back``                ipvs       The same for ``externalTrafficPolicy: Local``
                                                             (NodePort, external IP, LB IP) where iptables
                                                             DROPs: the external virtual servers get the
                                                             cluster endpoints (or none: REJECT).
``ipvs-no-localhost-nodeports``                   ipvs       A NodePort on 127.0.0.1 / ::1: ipvs creates
                                                             NodePort virtual servers only for non-loopback
                                                             node addresses and RETURNs ``-s 127.0.0.0/8``
                                                             early, so the packet is delivered to the host
                                                             untranslated; iptables (route_localnet) may
                                                             DNAT it.
``ipvs-external-without-endpoints-from-node``     ipvs       An external or LB IP of a port with no
                                                             endpoints, sent by the node: iptables' "has no
                                                             endpoints" REJECT sits in
                                                             KUBE-EXTERNAL-SERVICES (INPUT, FORWARD only),
                                                             so the packet is routed out unchanged; ipvs
                                                             binds the address, whose empty virtual server
                                                             answers ICMP port unreachable.
``ipvs-external-local-no-pod-short-circuit``      ipvs       ``externalTrafficPolicy: Local`` with local
                                                             endpoints, sent by a pod or the node: iptables'
                                                             KUBE-EXT chain sends such traffic to the
                                                             cluster endpoints ("pod traffic for ...
                                                             external destinations"); the ipvs virtual
                                                             server holds the local endpoints only.
``ipvs-no-hairpin-masquerade-remote``             ipvs       A packet from an endpoint's own address on
                                                             another node, load-balanced back to it:
                                                             iptables' KUBE-SEP ``-s ip -j KUBE-MARK-MASQ``
                                                             masquerades it; ipvs' KUBE-LOOP-BACK holds
                                                             local endpoints only, so it does not.
``ipvs-source-ranges-without-endpoints``          ipvs       An LB IP with loadBalancerSourceRanges and no
                                                             endpoints, from a source outside the ranges:
                                                             iptables writes its firewall only with
                                                             endpoints and REJECTs ("has no endpoints");
                                                             ipvs fills KUBE-LOAD-BALANCER-FW regardless,
                                                             and KUBE-SOURCE-RANGES-FIREWALL DROPs.
``ipvs-source-ranges-node-access``                ipvs       The node, from its node IP, to an LB IP whose
                                                             source ranges leave that IP out: iptables'
                                                             KUBE-PROXY-FIREWALL (jumped to from OUTPUT too)
                                                             DROPs; ipvs' firewall is on INPUT and FORWARD,
                                                             and KUBE-IPVS-OUT-FILTER drops only packets
                                                             sourced from the LB IP itself, so it forwards.
``affinity-timeout-boundary``                     userspace  (session affinity, see :func:`affinity_holds`)
                                                             A client idle for *exactly* the timeout: the
                                                             iptables ``recent --rcheck --seconds T`` match
                                                             still holds (the kernel compares with >=), the
                                                             userspace balancer has expired it (``idle < T``
                                                             holds, as roundrobin.go).
================================================  =========  ==============================================
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kproxy.model import Protocol, ServicePortInfo
from kproxy.testing.cluster import Cluster, Origin, Packet
from kproxy.testing.modes import _external_kind
from kproxy.testing.outcome import Outcome, Verdict, probabilities_agree

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
            and _answered(outcomes, "ipvs", Verdict.REJECT)
            and _answered(outcomes, "nftables", Verdict.REJECT))


def _is_nodeport(cluster: Cluster, packet: Packet) -> bool:
    return any(i.node_port == packet.dport and i.protocol is packet.protocol
               for i in cluster.snapshot if i.family is packet.family)


def _nft_localhost_nodeport(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    return (packet.dst in ("127.0.0.1", "::1") and _is_nodeport(cluster, packet)
            and _answered(outcomes, "nftables", Verdict.ACCEPT))


def _nft_secondary_nodeport(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    node = cluster.node
    ip = ipaddress.ip_address(packet.dst)
    primary = node.node_ip(packet.version)
    secondary = [a for a in node.node_ips if ipaddress.ip_address(a) == ip and a != primary]
    return (not node.nodeport_addresses and bool(secondary) and _is_nodeport(cluster, packet)
            and _answered(outcomes, "nftables", Verdict.ACCEPT))


def _nft_external_no_endpoints(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = None if _clusterip_ports(cluster, packet) else _external_port(cluster, packet)
    return (info is not None and packet.origin is Origin.NODE and not info.has_any_endpoints
            and packet.dst not in (cluster.node.node_ip(packet.version),)
            and _answered(outcomes, "iptables", Verdict.ACCEPT)
            and _answered(outcomes, "nftables", Verdict.REJECT))


def _nft_unallocated(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    cidrs: tuple[str, ...] = tuple(getattr(cluster.node, "service_cidrs", ()))  # the --service-cidr hook
    ip = ipaddress.ip_address(packet.dst)
    inside = any(ip in ipaddress.ip_network(c, strict=False) for c in cidrs
                 if ipaddress.ip_network(c, strict=False).version == ip.version)
    return (inside and not _clusterip_ports(cluster, packet) and _external_port(cluster, packet) is None
            and _answered(outcomes, "nftables", Verdict.DROP))


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


def _external_port(cluster: Cluster, packet: Packet) -> ServicePortInfo | None:
    """The service port ``packet`` reaches as a NodePort (node IP), external IP or LB IP, else None."""
    node_ip = cluster.node.node_ip(packet.version)
    for info in cluster.snapshot:
        if info.family is not packet.family or info.protocol is not packet.protocol:
            continue
        if info.node_port and packet.dport == info.node_port and packet.dst == node_ip:
            return info
        if packet.dport == info.port and (packet.dst in info.external_ips
                                          or packet.dst in info.load_balancer_ips):
            return info
    return None


def _falls_back(info: ServicePortInfo, outcomes: Mapping[str, Outcome]) -> bool:
    """iptables DROPs and ipvs answers as ``syncEndpoint``'s fallback to the cluster endpoints."""
    if not _answered(outcomes, "iptables", Verdict.DROP):
        return False
    ipvs = outcomes.get("ipvs")
    if ipvs is None:
        return True
    if not info.cluster_endpoints:
        return ipvs.verdict is Verdict.REJECT and not ipvs.translated
    return (ipvs.verdict is Verdict.ACCEPT
            and set(ipvs.endpoints) == {e.address for e in info.cluster_endpoints})


def _ipvs_internal_local(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = _served_port(cluster, packet)
    return (info is not None and info.internal_policy_local and not info.local_endpoints
            and info.has_any_endpoints and _falls_back(info, outcomes))


def _ipvs_external_local(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = None if _clusterip_ports(cluster, packet) else _external_port(cluster, packet)
    return (info is not None and info.external_policy_local and not info.local_endpoints
            and info.has_any_endpoints and _falls_back(info, outcomes))


def _ipvs_localhost_nodeport(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    return (packet.dst in ("127.0.0.1", "::1")
            and any(i.node_port == packet.dport and i.protocol is packet.protocol
                    for i in cluster.snapshot if i.family is packet.family)
            and _answered(outcomes, "ipvs", Verdict.ACCEPT))


def _ipvs_external_no_endpoints(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = None if _clusterip_ports(cluster, packet) else _external_port(cluster, packet)
    return (info is not None and packet.origin is Origin.NODE and not info.has_any_endpoints
            and packet.dst not in (cluster.node.node_ip(packet.version),)
            and _answered(outcomes, "iptables", Verdict.ACCEPT)
            and _answered(outcomes, "ipvs", Verdict.REJECT))


def _ipvs_no_short_circuit(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = None if _clusterip_ports(cluster, packet) else _external_port(cluster, packet)
    if info is None or not info.external_policy_local or not info.local_endpoints:
        return False
    local = {e.address for e in info.local_endpoints}
    cluster_wide = {e.address for e in info.cluster_endpoints}
    ipt, ipvs = outcomes.get("iptables"), outcomes.get("ipvs")
    return (cluster_wide != local
            and (ipt is None or (ipt.verdict is Verdict.ACCEPT and set(ipt.endpoints) == cluster_wide))
            and (ipvs is None or (ipvs.verdict is Verdict.ACCEPT and set(ipvs.endpoints) == local)))


def _ipvs_remote_hairpin(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    ipt, ipvs = outcomes.get("iptables"), outcomes.get("ipvs")
    if ipt is None or ipvs is None or not (ipt.translated and ipvs.translated):
        return False
    remote = {e.address for i in cluster.snapshot if i.family is packet.family
              for e in i.endpoints if not e.is_local and e.ip == packet.src}
    return (bool(remote & set(ipt.endpoints)) and ipt.masquerade is True and ipvs.masquerade is False
            and ipt.verdict is ipvs.verdict is Verdict.ACCEPT and probabilities_agree(ipt, ipvs))


def _ipvs_source_ranges_empty(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = None if _clusterip_ports(cluster, packet) else _external_port(cluster, packet)
    if (info is None or packet.dst not in info.load_balancer_ips or not info.load_balancer_source_ranges
            or info.has_any_endpoints):
        return False
    return (_outside_ranges(packet.src, info.load_balancer_source_ranges)
            and _answered(outcomes, "iptables", Verdict.REJECT) and _answered(outcomes, "ipvs", Verdict.DROP))


def _nft_source_ranges_empty(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = None if _clusterip_ports(cluster, packet) else _external_port(cluster, packet)
    if (info is None or packet.dst not in info.load_balancer_ips or not info.load_balancer_source_ranges
            or info.has_any_endpoints):
        return False
    return (_outside_ranges(packet.src, info.load_balancer_source_ranges)
            and _answered(outcomes, "iptables", Verdict.REJECT)
            and _answered(outcomes, "nftables", Verdict.DROP))


def _outside_ranges(ip: str, ranges: tuple[str, ...]) -> bool:
    addr = ipaddress.ip_address(ip)
    nets = (ipaddress.ip_network(c.strip(), strict=False) for c in ranges)
    return not any(addr in n for n in nets if n.version == addr.version)


def _ipvs_source_ranges_node(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = None if _clusterip_ports(cluster, packet) else _external_port(cluster, packet)
    if (info is None or packet.origin is not Origin.NODE or packet.dst not in info.load_balancer_ips
            or not info.load_balancer_source_ranges or packet.src == packet.dst):
        return False
    ipvs = outcomes.get("ipvs")
    return (_outside_ranges(packet.src, info.load_balancer_source_ranges)
            and _answered(outcomes, "iptables", Verdict.DROP)
            and (ipvs is None or (ipvs.verdict is Verdict.ACCEPT and ipvs.translated)))


def _ipvs_loopback_real_servers(cluster: Cluster, packet: Packet, outcomes: Mapping[str, Outcome]) -> bool:
    info = _served_port(cluster, packet)
    if info is None or packet.origin in (Origin.NODE, Origin.LOCALHOST):
        return False
    reachable = info.all_reachable_endpoints
    ipvs = outcomes.get("ipvs")
    return (bool(reachable) and all(ep.ip.startswith("127.") or ep.ip == "::1" for ep in reachable)
            and (ipvs is None or ipvs.verdict is Verdict.DROP))


KNOWN_DIFFERENCES: tuple[KnownDifference, ...] = (
    KnownDifference(
        name="clusterip-unknown-port", modes=frozenset({"userspace", "ipvs", "nftables"}),
        applies=_unknown_port,
        explanation="a ClusterIP on a port or protocol no service port uses: iptables has no rule and "
                    "routes the packet on unchanged; the userspace mode has no listener and refuses it; "
                    "ipvs binds ClusterIPs on kube-ipvs0 and its KUBE-IPVS-FILTER rejects it; the "
                    "nftables proxier's cluster-ips-check chain rejects it ('Reject traffic to invalid "
                    "ports of ClusterIPs', pkg/proxy/nftables/proxier.go)"),
    KnownDifference(
        name="nftables-no-localhost-nodeports", modes=frozenset({"nftables"}),
        applies=_nft_localhost_nodeport,
        explanation="a NodePort on localhost: the nftables proxier matches NodePorts on the nodeport-ips "
                    "set (or fib daddr type local without loopback) and never sets route_localnet "
                    "(KEP-3866: no localhost NodePorts), so the packet reaches the host untranslated; "
                    "the iptables mode may DNAT it (--iptables-localhost-nodeports)"),
    KnownDifference(
        name="nftables-nodeports-on-primary-ip-only", modes=frozenset({"nftables"}),
        applies=_nft_secondary_nodeport,
        explanation="a NodePort on a node address other than the family's primary IP, without "
                    "--nodeport-addresses: the nftables proxier's default is 'primary' (kube-proxy 1.31), "
                    "so only the primary IP is in nodeport-ips and the packet is delivered untranslated; "
                    "the iptables mode accepts NodePorts on every local address"),
    KnownDifference(
        name="nftables-external-without-endpoints-from-node", modes=frozenset({"nftables"}),
        applies=_nft_external_no_endpoints,
        explanation="the node sends to an external or LB IP of a port without endpoints: iptables' "
                    "'has no endpoints' REJECT is in KUBE-EXTERNAL-SERVICES (INPUT and FORWARD only), so "
                    "the packet is routed out unchanged; the nftables proxier's filter-output chain "
                    "jumps to service-endpoints-check, whose no-endpoint-services map rejects it"),
    KnownDifference(
        name="nftables-source-ranges-without-endpoints", modes=frozenset({"nftables"}),
        applies=_nft_source_ranges_empty,
        explanation="an LB IP with loadBalancerSourceRanges and no endpoints, from outside the ranges: "
                    "iptables writes its firewall only with endpoints ('usesFWChain := hasEndpoints && "
                    "...') and REJECTs in KUBE-EXTERNAL-SERVICES; the nftables proxier fills firewall-ips "
                    "whatever the endpoints, and its firewall chain, run at prerouting before the "
                    "no-endpoint check, DROPs"),
    KnownDifference(
        name="nftables-unallocated-clusterip-dropped", modes=frozenset({"nftables"}),
        applies=_nft_unallocated,
        explanation="with --service-cidr, an address of a service CIDR that is no ClusterIP: the "
                    "nftables proxier's cluster-ips-check drops it ('Drop traffic to unallocated "
                    "ClusterIPs'); iptables has no such rule and routes the packet on unchanged"),
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
    KnownDifference(
        name="ipvs-internal-local-falls-back", modes=frozenset({"ipvs"}), applies=_ipvs_internal_local,
        explanation="internalTrafficPolicy Local with no local endpoint but endpoints elsewhere: iptables "
                    "DROPs ('has no local endpoints'); kube-proxy's ipvs syncEndpoint (pkg/proxy/ipvs/"
                    "proxier.go, onlyNodeLocalEndpoints with no localEndpoints: 'endpoints = "
                    "clusterEndpoints', PR 97081) gives the ClusterIP virtual server the cluster endpoints: "
                    "it forwards to them, or rejects when CategorizeEndpoints left none (pkg/proxy/"
                    "topology.go: no cluster endpoints unless UsesClusterEndpoints)"),
    KnownDifference(
        name="ipvs-external-local-falls-back", modes=frozenset({"ipvs"}), applies=_ipvs_external_local,
        explanation="externalTrafficPolicy Local with no local endpoint, to a NodePort, external or LB IP "
                    "where iptables DROPs: ipvs syncEndpoint(svcInfo.ExternalPolicyLocal()) falls back to "
                    "the cluster endpoints as for the ClusterIP (PR 97081: 'Traffic from an external source "
                    "will be routed but the reply will have the POD address'), or rejects with none"),
    KnownDifference(
        name="ipvs-loopback-real-servers-from-outside", modes=frozenset({"ipvs"}),
        applies=_ipvs_loopback_real_servers,
        explanation="endpoints on loopback addresses (as in kproxy's example cluster), packet from a pod or "
                    "another host: ip_vs_nat_xmit (net/netfilter/ipvs/ip_vs_xmit.c) drops traffic from "
                    "the world translated to a loopback address ('stopping DNAT to loopback address'); "
                    "iptables DNATs it and, with route_localnet (set by kube-proxy for localhost "
                    "NodePorts), delivers it locally"),
    KnownDifference(
        name="ipvs-no-localhost-nodeports", modes=frozenset({"ipvs"}), applies=_ipvs_localhost_nodeport,
        explanation="a NodePort on localhost: ipvs makes NodePort virtual servers only for node addresses "
                    "(GetAllLocalAddressesExcept's isValidForSet drops loopback; with "
                    "--nodeport-addresses, '!ip.IsLoopback()') and writeIptablesRules starts KUBE-SERVICES "
                    "with '-s 127.0.0.0/8 -j RETURN', so the packet reaches the host untranslated; the "
                    "iptables mode may DNAT it (route_localnet)"),
    KnownDifference(
        name="ipvs-external-without-endpoints-from-node", modes=frozenset({"ipvs"}),
        applies=_ipvs_external_no_endpoints,
        explanation="the node sends to an external or LB IP of a port without endpoints: iptables writes "
                    "its 'has no endpoints' REJECT into KUBE-EXTERNAL-SERVICES, jumped to from INPUT and "
                    "FORWARD only, so the packet is routed out unchanged; ipvs binds the address on "
                    "kube-ipvs0 and its virtual server, with no real server, answers ICMP port unreachable"),
    KnownDifference(
        name="ipvs-external-local-no-pod-short-circuit", modes=frozenset({"ipvs"}),
        applies=_ipvs_no_short_circuit,
        explanation="externalTrafficPolicy Local with local endpoints, from a pod or the node: iptables' "
                    "KUBE-EXT chain jumps such traffic to the cluster policy chain (pkg/proxy/iptables/"
                    "proxier.go, 'pod traffic for ... external destinations' and 'route LOCAL traffic "
                    "for ... external destinations'); ipvs has no such rule and its external virtual "
                    "servers hold the local endpoints only (syncEndpoint(svcInfo.ExternalPolicyLocal()))"),
    KnownDifference(
        name="ipvs-no-hairpin-masquerade-remote", modes=frozenset({"ipvs"}), applies=_ipvs_remote_hairpin,
        explanation="a packet from an endpoint on another node, balanced back to that endpoint: iptables "
                    "masquerades it (each KUBE-SEP chain's '-s <endpoint ip> -j KUBE-MARK-MASQ'); ipvs "
                    "masquerades hairpin traffic through KUBE-LOOP-BACK, whose entries syncProxyRules "
                    "makes for local endpoints only ('if !ep.IsLocal() { continue }')"),
    KnownDifference(
        name="ipvs-source-ranges-without-endpoints", modes=frozenset({"ipvs"}),
        applies=_ipvs_source_ranges_empty,
        explanation="an LB IP with loadBalancerSourceRanges and no endpoints, from outside the ranges: "
                    "iptables writes its firewall only with endpoints (pkg/proxy/iptables/proxier.go: "
                    "'usesFWChain := hasEndpoints && ...') and REJECTs in KUBE-EXTERNAL-SERVICES ('has no "
                    "endpoints'); ipvs adds the KUBE-LOAD-BALANCER-FW entry whatever the endpoints and "
                    "KUBE-SOURCE-RANGES-FIREWALL ends in '-j DROP'"),
    KnownDifference(
        name="ipvs-source-ranges-node-access", modes=frozenset({"ipvs"}), applies=_ipvs_source_ranges_node,
        explanation="the node, from an address outside an LB IP's source ranges: iptables jumps to "
                    "KUBE-PROXY-FIREWALL from OUTPUT as well and DROPs; the ipvs proxier links it from "
                    "INPUT and FORWARD only (createAndLinkKubeChain), IPVS takes the packet at LOCAL_OUT, "
                    "and its KUBE-IPVS-OUT-FILTER rule ('-s <lb ip> -m ipvs --vaddr <lb ip> ... -j DROP', "
                    "lbNoNodeAccessIPPortProtocolEntries) drops only packets sourced from the LB IP"),
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
