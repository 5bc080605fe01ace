"""The ipvs mode as a sync-engine consumer: render, then program a kernel as kube-proxy does.

Theory of operation
-------------------
:class:`IpvsMode` is what the sync engine calls with each Snapshot (``await mode.apply(snapshot)``).
Each sync follows kube-proxy's ``syncProxyRules`` (``pkg/proxy/ipvs/proxier.go``), through the
narrow :class:`~kproxy.kernel.ipvs.IpvsKernel`:

1. render (:func:`kproxy.modes.ipvs.render`);
2. make the ipsets hold exactly the rendered entries (``ensureIPSet`` + ``syncIPSetEntries``;
   the rules below match on them, so they come first);
3. ensure the jump chains and rules (``EnsureChain`` + ``EnsureRule(Prepend)``), then
   ``iptables-restore --noflush --counters`` of the text; a refused restore changes no rule
   and stops the sync before IPVS is touched (:class:`~kproxy.errors.KernelError`);
4. sync the IPVS table, one virtual server after the other (``syncService``: add, or edit when
   it differs; ``syncEndpoint``: add the wanted real servers at weight 1, in address order,
   moving one back out of the termination list first; hand the unwanted ones to
   :class:`~kproxy.modes.ipvs.GracefulTermination`; on the first sync reset weights to 1), then
   delete every virtual server not wanted (``cleanLegacyService``, at once);
5. bind exactly the rendered addresses to ``kube-ipvs0``.

Graceful termination's one-minute ticker runs from :meth:`IpvsMode.tick` (and at each apply).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from kproxy.errors import InvalidArgument
from kproxy.kernel.emulated import run_now
from kproxy.kernel.ipvs import EmulatedIpvs, IpvsKernel
from kproxy.kernel.ipvs_node import IpvsNode
from kproxy.model.snapshot import Snapshot
from kproxy.modes.iptables.mode import ensure_jumps
from kproxy.modes.ipvs.config import IpvsConfig
from kproxy.modes.ipvs.graceful import GracefulTermination, ListedServer
from kproxy.modes.ipvs.names import JUMP_RULES
from kproxy.modes.ipvs.state import VirtualServer
from kproxy.modes.ipvs.text import IpvsRender, dest_spec_of, format_ipset_restore, render, spec_of

__all__ = ["IpvsMode", "sync_table"]

_log = structlog.get_logger("kproxy.ipvs")


def _sync_dests(kernel: IpvsKernel, vs: VirtualServer, graceful: GracefulTermination,
                now: float, initial: bool) -> None:
    key = spec_of(vs).key
    svc = kernel.virtual_server(key)
    current = {d.key: d for d in svc.real_servers} if svc is not None else {}
    wanted = [dest_spec_of(rs) for rs in vs.real_servers]
    for spec in wanted:
        if spec.key in current:
            if initial and any(d.spec.weight != spec.weight for d in current.values()):
                kernel.update_real_server(key, spec)
            if not graceful.in_list(key, spec.key):
                continue
            graceful.move_out(key, spec.key, now)
        kernel.add_real_server(key, spec)
    keys = {s.key for s in wanted}
    for dest_key in current:
        if dest_key not in keys and not graceful.in_list(key, dest_key):
            graceful.delete(key, dest_key, now)


def sync_table(kernel: IpvsKernel, servers: tuple[VirtualServer, ...], graceful: GracefulTermination,
               now: float, *, initial: bool = False) -> None:
    """Make ``kernel`` hold ``servers`` as kube-proxy's ``syncService``/``syncEndpoint``/
    ``cleanLegacyService`` would (see the module docstring).

    Raises:
        KernelError: the kernel refused an operation (a bug in the render).
    """
    wanted = set()
    for vs in servers:
        spec = spec_of(vs)
        wanted.add(spec.key)
        existing = kernel.virtual_server(spec.key)
        if existing is None:
            kernel.add_virtual_server(spec)
        elif existing.spec != spec:
            kernel.update_virtual_server(spec)
        _sync_dests(kernel, vs, graceful, now, initial)
    for svc in kernel.virtual_servers():
        if svc.spec.key not in wanted:
            kernel.delete_virtual_server(svc.spec.key)


class IpvsMode:
    """Keep one family's IPVS, ipset and iptables state of a node in sync with snapshots.

    Args:
        config: the proxier's settings (its family must be the kernel's).
        kernel: the IPVS kernel (:class:`~kproxy.kernel.EmulatedIpvs`, or any
            :class:`~kproxy.kernel.IpvsKernel`).
        now: the clock, in seconds, for the termination list's ticker.

    Raises:
        InvalidArgument: the families differ.
    """

    def __init__(self, config: IpvsConfig, kernel: IpvsKernel, *, now: Callable[[], float]) -> None:
        if kernel.family is not config.family:
            raise InvalidArgument(f"config renders {config.family} but the kernel is {kernel.family}; "
                                  "use config.for_family(...)")
        self.config = config
        self.kernel = kernel
        self._now = now
        self.graceful = GracefulTermination(kernel)
        self.initial_sync = True
        self.last: IpvsRender | None = None
        """The last render applied."""

    @classmethod
    def emulated(cls, config: IpvsConfig, node: IpvsNode) -> IpvsMode:
        """The mode over an emulated node (:class:`~kproxy.kernel.EmulatedIpvs`, the node's clock).

        Raises:
            InvalidArgument: the families differ.
        """
        return cls(config, EmulatedIpvs(node), now=node.clock.now)

    def tick(self) -> list[ListedServer]:
        """Run the graceful-termination ticker up to now; returns the servers deleted."""
        return self.graceful.run_due(self._now())

    async def apply(self, snapshot: Snapshot) -> None:
        """Program ``snapshot`` (see the module docstring).

        Raises:
            KernelError: a step was refused (the iptables restore itself changed nothing).
        """
        await self.program(render(snapshot, self.config))

    async def program(self, rendered: IpvsRender) -> None:
        """Program an already rendered state, in the order of the module docstring.

        Raises:
            KernelError: a step was refused (the iptables restore itself changed nothing).
        """
        kernel, now = self.kernel, self._now()
        self.tick()
        kernel.restore_ipsets(format_ipset_restore(rendered.state))
        await ensure_jumps(kernel.netfilter, JUMP_RULES)
        await kernel.netfilter.restore(rendered.iptables, noflush=True, counters=True)
        sync_table(kernel, rendered.state.virtual_servers, self.graceful, now, initial=self.initial_sync)
        kernel.bind_addresses(rendered.state.bound_addresses)
        self.initial_sync = False
        self.last = rendered
        _log.debug("ipvs synced", family=str(self.config.family),
                   virtual_servers=len(rendered.state.virtual_servers),
                   bound_addresses=len(rendered.state.bound_addresses),
                   terminating=len(self.graceful.listed))

    def load(self, rendered: IpvsRender) -> None:
        """:meth:`program` synchronously, on a kernel that never waits (an emulated one).

        Raises:
            KernelError: see :meth:`program`.
        """
        run_now(self.program(rendered))
