"""The names kube-proxy's ipvs proxier uses: its ipsets, its iptables chains and jump rules.

From ``pkg/proxy/ipvs/proxier.go`` (``ipsetInfo``, ``iptablesChains``, ``iptablesJumpChain``)
and ``pkg/proxy/ipvs/ipset.go`` (set names and comments). IPv6 sets take the prefix ``KUBE-6-``
instead of ``KUBE-``, cut to 31 characters (``NewIPSet``). Sets are created as
``pkg/proxy/ipvs/ipset/ipset.go`` ``createSet`` does: hash types with ``family inet|inet6
hashsize 1024 maxelem 65536``, ``bitmap:port`` with ``range 0-65535``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.modes.iptables import JumpRule

__all__ = [
    "CHAINS",
    "JUMP_RULES",
    "LOOP_BACK",
    "SET_SPECS",
    "SetSpec",
    "set_name",
]

LOOP_BACK = "KUBE-LOOP-BACK"
CLUSTER_IP = "KUBE-CLUSTER-IP"
EXTERNAL_IP = "KUBE-EXTERNAL-IP"
EXTERNAL_IP_LOCAL = "KUBE-EXTERNAL-IP-LOCAL"
LOAD_BALANCER = "KUBE-LOAD-BALANCER"
LOAD_BALANCER_FW = "KUBE-LOAD-BALANCER-FW"
LOAD_BALANCER_LOCAL = "KUBE-LOAD-BALANCER-LOCAL"
LOAD_BALANCER_SOURCE_IP = "KUBE-LOAD-BALANCER-SOURCE-IP"
LOAD_BALANCER_SOURCE_CIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
NODE_PORT_TCP = "KUBE-NODE-PORT-TCP"
NODE_PORT_LOCAL_TCP = "KUBE-NODE-PORT-LOCAL-TCP"
NODE_PORT_UDP = "KUBE-NODE-PORT-UDP"
NODE_PORT_LOCAL_UDP = "KUBE-NODE-PORT-LOCAL-UDP"
NODE_PORT_SCTP = "KUBE-NODE-PORT-SCTP-HASH"
NODE_PORT_LOCAL_SCTP = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
HEALTH_CHECK_NODE_PORT = "KUBE-HEALTH-CHECK-NODE-PORT"
IPVS_IPS = "KUBE-IPVS-IPS"

#: ipset's ``IPSET_MAXNAMELEN - 1``.
MAX_SET_NAME = 31


@dataclass(frozen=True, slots=True, kw_only=True)
class SetSpec:
    """One of kube-proxy's ipsets: its IPv4 ``name``, ``set_type`` and ``comment`` (the text its
    iptables rules carry in ``-m comment``)."""

    name: str
    set_type: str
    comment: str


#: ``ipsetInfo``, in its order.
SET_SPECS: tuple[SetSpec, ...] = (
    SetSpec(name=LOOP_BACK, set_type="hash:ip,port,ip",
            comment="Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
    SetSpec(name=CLUSTER_IP, set_type="hash:ip,port",
            comment="Kubernetes service cluster ip + port for masquerade purpose"),
    SetSpec(name=EXTERNAL_IP, set_type="hash:ip,port",
            comment="Kubernetes service external ip + port for masquerade and filter purpose"),
    SetSpec(name=EXTERNAL_IP_LOCAL, set_type="hash:ip,port",
            comment="Kubernetes service external ip + port with externalTrafficPolicy=local"),
    SetSpec(name=LOAD_BALANCER, set_type="hash:ip,port", comment="Kubernetes service lb portal"),
    SetSpec(name=LOAD_BALANCER_FW, set_type="hash:ip,port",
            comment="Kubernetes service load balancer ip + port for load balancer with sourceRange"),
    SetSpec(name=LOAD_BALANCER_LOCAL, set_type="hash:ip,port",
            comment="Kubernetes service load balancer ip + port with externalTrafficPolicy=local"),
    SetSpec(name=LOAD_BALANCER_SOURCE_IP, set_type="hash:ip,port,ip",
            comment="Kubernetes service load balancer ip + port + source IP for packet filter purpose"),
    SetSpec(name=LOAD_BALANCER_SOURCE_CIDR, set_type="hash:ip,port,net",
            comment="Kubernetes service load balancer ip + port + source cidr for packet filter purpose"),
    SetSpec(name=NODE_PORT_TCP, set_type="bitmap:port",
            comment="Kubernetes nodeport TCP port for masquerade purpose"),
    SetSpec(name=NODE_PORT_LOCAL_TCP, set_type="bitmap:port",
            comment="Kubernetes nodeport TCP port with externalTrafficPolicy=local"),
    SetSpec(name=NODE_PORT_UDP, set_type="bitmap:port",
            comment="Kubernetes nodeport UDP port for masquerade purpose"),
    SetSpec(name=NODE_PORT_LOCAL_UDP, set_type="bitmap:port",
            comment="Kubernetes nodeport UDP port with externalTrafficPolicy=local"),
    SetSpec(name=NODE_PORT_SCTP, set_type="hash:ip,port",
            comment="Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"),
    SetSpec(name=NODE_PORT_LOCAL_SCTP, set_type="hash:ip,port",
            comment="Kubernetes nodeport SCTP port with externalTrafficPolicy=local "
                    "with type 'hash ip:port'"),
    SetSpec(name=HEALTH_CHECK_NODE_PORT, set_type="bitmap:port", comment="Kubernetes health check node port"),
    SetSpec(name=IPVS_IPS, set_type="hash:ip", comment="Addresses on the ipvs interface"),
)

_BY_NAME = {s.name: s for s in SET_SPECS}


def set_name(name: str, ipv6: bool) -> str:
    """The kernel name of kube-proxy's set ``name`` (an IPv4 name) for the family (``NewIPSet``)."""
    if not ipv6 or name.startswith("KUBE-6-"):
        return name
    return name.replace("KUBE-", "KUBE-6-", 1)[:MAX_SET_NAME]


