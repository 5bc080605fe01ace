"""The ipvs mode as a sync-engine consumer: render, then program an emulated node as kube-proxy does.

Theory of operation
-------------------
:class:`IpvsMode` is what the sync engine calls with each Snapshot (``await mode.apply(snapshot)``).
Each sync follows kube-proxy's ``syncProxyRules`` (``pkg/proxy/ipvs/proxier.go``):

1. render (:func:`kproxy.modes.ipvs.render`);
2. compute the new netfilter ruleset (ensure the chains and the jump rules, then
   ``iptables-restore --noflush --counters`` of the text) without touching the node, so a
   refused restore changes nothing (:class:`~kproxy.errors.KernelError`);
3. make the ipsets hold exactly the rendered entries (``ensureIPSet`` + ``syncIPSetEntries``);
4. sync the IPVS table, one virtual server after the other (``syncService``: add, or edit when
   it differs; ``syncEndpoint``: add the wanted real servers at weight 1, in address order,
   moving one back out of the termination list first; hand the unwanted ones to
   :class:`~kproxy.modes.ipvs.GracefulTermination`; on the first sync reset weights to 1), then
   delete every virtual server not wanted (``cleanLegacyService``, at once);
5. bind exactly the rendered addresses to ``kube-ipvs0``; swap the ruleset in.

Graceful termination's one-minute ticker runs from :meth:`IpvsMode.tick` (and at each apply);
time is the node's clock.
"""

from __future__ import annotations

from emulation.errors import EmulationError
from emulation.ipset import load_save
from emulation.ipvs import IpvsError, IpvsTable, ServiceKey
from emulation.netfilter import apply_restore
from kproxy.errors import InvalidArgument, KernelError
from kproxy.kernel.emulated import ensure_jumps
from kproxy.kernel.ipvs_node import IpvsNode
from kproxy.model.snapshot import Snapshot
from kproxy.modes.ipvs import (
    JUMP_RULES,
    GracefulTermination,
    IpvsConfig,
    IpvsRender,
    VirtualServer,
    dest_spec_of,
    format_ipset_restore,
    render,
    spec_of,
)
from kproxy.modes.ipvs.graceful import ListedServer

__all__ = ["IpvsMode", "sync_table"]


def _sync_dests(table: IpvsTable, key: ServiceKey, vs: VirtualServer, graceful: GracefulTermination,
                now: float, initial: bool) -> None:
    svc = table.service(key)
    current = {d.spec.key: d for d in svc.dests}
    wanted = [dest_spec_of(rs) for rs in vs.real_servers]
    for spec in wanted:
        if spec.key in current:
            if initial and any(d.weight != spec.weight for d in svc.dests):
                table.edit_dest(key, spec)
            if not graceful.in_list(key, spec.key):
                continue
            graceful.move_out(key, spec.key, now)
        table.add_dest(key, spec)
    keys = {s.key for s in wanted}
    for dest_key in current:
        if dest_key not in keys and not graceful.in_list(key, dest_key):
            graceful.delete(key, dest_key, now)


def sync_table(table: IpvsTable, servers: tuple[VirtualServer, ...], graceful: GracefulTermination,
               now: float,
               *, initial: bool = False) -> None:
    """Make ``table`` hold ``servers`` as kube-proxy's ``syncService``/``syncEndpoint``/
    ``cleanLegacyService`` would (see the module docstring).

    Raises:
        KernelError: the table refused an operation (a bug in the render).
    """
    try:
        wanted: set[ServiceKey] = set()
        for vs in servers:
            spec = spec_of(vs)
            wanted.add(spec.key)
            try:
                existing = table.service(spec.key)
            except IpvsError:
                table.add_service(spec)
            else:
                if existing.spec != spec:
                    table.edit_service(spec)
            _sync_dests(table, spec.key, vs, graceful, now, initial)
        for svc in table.services():
            if svc.spec.key not in wanted:
                table.del_service(svc.spec.key, now)
    except IpvsError as err:
        raise KernelError(f"the IPVS table refused an operation: {err}") from err


class IpvsMode:
    """Keep one family's IPVS, ipset and iptables state of an emulated node in sync with snapshots.

    Args:
        config: the proxier's settings (its family must be the node's).
        node: the emulated node.

    Raises:
        InvalidArgument: the families differ.
    """

    def __init__(self, config: IpvsConfig, node: IpvsNode) -> None:
        if node.netns.ruleset.version != (6 if config.ipv6 else 4):
            raise InvalidArgument(f"config renders {config.family} but the node holds "
                                  f"IPv{node.netns.ruleset.version} rules; use config.for_family(...)")
        self.config = config
        self.node = node
        self.graceful = GracefulTermination(node.ipvs)
        self.initial_sync = True
        self.last: IpvsRender | None = None
        """The last render applied."""

    def tick(self) -> list[ListedServer]:
        """Run the graceful-termination ticker up to the node's clock; returns the servers deleted."""
        return self.graceful.run_due(self.node.clock.now())

    async def apply(self, snapshot: Snapshot) -> None:
        """Program ``snapshot`` (see the module docstring).

        Raises:
            KernelError: the rules did not restore; nothing changed.
        """
        self.load(render(snapshot, self.config))

    def load(self, rendered: IpvsRender) -> None:
        """Program an already rendered state (the synchronous core of :meth:`apply`).

        Raises:
            KernelError: the rules did not restore; nothing changed.
        """
        node, now = self.node, self.node.clock.now()
        node.ipvs.advance(now)
        self.tick()
        try:
            rules = apply_restore(ensure_jumps(node.netns.ruleset, JUMP_RULES), rendered.iptables,
                                  noflush=True, counters=True)
        except EmulationError as err:
            raise KernelError(f"iptables-restore of the ipvs mode's rules failed: {err}") from err
        try:
            load_save(format_ipset_restore(rendered.state), node.ipsets, exist=True)
        except EmulationError as err:
            raise KernelError(f"ipset restore of the ipvs mode's sets failed: {err}") from err
        sync_table(node.ipvs, rendered.state.virtual_servers, self.graceful, now, initial=self.initial_sync)
        node.netns.ruleset = rules
        node.bind(rendered.state.bound_addresses)
        self.initial_sync = False
        self.last = rendered
