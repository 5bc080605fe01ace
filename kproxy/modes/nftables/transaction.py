# ruff: noqa: E501  (nft rule text is kept whole on one line, to be read as nft prints it)
"""An nftables transaction in the ``add`` command form, and kube-proxy's fixed part of it.

:class:`Transaction` writes one line per operation as knftables writes them (``add chain ip
kube-proxy NAME { ... ; }``, ``add element ip kube-proxy MAP { KEY comment "C" : VERDICT }``).
:func:`setup` writes kube-proxy's ``setupNFTables`` (the newest layout: ``filter-prerouting-pre-dnat``
and ``filter-output-pre-dnat`` at priority -110 for the firewall check, the other filter chains at
0, the nat chains at -100 and 100).

nft 1.0.6 loads an ``add``-form transaction only when every chain is added before a rule or an
element refers to it, so every writer here adds a chain (and a set or map) before it is named;
the kernel tests load the result with ``nft -f``.
"""

from __future__ import annotations

from typing import NamedTuple

from kproxy.modes.nftables.config import FamilyContext
from kproxy.modes.nftables.names import (
    CLUSTER_IPS_CHECK,
    CLUSTER_IPS_SET,
    FIREWALL_CHECK,
    FIREWALL_IPS_MAP,
    MARK_MASQ_CHAIN,
    MASQUERADING_CHAIN,
    NO_ENDPOINT_NODEPORTS_MAP,
    NO_ENDPOINT_SERVICES_MAP,
    NODEPORT_ENDPOINTS_CHECK,
    NODEPORT_IPS_SET,
    REJECT_CHAIN,
    SERVICE_ENDPOINTS_CHECK,
    SERVICE_IPS_MAP,
    SERVICE_NODEPORTS_MAP,
    SERVICES_CHAIN,
    TABLE,
)

__all__ = ["BASE_CHAINS", "ELEMENT_CONTAINERS", "BaseChain", "Transaction", "setup"]


class BaseChain(NamedTuple):
    """A chain on a netfilter hook: name, type, hook, numeric priority."""

    name: str
    type: str
    hook: str
    priority: int


#: kube-proxy's ``nftablesBaseChains`` (``DNATPriority-10`` is -110, ``FilterPriority`` 0,
#: ``DNATPriority`` -100, ``SNATPriority`` 100).
BASE_CHAINS = (
    BaseChain("filter-prerouting-pre-dnat", "filter", "prerouting", -110),
    BaseChain("filter-output-pre-dnat", "filter", "output", -110),
    BaseChain("filter-input", "filter", "input", 0),
    BaseChain("filter-forward", "filter", "forward", 0),
    BaseChain("filter-output", "filter", "output", 0),
    BaseChain("nat-prerouting", "nat", "prerouting", -100),
    BaseChain("nat-output", "nat", "output", -100),
    BaseChain("nat-postrouting", "nat", "postrouting", 100),
)

#: kube-proxy's ``nftablesJumpChains``: (target, from, match).
_JUMPS = (
    (NODEPORT_ENDPOINTS_CHECK, "filter-input", "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, "filter-input", "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, "filter-forward", "ct state new"),
    (SERVICE_ENDPOINTS_CHECK, "filter-output", "ct state new"),
    (FIREWALL_CHECK, "filter-prerouting-pre-dnat", "ct state new"),
    (FIREWALL_CHECK, "filter-output-pre-dnat", "ct state new"),
    (SERVICES_CHAIN, "nat-output", ""),
    (SERVICES_CHAIN, "nat-prerouting", ""),
    (MASQUERADING_CHAIN, "nat-postrouting", ""),
    (CLUSTER_IPS_CHECK, "filter-forward", "ct state new"),
    (CLUSTER_IPS_CHECK, "filter-output", "ct state new"),
)

#: The sets and maps whose elements kube-proxy diffs between syncs (``nftElementStorage``), as
#: ``(kind, name)``.
ELEMENT_CONTAINERS = (
    ("set", CLUSTER_IPS_SET), ("map", SERVICE_IPS_MAP), ("map", FIREWALL_IPS_MAP),
    ("map", NO_ENDPOINT_SERVICES_MAP), ("map", NO_ENDPOINT_NODEPORTS_MAP), ("map", SERVICE_NODEPORTS_MAP),
)


