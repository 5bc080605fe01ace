"""The rules of one service port, as kube-proxy's ``syncProxyRules`` writes them.

:func:`port_rules` returns four pieces of text. ``filter`` and ``nat_top`` go into the
top-level chains (KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-NODEPORTS, KUBE-PROXY-FIREWALL)
and are written on every sync; ``nat_decls`` and ``nat_body`` declare and fill the port's own
chains (KUBE-SVC/SVL/EXT/FW/SEP) and are written only when the Service changed or on a full
sync. Lines appear in kube-proxy's emission order, so within a chain the order is exact.

The decisions, from the snapshot's categorisation (never re-derived):

- ``has_internal``: there are endpoints and, with internalTrafficPolicy Local, local ones;
  otherwise the ClusterIP gets a filter REJECT (no endpoints at all) or DROP (none local).
- ``has_external``: the same for externalTrafficPolicy; external IPs, load-balancer IPs and
  the NodePort get REJECT or DROP in KUBE-EXTERNAL-SERVICES.
- The KUBE-EXT chain exists whenever there are endpoints and the port is reachable from
  outside, even without local endpoints, to short-circuit pod and node traffic.
- The KUBE-FW chain exists with load-balancer IPs, source ranges and endpoints.
"""

from __future__ import annotations

import ipaddress
from typing import NamedTuple

from kproxy.model.snapshot import Endpoint, ServicePortInfo
from kproxy.modes.iptables.config import FamilyContext
from kproxy.modes.iptables.names import (
    KUBE_EXTERNAL_SERVICES,
    KUBE_MARK_MASQ,
    KUBE_NODEPORTS,
    KUBE_PROXY_FIREWALL,
    KUBE_SERVICES,
    NFACCT_LOCALHOST_NODEPORT_ACCEPTED,
    endpoint_chain_name,
    port_proto_hash,
    probability,
)

__all__ = ["PortRules", "port_chain_names", "port_rules"]


class PortRules(NamedTuple):
    """One service port's rules (see the module docstring); every line ends in ``\\n``."""

    filter: str
    nat_top: str
    nat_decls: str
    nat_body: str
    chains: tuple[str, ...]


class _Plan(NamedTuple):
    spn: str
    proto: str
    svc: str
    svl: str
    ext: str
    fw: str
    has_eps: bool
    has_internal: bool
    has_external: bool
    uses_cluster_chain: bool
    uses_local_chain: bool
    uses_ext: bool
    uses_fw: bool


def _plan(info: ServicePortInfo) -> _Plan:
    spn = str(info.name)
    proto = info.protocol.value.lower()
    h = port_proto_hash(spn, proto)
    has_eps = info.has_any_endpoints
    no_local = not info.local_endpoints
    return _Plan(
        spn=spn, proto=proto,
        svc="KUBE-SVC-" + h, svl="KUBE-SVL-" + h, ext="KUBE-EXT-" + h, fw="KUBE-FW-" + h,
        has_eps=has_eps,
        has_internal=has_eps and not (info.internal_policy_local and no_local),
        has_external=has_eps and not (info.external_policy_local and no_local),
        uses_cluster_chain=bool(info.cluster_endpoints) and info.uses_cluster_endpoints,
        uses_local_chain=bool(info.local_endpoints) and info.uses_local_endpoints,
        uses_ext=has_eps and info.externally_accessible,
        uses_fw=has_eps and bool(info.load_balancer_ips) and bool(info.load_balancer_source_ranges),
    )


def port_chain_names(info: ServicePortInfo) -> tuple[str, ...]:
    """The nat chains the port owns, in declaration order (no text is built)."""
    p = _plan(info)
    chains = []
    if p.uses_ext:
        chains.append(p.ext)
    if p.uses_fw:
        chains.append(p.fw)
    if p.uses_cluster_chain:
        chains.append(p.svc)
    if p.uses_local_chain:
        chains.append(p.svl)
    chains.extend(endpoint_chain_name(p.spn, p.proto, ep.address) for ep in info.all_reachable_endpoints)
    return tuple(chains)


