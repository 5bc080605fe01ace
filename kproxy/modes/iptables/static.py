"""The rules kube-proxy writes whatever the Services: top-level chains, masquerading,
forwarding, the localnet firewall and the KUBE-SERVICES -> KUBE-NODEPORTS tail call, plus
the jump rules it installs into the built-in chains (which are data here, for an applier).

Every sync rewrites the top-level chains (a ``:CHAIN`` line flushes a chain under
``iptables-restore --noflush``); the built-in chains are never written by the restore, so
kube-proxy ensures its jumps into them one rule at a time, on full syncs only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.kernel.netfilter import quote_argument
from kproxy.modes.iptables.config import FamilyContext, IptablesConfig, family_context
from kproxy.modes.iptables.names import (
    KUBE_EXTERNAL_SERVICES,
    KUBE_FIREWALL,
    KUBE_FORWARD,
    KUBE_MARK_MASQ,
    KUBE_NODEPORTS,
    KUBE_POSTROUTING,
    KUBE_PROXY_FIREWALL,
    KUBE_SERVICES,
    NFACCT_CT_STATE_INVALID_DROPPED,
    NFACCT_LOCALHOST_NODEPORT_ACCEPTED,
)

__all__ = [
    "ENSURED_JUMPS",
    "FILTER_TOP_CHAINS",
    "JUMP_RULES",
    "KUBELET_JUMP_RULES",
    "NAT_TOP_CHAINS",
    "JumpRule",
    "chain_line",
    "filter_head",
    "filter_tail",
    "nat_head",
    "nat_tail",
    "nfacct_counters",
]

#: filter chains declared (so flushed and rewritten) by every sync, in kube-proxy's order.
FILTER_TOP_CHAINS = (KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL)
#: nat chains declared by every sync, in kube-proxy's order.
NAT_TOP_CHAINS = (KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ)

_CTSTATE_NEW = ("-m", "conntrack", "--ctstate", "NEW")


def chain_line(chain: str) -> str:
    """A chain declaration as kube-proxy writes it, with its newline."""
    return f":{chain} - [0:0]\n"




@dataclass(frozen=True, slots=True, kw_only=True)
class JumpRule:
    """A rule kube-proxy keeps in a built-in chain to reach one of its own.

    kube-proxy ensures each (chain first, then the rule, prepended with ``iptables -I``) on
    every full sync, in :data:`JUMP_RULES` order, so on a fresh node the last of a built-in
    chain's jumps ends up first.

    Attributes:
        table: ``filter`` or ``nat``.
        chain: the built-in chain holding the rule (``INPUT``, ``PREROUTING`` ...).
        target: the kube-proxy chain jumped to, which must exist first.
        comment: the rule's comment; ``""`` for none.
        extra_args: matches before the comment (``-m conntrack --ctstate NEW``).
    """

    table: str
    chain: str
    target: str
    comment: str = ""
    extra_args: tuple[str, ...] = ()

    @property
    def argv(self) -> tuple[str, ...]:
        """The rule specification as ``iptables -I CHAIN`` arguments (comment unquoted)."""
        comment = ("-m", "comment", "--comment", self.comment) if self.comment else ()
        return (*self.extra_args, *comment, "-j", self.target)

    def restore_line(self) -> str:
        """``-I CHAIN ...`` for an ``iptables-restore --noflush`` input (comment quoted)."""
        return " ".join(("-I", self.chain, *(quote_argument(a) for a in self.argv)))


def _jump(table: str, chain: str, target: str, comment: str, new_only: bool = False) -> JumpRule:
    return JumpRule(table=table, chain=chain, target=target, comment=comment,
                    extra_args=_CTSTATE_NEW if new_only else ())


#: kube-proxy's ``iptablesJumpChains``, in order.
JUMP_RULES: tuple[JumpRule, ...] = (
    _jump("filter", "INPUT", KUBE_EXTERNAL_SERVICES, "kubernetes externally-visible service portals", True),
    _jump("filter", "FORWARD", KUBE_EXTERNAL_SERVICES, "kubernetes externally-visible service portals", True),
    _jump("filter", "INPUT", KUBE_NODEPORTS, "kubernetes health check service ports"),
    _jump("filter", "FORWARD", KUBE_SERVICES, "kubernetes service portals", True),
    _jump("filter", "OUTPUT", KUBE_SERVICES, "kubernetes service portals", True),
    _jump("filter", "FORWARD", KUBE_FORWARD, "kubernetes forwarding rules"),
    _jump("filter", "INPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", True),
    _jump("filter", "OUTPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", True),
    _jump("filter", "FORWARD", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", True),
    _jump("nat", "OUTPUT", KUBE_SERVICES, "kubernetes service portals"),
    _jump("nat", "PREROUTING", KUBE_SERVICES, "kubernetes service portals"),
    _jump("nat", "POSTROUTING", KUBE_POSTROUTING, "kubernetes postrouting rules"),
)

#: kube-proxy's copies of kubelet's jumps to KUBE-FIREWALL (``iptablesKubeletJumpChains``),
#: ensured after :data:`JUMP_RULES`; the chain is filled only for IPv4 localhost NodePorts.
KUBELET_JUMP_RULES: tuple[JumpRule, ...] = (
    JumpRule(table="filter", chain="INPUT", target=KUBE_FIREWALL),
    JumpRule(table="filter", chain="OUTPUT", target=KUBE_FIREWALL),
)

#: What kube-proxy ensures on every full sync, in order: ``iptablesJumpChains`` then
#: ``iptablesKubeletJumpChains`` (kubelet's KUBE-FIREWALL jumps, kept by kube-proxy as well).
ENSURED_JUMPS: tuple[JumpRule, ...] = (*JUMP_RULES, *KUBELET_JUMP_RULES)


def nfacct_counters(config: IptablesConfig) -> tuple[str, ...]:
    """The nfacct objects ``config``'s rules name; they must exist before the restore."""
    ctx = family_context(config)
    if not config.nfacct:
        return ()
    out = [NFACCT_CT_STATE_INVALID_DROPPED] if not ctx.config.conntrack_tcp_be_liberal else []
    if ctx.localhost_nodeport_nfacct:
        out.append(NFACCT_LOCALHOST_NODEPORT_ACCEPTED)
    return tuple(out)