class Transaction:
    """Operations on the ``kube-proxy`` table of one family.

    Chains, sets, maps and rules are one line each, in three parts written in this order:
    :attr:`lines` (the fixed part, each port's chains and the rules of its dispatch chains),
    :attr:`tail` (the other per-port rules, flushes of stale chains, deletions of sets), then the
    elements, one ``delete element`` and then one ``add element`` line per set or map holding
    all of its elements (``{ K1 : V1 , K2 : V2 }``). The load is the same as kube-proxy's one
    line per operation; the order is chosen for the kernel's cost (README, "nftables load
    time"): each rule with an anonymous ``vmap`` makes the kernel walk the
    whole transaction so far (``__nft_set_trans_bind`` in ``net/netfilter/nf_tables_api.c``),
    so those rules come as early as their chains allow, and grouped elements are one netlink
    message per set instead of one per element.

    Args:
        family: ``ip`` or ``ip6``.
    """

    def __init__(self, family: str) -> None:
        self._where = f"{family} {TABLE}"
        self.lines: list[str] = []
        self.tail: list[str] = []
        self._ensured: set[str] = set()
        #: (verb, container) -> element texts, in the order written.
        self._elements: dict[tuple[str, str], list[str]] = {}
        self._element_ops = 0

    @property
    def where(self) -> str:
        """``FAMILY kube-proxy``, as every line names the table."""
        return self._where

    def __len__(self) -> int:
        """knftables' ``NumOperations``: each line, and each element, is one operation."""
        return len(self.lines) + len(self.tail) + self._element_ops

    def text(self) -> str:
        """The transaction for ``nft -f``: one operation per line (elements grouped), ``""`` when empty."""
        out = self.lines + self.tail
        for verb in ("delete", "add"):
            out.extend(f"{verb} element {self._where} {container} {{ {' , '.join(items)} }}"
                       for (v, container), items in self._elements.items() if v == verb)
        return "".join(line + "\n" for line in out)

    def op(self, verb: str, kind: str, name: str = "", body: str = "", *, tail: bool = False) -> None:
        """``VERB KIND FAMILY kube-proxy [NAME] [{ BODY }]``, into :attr:`tail` when ``tail``."""
        line = f"{verb} {kind} {self._where}"
        if name:
            line += f" {name}"
        if body:
            line += f" {{ {body} }}"
        (self.tail if tail else self.lines).append(line)

    def ensure_chain(self, name: str) -> None:
        """kube-proxy's ``ensureChain``: add and flush ``name`` once per transaction."""
        if name in self._ensured:
            return
        self._ensured.add(name)
        where = self._where
        self.lines.append(f"add chain {where} {name}")
        self.lines.append(f"flush chain {where} {name}")

    def rule(self, chain: str, text: str, comment: str = "") -> None:
        """``add rule ... CHAIN TEXT [comment "C"]``."""
        self.lines.append(f"add rule {self._where} {chain} {text}" + (f' comment "{comment}"' if comment else ""))

    def element(self, verb: str, container: str, key: str, value: str = "", comment: str = "") -> None:
        """``add``/``delete element ... CONTAINER { KEY [comment "C"] [: VALUE] }`` (grouped per container).

        A deletion never carries the value or comment (the key names the element).
        """
        body = key if verb == "delete" else (
            key + (f' comment "{comment}"' if comment else "") + (f" : {value}" if value else ""))
        group = self._elements.get((verb, container))
        if group is None:
            group = self._elements[(verb, container)] = []
        group.append(body)
        self._element_ops += 1