def _top_rules(info: ServicePortInfo, p: _Plan, ctx: FamilyContext) -> tuple[str, str]:
    """The filter rules and the KUBE-SERVICES / KUBE-NODEPORTS nat rules."""
    spn, proto = p.spn, p.proto
    m = f"-m {proto} -p {proto}"
    dport = f"--dport {info.port}"
    filt: list[str] = []
    nat: list[str] = []
    if not p.has_eps:
        int_target = ext_target = "REJECT"
        int_comment = ext_comment = f'"{spn} has no endpoints"'
    else:
        int_target = ext_target = "DROP"
        int_comment = ext_comment = f'"{spn} has no local endpoints"'
    internal = p.svl if info.internal_policy_local else p.svc
    if p.has_internal:
        nat.append(f'-A {KUBE_SERVICES} -m comment --comment "{spn} cluster IP" {m}'
                   f" -d {info.cluster_ip} {dport} -j {internal}\n")
    else:
        filt.append(f"-A {KUBE_SERVICES} -m comment --comment {int_comment} {m}"
                    f" -d {info.cluster_ip} {dport} -j {int_target}\n")
    for ip in info.external_ips:
        if p.has_eps:
            nat.append(f'-A {KUBE_SERVICES} -m comment --comment "{spn} external IP" {m}'
                       f" -d {ip} {dport} -j {p.ext}\n")
        if not p.has_external:
            filt.append(f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {ext_comment} {m}"
                        f" -d {ip} {dport} -j {ext_target}\n")
    lb_chain = p.fw if p.uses_fw else p.ext
    for ip in info.load_balancer_ips:
        if p.has_eps:
            nat.append(f'-A {KUBE_SERVICES} -m comment --comment "{spn} loadbalancer IP" {m}'
                       f" -d {ip} {dport} -j {lb_chain}\n")
        if p.uses_fw:
            filt.append(f"-A {KUBE_PROXY_FIREWALL} -m comment --comment"
                        f' "{spn} traffic not accepted by {p.fw}" {m} -d {ip} {dport} -j DROP\n')
    if not p.has_external:
        filt.extend(f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {ext_comment} {m}"
                    f" -d {ip} {dport} -j {ext_target}\n" for ip in info.load_balancer_ips)
    if info.node_port:
        np = f"--dport {info.node_port}"
        if p.has_eps:
            if ctx.localhost_nodeport_nfacct:
                nat.append(f"-A {KUBE_NODEPORTS} -m comment --comment {spn} {m} -d 127.0.0.0/8 {np}"
                           f" -m nfacct --nfacct-name {NFACCT_LOCALHOST_NODEPORT_ACCEPTED} -j {p.ext}\n")
            nat.append(f"-A {KUBE_NODEPORTS} -m comment --comment {spn} {m} {np} -j {p.ext}\n")
        if not p.has_external:
            filt.append(f"-A {KUBE_EXTERNAL_SERVICES} -m comment --comment {ext_comment}"
                        f" -m addrtype --dst-type LOCAL {m} {np} -j {ext_target}\n")
    if info.health_check_node_port:
        filt.append(f'-A {KUBE_NODEPORTS} -m comment --comment "{spn} health check node port"'
                    f" -m tcp -p tcp --dport {info.health_check_node_port} -j ACCEPT\n")
    return "".join(filt), "".join(nat)


def _internal_masquerade(info: ServicePortInfo, p: _Plan, ctx: FamilyContext) -> str:
    """Off-cluster (or, with --masquerade-all, any) traffic to the ClusterIP is masqueraded."""
    if not p.has_internal:
        return ""
    if ctx.config.masquerade_all:
        cond = ""
    elif ctx.has_local_detector:
        cond = " " + ctx.if_not_local
    else:
        return ""
    chain = p.svl if info.internal_policy_local else p.svc
    return (f'-A {chain} -m comment --comment "{p.spn} cluster IP" -m {p.proto} -p {p.proto}'
            f" -d {info.cluster_ip} --dport {info.port}{cond} -j {KUBE_MARK_MASQ}\n")


def _ext_chain(info: ServicePortInfo, p: _Plan, ctx: FamilyContext) -> str:
    spn, ext = p.spn, p.ext
    if not info.external_policy_local:
        out = [f'-A {ext} -m comment --comment "masquerade traffic for {spn} external destinations"'
               f" -j {KUBE_MARK_MASQ}\n"]
    else:
        out = []
        if ctx.has_local_detector:
            out.append(f'-A {ext} -m comment --comment "pod traffic for {spn} external destinations"'
                       f" {ctx.if_local} -j {p.svc}\n")
        out.append(f'-A {ext} -m comment --comment "masquerade LOCAL traffic for {spn} external destinations"'
                   f" -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}\n")
        out.append(f'-A {ext} -m comment --comment "route LOCAL traffic for {spn} external destinations"'
                   f" -m addrtype --src-type LOCAL -j {p.svc}\n")
    if p.has_external:
        out.append(f"-A {ext} -j {p.svl if info.external_policy_local else p.svc}\n")
    return "".join(out)


