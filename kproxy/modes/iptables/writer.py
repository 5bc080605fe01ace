"""Assemble ``iptables-restore`` input from the static rules and every port's rules.

The layout is kube-proxy's: ``*filter``, the top-level chain lines, KUBE-FIREWALL's rule, each
port's filter rules, KUBE-FORWARD's rules, ``COMMIT``; then ``*nat``, the top-level chain
lines, the service chains' lines (and those of stale chains being deleted), the masquerade
rules, each port's nat rules, the ``-X`` deletions, the KUBE-NODEPORTS tail call, ``COMMIT``.
kube-proxy walks its ports in Go map order (random); kproxy walks them sorted by
ServicePortName, so the output is deterministic.

A *full* render writes every port's chains. A *partial* render (KEP-3453) writes every
top-level chain but only the chains of the ports to rewrite, and deletes stale chains. Both
are meant for ``iptables-restore --noflush`` (kube-proxy always restores with ``--noflush``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from kproxy.model.names import IPFamily, NamespacedName, ServicePortName
from kproxy.model.snapshot import ServicePortInfo, Snapshot
from kproxy.modes.iptables.config import FamilyContext, IptablesConfig, family_context
from kproxy.modes.iptables.names import is_service_chain_name
from kproxy.modes.iptables.service import PortRules, port_chain_names, port_rules
from kproxy.modes.iptables.static import chain_line, filter_head, filter_tail, nat_head, nat_tail

__all__ = [
    "RenderResult",
    "assemble",
    "changed_services",
    "family_ports",
    "is_large_cluster",
    "render_full",
    "render_partial",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderResult:
    """One rendered ``iptables-restore --noflush`` input and what it does.

    Attributes:
        text: the restore input (filter then nat table).
        full: every service chain is written (jump rules should be ensured with it).
        large_cluster: rendered in kube-proxy's large-cluster mode.
        written_ports: how many ports had their chains written.
        deleted_chains: the stale chains the input flushes and deletes (``-X``), sorted.
        filter_rules, nat_rules: the number of ``-A`` lines per table.
        route_localnet: the rules serve IPv4 localhost NodePorts, so the kernel needs
            ``net.ipv4.conf.all.route_localnet=1`` (kube-proxy sets it at start).
    """

    text: str
    full: bool
    large_cluster: bool
    written_ports: int
    deleted_chains: tuple[str, ...]
    filter_rules: int
    nat_rules: int
    route_localnet: bool = False


def family_ports(snapshot: Snapshot, family: IPFamily) -> list[ServicePortInfo]:
    """The snapshot's ports of ``family``, sorted by ServicePortName."""
    keys = sorted((k for k in snapshot.ports if k[0] is family), key=_key_order)
    return [snapshot.ports[k] for k in keys]


def _key_order(key: tuple[IPFamily, ServicePortName]) -> tuple[str, str, str, str]:
    spn = key[1]
    return (spn.namespace, spn.name, spn.port, spn.protocol.value)


def is_large_cluster(ports: Iterable[ServicePortInfo], threshold: int) -> bool:
    """kube-proxy's large-cluster mode: more than ``threshold`` endpoints in the family."""
    return sum(len(info.endpoints) for info in ports) > threshold


def assemble(
    ctx: FamilyContext,
    ports: Iterable[tuple[PortRules, bool]],
    *,
    full: bool,
    deleted: Sequence[str],
    large_cluster: bool,
) -> RenderResult:
    """Build the restore input.

    Args:
        ctx: the resolved configuration.
        ports: each port's rules in output order, and whether its own chains are written.
        full: recorded in the result (every port's chains are written).
        deleted: stale chains to flush and delete, in order.
        large_cluster: whether the rules were rendered in large-cluster mode (recorded only).
    """
    f_chains, f_head = filter_head(ctx)
    n_chains, n_head = nat_head(ctx)
    filt = [f_head]
    decls = [n_chains]
    nat = [n_head]
    written = 0
    for r, write in ports:
        filt.append(r.filter)
        nat.append(r.nat_top)
        if write:
            written += 1
            decls.append(r.nat_decls)
            nat.append(r.nat_body)
    decls.extend(chain_line(c) for c in deleted)
    nat.extend(f"-X {c}\n" for c in deleted)
    nat.append(nat_tail(ctx))
    filt.append(filter_tail(ctx))
    filter_text = "".join(filt)
    nat_text = "".join(nat)
    text = "".join(("*filter\n", f_chains, filter_text, "COMMIT\n*nat\n", *decls, nat_text, "COMMIT\n"))
    return RenderResult(
        text=text, full=full, large_cluster=large_cluster, written_ports=written,
        deleted_chains=tuple(deleted), filter_rules=filter_text.count("\n"),
        nat_rules=nat_text.count("\n") - len(deleted), route_localnet=ctx.localhost_nodeports,
    )