def setup(tx: Transaction, ctx: FamilyContext, *, first: bool) -> None:
    """kube-proxy's ``setupNFTables`` into ``tx`` (a full sync's fixed part).

    Args:
        tx: the transaction written to.
        ctx: the family's configuration.
        first: the first sync of this process: each base chain is added and deleted once first,
            so that a changed type or priority of an older kube-proxy's chain is replaced.
    """
    ip, addr = ctx.ip, ctx.addr_type
    tx.op("add", "table", body='comment "rules for kube-proxy" ;')
    if first:
        for bc in BASE_CHAINS:
            tx.op("add", "chain", bc.name)
            tx.op("delete", "chain", bc.name)
    for bc in BASE_CHAINS:
        tx.op("add", "chain", bc.name, f"type {bc.type} hook {bc.hook} priority {bc.priority} ;")
        tx.op("flush", "chain", bc.name)
    for target, source, match in _JUMPS:
        tx.ensure_chain(target)
        tx.rule(source, f"{match} jump {target}".strip())
    for chain in (SERVICES_CHAIN, CLUSTER_IPS_CHECK, MASQUERADING_CHAIN, MARK_MASQ_CHAIN):
        tx.ensure_chain(chain)
    mark = ctx.config.mark
    tx.rule(MARK_MASQ_CHAIN, f"mark set mark or {mark}")
    tx.rule(MASQUERADING_CHAIN, f"mark and {mark} == 0 return")
    tx.rule(MASQUERADING_CHAIN, f"mark set mark xor {mark}")
    tx.rule(MASQUERADING_CHAIN, "masquerade fully-random")
    tx.op("add", "set", CLUSTER_IPS_SET, f'type {addr} ; comment "Active ClusterIPs" ;')
    tx.rule(CLUSTER_IPS_CHECK, f"{ip} daddr @{CLUSTER_IPS_SET} reject", "Reject traffic to invalid ports of ClusterIPs")
    if ctx.service_cidrs:
        tx.rule(CLUSTER_IPS_CHECK, f"{ip} daddr {{ {ctx.service_cidrs} }} drop", "Drop traffic to unallocated ClusterIPs")
    tx.op("add", "set", NODEPORT_IPS_SET, f'type {addr} ; comment "IPs that accept NodePort traffic" ;')
    if ctx.nodeport_ips is None:
        tx.op("delete", "set", NODEPORT_IPS_SET)
    else:
        tx.op("flush", "set", NODEPORT_IPS_SET)
        for node_ip in ctx.nodeport_ips:
            tx.element("add", NODEPORT_IPS_SET, node_ip)
    verdict_map = f"{addr} . inet_proto . inet_service : verdict"
    tx.op("add", "map", NO_ENDPOINT_SERVICES_MAP,
          f'type {verdict_map} ; comment "vmap to drop or reject packets to services with no endpoints" ;')
    tx.op("add", "map", NO_ENDPOINT_NODEPORTS_MAP, 'type inet_proto . inet_service : verdict ; '
          'comment "vmap to drop or reject packets to service nodeports with no endpoints" ;')
    tx.op("add", "chain", REJECT_CHAIN, 'comment "helper for @no-endpoint-services / @no-endpoint-nodeports" ;')
    tx.op("flush", "chain", REJECT_CHAIN)
    tx.rule(REJECT_CHAIN, "reject")
    dispatch = f"{ip} daddr . meta l4proto . th dport vmap"
    tx.rule(SERVICE_ENDPOINTS_CHECK, f"{dispatch} @{NO_ENDPOINT_SERVICES_MAP}")
    nodeport_match = ctx.no_localhost if ctx.nodeport_ips is None else f"{ip} daddr @{NODEPORT_IPS_SET}"
    tx.rule(NODEPORT_ENDPOINTS_CHECK, f"{nodeport_match} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS_MAP}")
    tx.op("add", "map", FIREWALL_IPS_MAP,
          f'type {verdict_map} ; comment "destinations that are subject to LoadBalancerSourceRanges" ;')
    tx.ensure_chain(FIREWALL_CHECK)
    tx.rule(FIREWALL_CHECK, f"{dispatch} @{FIREWALL_IPS_MAP}")
    tx.op("add", "map", SERVICE_IPS_MAP, f'type {verdict_map} ; comment "ClusterIP, ExternalIP and LoadBalancer IP traffic" ;')
    tx.op("add", "map", SERVICE_NODEPORTS_MAP, 'type inet_proto . inet_service : verdict ; comment "NodePort traffic" ;')
    tx.rule(SERVICES_CHAIN, f"{dispatch} @{SERVICE_IPS_MAP}")
    if ctx.nodeport_ips is None:
        tx.rule(SERVICES_CHAIN, f"fib daddr type local {ctx.no_localhost} meta l4proto . th dport vmap @{SERVICE_NODEPORTS_MAP}")
    else:
        tx.rule(SERVICES_CHAIN, f"{ip} daddr @{NODEPORT_IPS_SET} meta l4proto . th dport vmap @{SERVICE_NODEPORTS_MAP}")
    for kind, name in ELEMENT_CONTAINERS:
        tx.op("flush", kind, name)