def _fw_chain(info: ServicePortInfo, p: _Plan, ctx: FamilyContext) -> str:
    head = f'-A {p.fw} -m comment --comment "{p.spn} loadbalancer IP"'
    out = [f"{head} -s {cidr} -j {p.ext}\n" for cidr in info.load_balancer_source_ranges]
    # A VIP often sits on the node itself; a node inside the ranges reaches it from the VIP.
    if ctx.node_ip is not None and _any_contains(info.load_balancer_source_ranges, ctx.node_ip):
        out.extend(f"{head} -s {ip} -j {p.ext}\n" for ip in info.load_balancer_ips)
    out.append(f'-A {p.fw} -m comment --comment "other traffic to {p.spn} will be dropped by'
               ' KUBE-PROXY-FIREWALL"\n')
    return "".join(out)


def _any_contains(cidrs: tuple[str, ...], ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    return any(addr in ipaddress.ip_network(c, strict=False) for c in cidrs
               if (":" in c) == (addr.version == 6))


def _dispatch(
    info: ServicePortInfo, p: _Plan, chain: str, endpoints: tuple[Endpoint, ...],
    seps: dict[str, str], large: bool,
) -> str:
    """Affinity checks, then one probability-weighted jump per endpoint."""
    spn = p.spn
    out = []
    targets = [(ep.address, seps[ep.address]) for ep in endpoints]
    timeout = info.session_affinity_timeout_s
    if timeout is not None:
        for addr, sep in targets:
            comment = "" if large else f' -m comment --comment "{spn} -> {addr}"'
            out.append(f"-A {chain}{comment} -m recent --name {sep} --rcheck --seconds {timeout}"
                       f" --reap -j {sep}\n")
    n = len(targets)
    for i, (addr, sep) in enumerate(targets):
        comment = "" if large else f' -m comment --comment "{spn} -> {addr}"'
        stat = f" -m statistic --mode random --probability {probability(n - i)}" if i < n - 1 else ""
        out.append(f"-A {chain}{comment}{stat} -j {sep}\n")
    return "".join(out)


def _endpoint_chains(
    info: ServicePortInfo, p: _Plan, seps: dict[str, str], large: bool
) -> tuple[str, str]:
    spn, proto = p.spn, p.proto
    comment = "" if large else f" -m comment --comment {spn}"
    affinity = info.session_affinity_timeout_s is not None
    decls, rules = [], []
    for ep in info.all_reachable_endpoints:
        addr = ep.address
        sep = seps[addr]
        decls.append(f":{sep} - [0:0]\n")
        recent = f" -m recent --name {sep} --set" if affinity else ""
        rules.append(f"-A {sep}{comment} -s {ep.ip} -j {KUBE_MARK_MASQ}\n"
                     f"-A {sep}{comment}{recent} -m {proto} -p {proto}"
                     f" -j DNAT --to-destination {addr}\n")
    return "".join(decls), "".join(rules)


def port_rules(
    info: ServicePortInfo, ctx: FamilyContext, *, large_cluster: bool, chains: bool = True
) -> PortRules:
    """Render one service port.

    Args:
        info: the port, with its categorised endpoints.
        ctx: the configuration resolved for the port's family.
        large_cluster: kube-proxy's large-cluster mode (no comments on endpoint rules).
        chains: render the port's own chains; False leaves ``nat_decls``, ``nat_body`` and
            ``chains`` empty (the port is not rewritten by a partial sync).
    """
    p = _plan(info)
    filt, nat_top = _top_rules(info, p, ctx)
    if not chains:
        return PortRules(filter=filt, nat_top=nat_top, nat_decls="", nat_body="", chains=())
    spn, proto = p.spn, p.proto
    seps = {ep.address: endpoint_chain_name(spn, proto, ep.address) for ep in info.all_reachable_endpoints}
    body = [_internal_masquerade(info, p, ctx)]
    own: list[str] = []
    if p.uses_ext:
        own.append(p.ext)
        body.append(_ext_chain(info, p, ctx))
    if p.uses_fw:
        own.append(p.fw)
        body.append(_fw_chain(info, p, ctx))
    if p.uses_cluster_chain:
        own.append(p.svc)
        body.append(_dispatch(info, p, p.svc, info.cluster_endpoints, seps, large_cluster))
    if p.uses_local_chain:
        own.append(p.svl)
        body.append(_dispatch(info, p, p.svl, info.local_endpoints, seps, large_cluster))
    sep_decls, sep_rules = _endpoint_chains(info, p, seps, large_cluster)
    body.append(sep_rules)
    decls = "".join(f":{c} - [0:0]\n" for c in own) + sep_decls
    own.extend(seps.values())
    return PortRules(filter=filt, nat_top=nat_top, nat_decls=decls, nat_body="".join(body),
                     chains=tuple(own))
