"""The iptables-restore input kube-proxy's ipvs proxier writes (``writeIptablesRules``).

Built from the rendered sets (a rule that matches a set is written only when the set has
entries, as ``isEmpty`` decides in ``pkg/proxy/ipvs/proxier.go``), in kube-proxy's order: the
nat chains, the nat rules, the filter chains, the filter rules. The jump rules into these
chains (:data:`~kproxy.modes.ipvs.names.JUMP_RULES`) are ensured outside the restore.
"""

from __future__ import annotations

from kproxy.modes.ipvs import names as n
from kproxy.modes.ipvs.config import IpvsConfig
from kproxy.modes.ipvs.state import IpvsState

__all__ = ["render_rules"]

#: ``ipsetWithIptablesChain``: (set, table, from chain, target, match flags, ``-p`` protocol).
_SET_JUMPS: tuple[tuple[str, str, str, str, str, str], ...] = (
    (n.LOOP_BACK, "nat", "KUBE-POSTROUTING", "MASQUERADE", "dst,dst,src", ""),
    (n.LOAD_BALANCER, "nat", "KUBE-SERVICES", "KUBE-LOAD-BALANCER", "dst,dst", ""),
    (n.LOAD_BALANCER_LOCAL, "nat", "KUBE-LOAD-BALANCER", "RETURN", "dst,dst", ""),
    (n.NODE_PORT_LOCAL_TCP, "nat", "KUBE-NODE-PORT", "RETURN", "dst", "tcp"),
    (n.NODE_PORT_TCP, "nat", "KUBE-NODE-PORT", "KUBE-MARK-MASQ", "dst", "tcp"),
    (n.NODE_PORT_LOCAL_UDP, "nat", "KUBE-NODE-PORT", "RETURN", "dst", "udp"),
    (n.NODE_PORT_UDP, "nat", "KUBE-NODE-PORT", "KUBE-MARK-MASQ", "dst", "udp"),
    (n.NODE_PORT_LOCAL_SCTP, "nat", "KUBE-NODE-PORT", "RETURN", "dst,dst", "sctp"),
    (n.NODE_PORT_SCTP, "nat", "KUBE-NODE-PORT", "KUBE-MARK-MASQ", "dst,dst", "sctp"),
    (n.LOAD_BALANCER_FW, "filter", "KUBE-PROXY-FIREWALL", "KUBE-SOURCE-RANGES-FIREWALL", "dst,dst", ""),
    (n.LOAD_BALANCER_SOURCE_CIDR, "filter", "KUBE-SOURCE-RANGES-FIREWALL", "RETURN", "dst,dst,src", ""),
    (n.LOAD_BALANCER_SOURCE_IP, "filter", "KUBE-SOURCE-RANGES-FIREWALL", "RETURN", "dst,dst,src", ""),
)


class _Writer:
    def __init__(self, state: IpvsState, config: IpvsConfig) -> None:
        self.state, self.config, self.ipv6 = state, config, config.ipv6
        self.nat: list[str] = []
        self.filter: list[str] = []

    def name(self, base: str) -> str:
        return n.set_name(base, self.ipv6)

    def empty(self, base: str) -> bool:
        return not self.state.ipset(self.name(base)).entries

    def match(self, base: str, flags: str, *, comment: bool = True) -> str:
        text = f'-m comment --comment "{n.spec(base).comment}" ' if comment else ""
        return f"{text}-m set --match-set {self.name(base)} {flags}"


def _set_jumps(w: _Writer) -> None:
    for base, table, chain, target, flags, proto in _SET_JUMPS:
        if w.empty(base):
            continue
        p = f"-p {proto} " if proto else ""
        (w.nat if table == "nat" else w.filter).append(f"-A {chain} {p}{w.match(base, flags)} -j {target}")


def _cluster_ip(w: _Writer) -> None:
    if w.empty(n.CLUSTER_IP):
        return
    head = f"-A KUBE-SERVICES {w.match(n.CLUSTER_IP, '')}".rstrip()
    cidr = w.config.local_cidr
    if w.config.masquerade_all:
        w.nat.append(f"{head} dst,dst -j KUBE-MARK-MASQ")
    elif cidr is not None:
        w.nat.append(f"{head} dst,dst ! -s {cidr} -j KUBE-MARK-MASQ")
    else:
        w.nat.append(f"{head} src,dst -j KUBE-MARK-MASQ")


def _external_ips(w: _Writer) -> None:
    for base, masq in ((n.EXTERNAL_IP, True), (n.EXTERNAL_IP_LOCAL, False)):
        if w.empty(base):
            continue
        head = f"-A KUBE-SERVICES {w.match(base, 'dst,dst')}"
        if masq:
            w.nat.append(f"{head} -j KUBE-MARK-MASQ")
        w.nat.append(f"{head} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT")
        w.nat.append(f"{head} -m addrtype --dst-type LOCAL -j ACCEPT")


def _tail(w: _Writer) -> None:
    mark = w.config.mark
    w.nat.append("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT")
    w.nat.append("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ")
    w.filter.append("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP")
    for ip, proto, port in w.state.lb_no_node_access:
        w.filter.append(f"-A KUBE-IPVS-OUT-FILTER -s {ip} -m ipvs --vaddr {ip} --vproto {proto} "
                        f"--vport {port} -j DROP")
    for base in (n.CLUSTER_IP, n.LOAD_BALANCER):  # acceptIPVSTraffic
        if not w.empty(base):
            w.nat.append(f"-A KUBE-SERVICES -m set --match-set {w.name(base)} dst,dst -j ACCEPT")
    w.filter.append(f'-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" '
                    f"-m mark --mark {mark}/{mark} -j ACCEPT")
    w.filter.append('-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" '
                    "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    w.filter.append(f"-A KUBE-NODE-PORT {w.match(n.HEALTH_CHECK_NODE_PORT, 'dst')} -j ACCEPT")
    for base in (n.LOAD_BALANCER, n.CLUSTER_IP, n.EXTERNAL_IP, n.EXTERNAL_IP_LOCAL):
        w.filter.append(f"-A KUBE-IPVS-FILTER {w.match(base, 'dst,dst', comment=False)} -j RETURN")
    health = w.match(n.HEALTH_CHECK_NODE_PORT, "dst", comment=False)
    w.filter.append(f"-A KUBE-IPVS-FILTER {health} -j RETURN")
    w.filter.append(f"-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW "
                    f"{w.match(n.IPVS_IPS, 'dst', comment=False)} -j REJECT")
    w.nat.append(f"-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN")
    w.nat.append(f"-A KUBE-POSTROUTING -j MARK --xor-mark {mark}")
    w.nat.append('-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" '
                 "-j MASQUERADE" + (" --random-fully" if w.config.random_fully else ""))
    w.nat.append(f"-A KUBE-MARK-MASQ -j MARK --or-mark {mark}")


def render_rules(state: IpvsState, config: IpvsConfig) -> str:
    """The ``iptables-restore --noflush`` input for ``state`` (see the module docstring)."""
    w = _Writer(state, config)
    w.nat.append(f"-A KUBE-SERVICES -s {'::1/128' if config.ipv6 else '127.0.0.0/8'} -j RETURN")
    _set_jumps(w)
    _cluster_ip(w)
    _external_ips(w)
    _tail(w)
    out = ["*nat", *(f":{c} - [0:0]" for t, c in n.CHAINS if t == "nat"), *w.nat, "COMMIT",
           "*filter", *(f":{c} - [0:0]" for t, c in n.CHAINS if t == "filter"), *w.filter, "COMMIT"]
    return "".join(line + "\n" for line in out)