def spec(name: str) -> SetSpec:
    """The :class:`SetSpec` of ``name`` (an IPv4 name)."""
    return _BY_NAME[name]


#: ``iptablesChains``: the chains kube-proxy ensures and declares in the restore input, in order.
CHAINS: tuple[tuple[str, str], ...] = (
    ("nat", "KUBE-SERVICES"),
    ("nat", "KUBE-POSTROUTING"),
    ("nat", "KUBE-NODE-PORT"),
    ("nat", "KUBE-LOAD-BALANCER"),
    ("nat", "KUBE-MARK-MASQ"),
    ("filter", "KUBE-FORWARD"),
    ("filter", "KUBE-NODE-PORT"),
    ("filter", "KUBE-PROXY-FIREWALL"),
    ("filter", "KUBE-SOURCE-RANGES-FIREWALL"),
    ("filter", "KUBE-IPVS-FILTER"),
    ("filter", "KUBE-IPVS-OUT-FILTER"),
)

def _jump(table: str, chain: str, target: str, comment: str) -> JumpRule:
    return JumpRule(table=table, chain=chain, target=target, comment=comment)


#: ``iptablesJumpChain``: ensured with ``EnsureRule(Prepend, ...)`` on every sync, in order.
JUMP_RULES: tuple[JumpRule, ...] = (
    _jump("nat", "OUTPUT", "KUBE-SERVICES", "kubernetes service portals"),
    _jump("nat", "PREROUTING", "KUBE-SERVICES", "kubernetes service portals"),
    _jump("nat", "POSTROUTING", "KUBE-POSTROUTING", "kubernetes postrouting rules"),
    _jump("filter", "FORWARD", "KUBE-FORWARD", "kubernetes forwarding rules"),
    _jump("filter", "INPUT", "KUBE-NODE-PORT", "kubernetes health check rules"),
    _jump("filter", "INPUT", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    _jump("filter", "FORWARD", "KUBE-PROXY-FIREWALL", "kube-proxy firewall rules"),
    _jump("filter", "INPUT", "KUBE-IPVS-FILTER", "kubernetes ipvs access filter"),
    _jump("filter", "OUTPUT", "KUBE-IPVS-OUT-FILTER", "kubernetes ipvs access filter"),
)
