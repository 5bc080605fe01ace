# ruff: noqa: E501  (nft rule text is kept whole on one line, to be read as nft prints it)
"""The nftables objects of one service port, as kube-proxy's ``syncProxyRules`` writes them.

:func:`port_plan` returns a :class:`PortPlan`: the per-service chains the port owns (in
kube-proxy's ``ensureChain`` order: endpoint chains, then ``service-``, ``local-``,
``external-``, ``firewall-``), the map and set elements it contributes (recomputed every sync;
only differences are sent), and the operations that fill its chains (written only when the
Service changed or on a full sync).

The decisions come from the snapshot's categorisation, never re-derived
(``pkg/proxy/nftables/proxier.go``):

- ``has_internal``: endpoints exist and, with internalTrafficPolicy Local, local ones; otherwise
  the ClusterIP goes to ``no-endpoint-services`` (``goto reject-chain`` with no endpoints at all,
  ``drop`` with none local).
- ``has_external``: the same for externalTrafficPolicy and the external IPs, load-balancer IPs
  and NodePort.
- The ``external-`` chain exists whenever there are endpoints and the port is reachable from
  outside, even with no local endpoints (its short-circuit rules still apply).
- The ``firewall-`` chain exists with load-balancer IPs and source ranges, endpoints or not.
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

from kproxy.model.snapshot import Endpoint, ServicePortInfo
from kproxy.modes.nftables.config import FamilyContext
from kproxy.modes.nftables.names import (
    CLUSTER_IPS_SET,
    FIREWALL_IPS_MAP,
    MARK_MASQ_CHAIN,
    NO_ENDPOINT_NODEPORTS_MAP,
    NO_ENDPOINT_SERVICES_MAP,
    REJECT_CHAIN,
    SERVICE_IPS_MAP,
    SERVICE_NODEPORTS_MAP,
    TABLE,
    endpoint_base,
    service_chain_base,
)

__all__ = ["Element", "PortPlan", "port_plan"]

_JUMP_MASQ = f"jump {MARK_MASQ_CHAIN}"


class Element(NamedTuple):
    """One element: the set or map, its key (``a . b . c``), verdict (``""`` in a set), comment."""

    container: str
    key: str
    value: str = ""
    comment: str = ""


class PortPlan(NamedTuple):
    """What one service port programs (see the module docstring).

    Attributes:
        chains: the per-service chains it owns, in ``ensureChain`` order.
        affinity_sets: the ClientIP affinity sets of its endpoints.
        elements: its set and map elements, in kube-proxy's order.
        head: the ``add set`` lines of its affinity sets and the ``add rule`` lines of its
            ``service-`` and ``local-`` chains (those holding the ``numgen ... vmap`` rules), in
            order; written right after the chains are added and flushed.
        tail: the ``add rule`` lines of its other chains (endpoint, external, firewall), in
            order; a transaction may write them after every port's head.
    """

    chains: tuple[str, ...]
    affinity_sets: tuple[str, ...]
    elements: tuple[Element, ...]
    head: tuple[str, ...]
    tail: tuple[str, ...]


class _Names(NamedTuple):
    svc: str
    local: str
    ext: str
    fw: str


def _elements(info: ServicePortInfo, n: _Names, verdicts: tuple[str, str], flags: tuple[bool, ...]) -> list[Element]:
    has_eps, has_internal, has_external, uses_fw = flags
    internal_verdict, external_verdict = verdicts
    spn = str(info.name)
    proto = info.protocol.value.lower()
    port = f"{proto} . {info.port}"
    internal = n.local if info.internal_policy_local else n.svc
    out = [Element(CLUSTER_IPS_SET, info.cluster_ip)]
    if has_internal:
        out.append(Element(SERVICE_IPS_MAP, f"{info.cluster_ip} . {port}", f"goto {internal}"))
    else:
        out.append(Element(NO_ENDPOINT_SERVICES_MAP, f"{info.cluster_ip} . {port}", internal_verdict, spn))
    for ip in info.external_ips:
        if has_eps:
            out.append(Element(SERVICE_IPS_MAP, f"{ip} . {port}", f"goto {n.ext}"))
        if not has_external:
            out.append(Element(NO_ENDPOINT_SERVICES_MAP, f"{ip} . {port}", external_verdict, spn))
    for ip in info.load_balancer_ips:
        if has_eps:
            out.append(Element(SERVICE_IPS_MAP, f"{ip} . {port}", f"goto {n.ext}"))
        if uses_fw:
            out.append(Element(FIREWALL_IPS_MAP, f"{ip} . {port}", f"goto {n.fw}"))
    if not has_external:
        out.extend(Element(NO_ENDPOINT_SERVICES_MAP, f"{ip} . {port}", external_verdict, spn)
                   for ip in info.load_balancer_ips)
    if info.node_port:
        if has_eps:
            out.append(Element(SERVICE_NODEPORTS_MAP, f"{proto} . {info.node_port}", f"goto {n.ext}"))
        if not has_external:
            out.append(Element(NO_ENDPOINT_NODEPORTS_MAP, f"{proto} . {info.node_port}", external_verdict, spn))
    return out


def _external_rules(info: ServicePortInfo, n: _Names, ctx: FamilyContext, has_external: bool) -> list[str]:
    if not info.external_policy_local:
        rules = [_JUMP_MASQ]
    else:
        rules = []
        if ctx.if_local:
            rules.append(f'{ctx.if_local} goto {n.svc} comment "short-circuit pod traffic"')
        rules.append(f'fib saddr type local {_JUMP_MASQ} comment "masquerade local traffic"')
        rules.append(f'fib saddr type local goto {n.svc} comment "short-circuit local traffic"')
    if has_external:
        rules.append(f"goto {n.local if info.external_policy_local else n.svc}")
    return rules


def _firewall_rule(info: ServicePortInfo, ctx: FamilyContext) -> str:
    sources = list(info.load_balancer_source_ranges)
    node = ipaddress.ip_address(ctx.node_ip) if ctx.node_ip else None
    if node is not None and any(node in ipaddress.ip_network(c, strict=False) for c in sources
                                if (":" in c) == (node.version == 6)):
        # A VIP on the node: the node reaching it comes from the VIP itself.
        sources.extend(info.load_balancer_ips)
    return f"{ctx.ip} saddr != {{ {' , '.join(sources)} }} drop"


def _dispatch(rule: str, chain: str, endpoints: tuple[Endpoint, ...], chains: dict[str, tuple[str, str]],
              ip: str, affinity: bool) -> list[str]:
    out: list[str] = []
    if affinity:
        out.extend(f"{rule}{chain} {ip} saddr @{chains[ep.address][1]} goto {chains[ep.address][0]}"
                   for ep in endpoints)
    vmap = " , ".join(f"{i} : goto {chains[ep.address][0]}" for i, ep in enumerate(endpoints))
    out.append(f"{rule}{chain} numgen random mod {len(endpoints)} vmap {{ {vmap} }}")
    return out


def port_plan(info: ServicePortInfo, ctx: FamilyContext) -> PortPlan:
    """Plan one service port (see the module docstring); pure, so callers may memoise it.

    The operations come out as whole ``add`` lines of the family's table, so a renderer that
    keeps the plan of an unchanged port across syncs writes them again without building them.
    """
    base = service_chain_base(info.name)
    n = _Names("service-" + base, "local-" + base, "external-" + base, "firewall-" + base)
    has_eps = info.has_any_endpoints
    no_local = not info.local_endpoints
    has_internal = has_eps and not (info.internal_policy_local and no_local)
    has_external = has_eps and not (info.external_policy_local and no_local)
    uses_cluster = bool(info.cluster_endpoints) and info.uses_cluster_endpoints
    uses_local = bool(info.local_endpoints) and info.uses_local_endpoints
    uses_ext = has_eps and info.externally_accessible
    uses_fw = bool(info.load_balancer_ips) and bool(info.load_balancer_source_ranges)
    reject = f"goto {REJECT_CHAIN}"
    verdicts = (reject, reject) if not has_eps else (
        "" if has_internal else "drop", "" if has_external else "drop")
    elements = _elements(info, n, verdicts, (has_eps, has_internal, has_external, uses_fw))
    affinity = info.session_affinity
    reachable = info.all_reachable_endpoints
    eps: dict[str, tuple[str, str]] = {}
    for ep in reachable:
        ep_base = endpoint_base(info.name, ep.ip, ep.port)
        eps[ep.address] = ("endpoint-" + ep_base, "affinity-" + ep_base)
    chains = [eps[ep.address][0] for ep in reachable]
    chains += [c for c, used in ((n.svc, uses_cluster), (n.local, uses_local), (n.ext, uses_ext), (n.fw, uses_fw))
               if used]
    ip = ctx.ip
    where = f"{ip} {TABLE}"
    rule = f"add rule {where} "
    head: list[str] = []
    tail: list[str] = []
    internal = n.local if info.internal_policy_local else n.svc
    masq_if = "" if ctx.config.masquerade_all else ctx.if_not_local
    if has_internal and (ctx.config.masquerade_all or masq_if):
        cond = f" {masq_if}" if masq_if else ""
        head.append(f"{rule}{internal} {ip} daddr {info.cluster_ip}{cond} {_JUMP_MASQ}")
    if uses_ext:
        tail.extend(f"{rule}{n.ext} {r}" for r in _external_rules(info, n, ctx, has_external))
    if uses_fw:
        tail.append(f"{rule}{n.fw} {_firewall_rule(info, ctx)}")
    if affinity:
        spec = f"{{ type {ctx.addr_type} ; flags dynamic,timeout ; timeout {info.session_affinity_timeout_s}s ; }}"
        head[:0] = [f"add set {where} {eps[ep.address][1]} {spec}" for ep in reachable]
    if uses_cluster:
        head.extend(_dispatch(rule, n.svc, info.cluster_endpoints, eps, ip, affinity))
    if uses_local:
        head.extend(_dispatch(rule, n.local, info.local_endpoints, eps, ip, affinity))
    proto = info.protocol.value.lower()
    for ep in reachable:
        chain, aff = eps[ep.address]
        tail.append(f"{rule}{chain} {ip} saddr {ep.ip} {_JUMP_MASQ}")
        if affinity:
            tail.append(f"{rule}{chain} update @{aff} {{ {ip} saddr }}")
        tail.append(f"{rule}{chain} meta l4proto {proto} dnat to {ep.address}")
    sets = tuple(eps[ep.address][1] for ep in reachable) if affinity else ()
    return PortPlan(chains=tuple(chains), affinity_sets=sets, elements=tuple(elements),
                    head=tuple(head), tail=tuple(tail))