def _context(config: IptablesConfig, family: IPFamily | None) -> FamilyContext:
    return family_context(config if family is None else config.for_family(family))


def render_full(
    snapshot: Snapshot,
    config: IptablesConfig,
    family: IPFamily | None = None,
    *,
    existing_chains: Collection[str] = (),
) -> str:
    """Render everything kube-proxy's iptables proxier writes for ``snapshot`` on a full sync.

    Args:
        snapshot: the node's state.
        config: the proxier's settings.
        family: the family to render; None renders ``config.family``.
        existing_chains: the nat chains the kernel already has (``iptables-save -t nat``);
            stale per-service chains among them are flushed and deleted, as kube-proxy does.

    Returns:
        ``iptables-restore --noflush`` input for the filter and nat tables.
    """
    ctx = _context(config, family)
    ports = family_ports(snapshot, ctx.config.family)
    large = is_large_cluster(ports, ctx.config.large_cluster_threshold)
    stale: list[str] = []
    if existing_chains:
        active = {c for info in ports for c in port_chain_names(info)}
        stale = sorted(c for c in existing_chains if is_service_chain_name(c) and c not in active)
    items = ((port_rules(info, ctx, large_cluster=large), True) for info in ports)
    return assemble(ctx, items, full=True, deleted=stale, large_cluster=large).text


def changed_services(previous: Snapshot, snapshot: Snapshot, family: IPFamily) -> set[NamespacedName]:
    """Services whose chains a partial sync rewrites: those in ``snapshot.changed`` and those
    with a port added or removed in ``family`` since ``previous``."""
    out = {spn.service for spn in snapshot.changed}
    before = {k for k in previous.ports if k[0] is family}
    after = {k for k in snapshot.ports if k[0] is family}
    out.update(k[1].service for k in before ^ after)
    return out


def render_partial(
    previous: Snapshot,
    snapshot: Snapshot,
    config: IptablesConfig,
    family: IPFamily | None = None,
) -> str:
    """Render a partial sync from ``previous`` (already applied) to ``snapshot``.

    The top-level chains are rewritten whole; only the Services in :func:`changed_services`
    get their chains rewritten, and their chains that no longer exist are deleted. Applied
    with ``iptables-restore --noflush`` over ``previous``'s rules, the result equals a full
    render of ``snapshot``. When large-cluster mode flips between the two snapshots every
    chain is rewritten (kube-proxy leaves the old ones, with or without comments, until its
    next full sync; the packets see no difference either way).

    Args:
        previous: the snapshot whose rules the kernel holds.
        snapshot: the new snapshot; its ``changed`` names the changed ServicePortNames.
        config: the proxier's settings (unchanged since ``previous``; else sync fully).
        family: the family to render; None renders ``config.family``.
    """
    ctx = _context(config, family)
    fam = ctx.config.family
    ports = family_ports(snapshot, fam)
    threshold = ctx.config.large_cluster_threshold
    large = is_large_cluster(ports, threshold)
    old_ports = previous.family(fam)
    rewrite_all = large != is_large_cluster(old_ports.values(), threshold)
    changed = changed_services(previous, snapshot, fam)
    old_chains = {c for spn, info in old_ports.items() if rewrite_all or spn.service in changed
                  for c in port_chain_names(info)}

    writes = [rewrite_all or info.name.service in changed for info in ports]
    items = [(port_rules(info, ctx, large_cluster=large, chains=w), w)
             for info, w in zip(ports, writes, strict=True)]
    new_chains = {c for r, _ in items for c in r.chains}
    return assemble(ctx, items, full=False, deleted=sorted(old_chains - new_chains), large_cluster=large).text