def filter_head(ctx: FamilyContext) -> tuple[str, str]:
    """The filter table's top-level chain lines and its leading rules (KUBE-FIREWALL)."""
    chains = "".join(chain_line(c) for c in FILTER_TOP_CHAINS)
    if ctx.ipv6 or not ctx.localhost_nodeports:
        return chains, ""
    # kubelet writes the same rule; kube-proxy mitigates route_localnet (issue 90259).
    rule = (f'-A {KUBE_FIREWALL} -m comment --comment "block incoming localnet connections"'
            " -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n")
    return chains + chain_line(KUBE_FIREWALL), rule


def filter_tail(ctx: FamilyContext) -> str:
    """The KUBE-FORWARD rules, written after every service's filter rules."""
    mark = ctx.mark
    out = []
    if not ctx.config.conntrack_tcp_be_liberal:
        nfacct = f" -m nfacct --nfacct-name {NFACCT_CT_STATE_INVALID_DROPPED}" if ctx.config.nfacct else ""
        out.append(f"-A {KUBE_FORWARD} -m conntrack --ctstate INVALID{nfacct} -j DROP\n")
    out.append(f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding rules"'
               f" -m mark --mark {mark}/{mark} -j ACCEPT\n")
    out.append(f'-A {KUBE_FORWARD} -m comment --comment "kubernetes forwarding conntrack rule"'
               " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n")
    return "".join(out)


def nat_head(ctx: FamilyContext) -> tuple[str, str]:
    """The nat table's top-level chain lines and the masquerading rules."""
    mark = ctx.mark
    fully = " --random-fully" if ctx.config.random_fully else ""
    rules = (
        f"-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN\n"
        f"-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}\n"
        f'-A {KUBE_POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT"'
        f" -j MASQUERADE{fully}\n"
        f"-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}\n"
    )
    return "".join(chain_line(c) for c in NAT_TOP_CHAINS), rules


def nat_tail(ctx: FamilyContext) -> str:
    """The tail call(s) to KUBE-NODEPORTS; they must stay last in KUBE-SERVICES."""
    comment = '"kubernetes service nodeports; NOTE: this must be the last rule in this chain"'
    return "".join(f"-A {KUBE_SERVICES} -m comment --comment {comment} {dest} -j {KUBE_NODEPORTS}\n"
                   for dest in ctx.nodeport_destinations)
