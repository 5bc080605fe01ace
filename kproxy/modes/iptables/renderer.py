"""A stateful renderer for the sync loop: full syncs, partial syncs, and what to remember.

Theory of operation
-------------------
kube-proxy syncs fully at start, after any failed restore, when asked (node labels changed,
the canary chain vanished) and periodically (``FullSyncPeriod``); otherwise it writes only the
chains of the Services that changed (KEP-3453). :class:`IptablesRenderer` keeps that policy's
state but leaves the timing to the caller:

1. :meth:`~IptablesRenderer.render` returns a :class:`RenderResult`; it is full when
   :attr:`~IptablesRenderer.needs_full` is set or ``full=True`` is passed, partial otherwise.
2. The caller applies ``result.text`` with ``iptables-restore --noflush`` (and, for a full
   result, ensures :data:`JUMP_RULES`), then calls :meth:`~IptablesRenderer.commit` on
   success or :meth:`~IptablesRenderer.failed` on failure, which forces the next sync full.

The renderer remembers, per port, the chains the kernel holds after the last commit, so a
partial render deletes exactly the stale ones (kube-proxy asks ``iptables-save`` instead).

Speed: a partial render of 10,000 ports must not rebuild 10,000 ports' text. Each port's
rendered text is memoised by the identity of its ServicePortInfo (the change tracker reuses
the objects of unchanged Services), and the changed Services come from ``snapshot.changed``
when the snapshot directly follows the committed one; otherwise every port is compared.
Dataclass keys are hashed as little as possible: they rehash their fields on every lookup.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from kproxy.errors import InvalidArgument
from kproxy.model.names import IPFamily, ServicePortName
from kproxy.model.snapshot import ServicePortInfo, Snapshot
from kproxy.modes.iptables.config import FamilyContext, IptablesConfig, family_context
from kproxy.modes.iptables.names import is_service_chain_name
from kproxy.modes.iptables.service import PortRules, port_rules
from kproxy.modes.iptables.writer import RenderResult, assemble

__all__ = ["IptablesRenderer"]

_Key = tuple[IPFamily, ServicePortName]


@dataclass(frozen=True, slots=True)
class _Entry:
    info: ServicePortInfo
    order: str
    large: bool
    rules: PortRules


@dataclass(frozen=True, slots=True)
class _Pending:
    result: RenderResult
    snapshot: Snapshot
    chains: dict[_Key, tuple[str, ...]]
    rewritten: set[_Key]


def _order(spn: ServicePortName) -> str:
    # NUL sorts first and appears in no name, so this sorts like the field tuple.
    return f"{spn.namespace}\0{spn.name}\0{spn.port}\0{spn.protocol.value}"


class IptablesRenderer:
    """Render successive snapshots of one IP family as kube-proxy's sync loop would.

    Args:
        config: the proxier's settings.
        family: the family rendered; None means ``config.family``.
    """

    def __init__(self, config: IptablesConfig, family: IPFamily | None = None) -> None:
        cfg = config if family is None else config.for_family(family)
        self._ctx: FamilyContext = family_context(cfg)
        self._family = cfg.family
        self._needs_full = True
        self._applied: Snapshot | None = None
        self._chains: dict[_Key, tuple[str, ...]] = {}
        self._pending: _Pending | None = None
        self._cache: dict[int, _Entry] = {}
        # (namespace, name) -> the Service's committed port keys, to find a changed Service's
        # other ports without scanning every key.
        self._by_service: dict[tuple[str, str], set[_Key]] = {}

    @property
    def config(self) -> IptablesConfig:
        """The settings, resolved to the rendered family."""
        return self._ctx.config

    @property
    def needs_full(self) -> bool:
        """The next render will be full (start, a failure, or :meth:`request_full`)."""
        return self._needs_full

    @property
    def applied(self) -> Snapshot | None:
        """The snapshot of the last committed render, or None."""
        return self._applied

    @property
    def active_chains(self) -> frozenset[str]:
        """The per-service nat chains the kernel holds after the last commit."""
        return frozenset(c for chains in self._chains.values() for c in chains)

    def request_full(self) -> None:
        """Make the next render full (periodic resync, node labels changed, rules lost)."""
        self._needs_full = True

    def failed(self) -> None:
        """The last render could not be applied: forget it and sync fully next time."""
        self._pending = None
        self._needs_full = True

    def render(
        self, snapshot: Snapshot, *, full: bool | None = None, existing_chains: Collection[str] = ()
    ) -> RenderResult:
        """Render ``snapshot``; nothing is remembered until :meth:`commit`.

        Args:
            snapshot: the state to program.
            full: force a full (True) or partial (False) render; None follows
                :attr:`needs_full`. A partial render needs a committed render before it.
            existing_chains: nat chains known to exist in the kernel besides those the
                renderer wrote (``iptables-save -t nat``); stale service chains among them
                are deleted on a full render.

        Raises:
            InvalidArgument: ``full=False`` with nothing committed yet.
        """
        applied = self._applied
        if full is None:
            full = self._needs_full or applied is None
        if not full and applied is None:
            raise InvalidArgument("a partial render needs a committed render first; pass full=True or None")
        fam = self._family
        ports = [(key, info) for key, info in snapshot.ports.items() if key[0] is fam]
        large = sum(len(info.endpoints) for _, info in ports) > self._ctx.config.large_cluster_threshold
        if full or applied is None:
            rewrite = {key for key, _ in ports} | set(self._chains)
        else:
            rewrite = self._rewrite(applied, snapshot, large)
        entries = sorted((self._entry(info, large) for _, info in ports), key=lambda e: e.order)
        written = {id(snapshot.ports[k]) for k in rewrite if k in snapshot.ports}
        chains = dict(self._chains)
        old = {c for k in rewrite for c in self._chains.get(k, ())}
        for key in rewrite:
            chains.pop(key, None)
        new: set[str] = set()
        for key in rewrite:
            info = snapshot.ports.get(key)
            if info is not None:
                chains[key] = own = self._entry(info, large).rules.chains
                new.update(own)
        stale = old - new
        if full:
            stale.update(c for c in existing_chains if is_service_chain_name(c) and c not in new)
        items = ((e.rules, id(e.info) in written) for e in entries)
        result = assemble(self._ctx, items, full=full, deleted=sorted(stale), large_cluster=large)
        self._pending = _Pending(result, snapshot, chains, rewrite)
        return result

    def commit(self, result: RenderResult) -> None:
        """``result`` (the last render) was applied: remember its state.

        Raises:
            InvalidArgument: ``result`` is not the last render, or was already committed.
        """
        pending = self._pending
        if pending is None or pending.result is not result:
            raise InvalidArgument("commit() expects the RenderResult of the latest render()")
        self._applied = pending.snapshot
        self._chains = pending.chains
        by_service = self._by_service
        if pending.result.full:
            by_service.clear()
        for key in pending.rewritten:
            spn = key[1]
            keys = by_service.setdefault((spn.namespace, spn.name), set())
            if key in pending.snapshot.ports:
                keys.add(key)
            else:
                keys.discard(key)
        self._pending = None
        self._needs_full = False
        live = {id(info) for info in pending.snapshot.ports.values()}
        self._cache = {i: e for i, e in self._cache.items() if i in live}

    def _entry(self, info: ServicePortInfo, large: bool) -> _Entry:
        entry = self._cache.get(id(info))
        if entry is None or entry.info is not info or entry.large != large:
            rules = port_rules(info, self._ctx, large_cluster=large)
            entry = self._cache[id(info)] = _Entry(info, _order(info.name), large, rules)
        return entry

    def _rewrite(self, applied: Snapshot, snapshot: Snapshot, large: bool) -> set[_Key]:
        """The keys whose chains a partial render rewrites (current and removed ones)."""
        fam = self._family
        old_total = sum(len(info.endpoints) for key, info in applied.ports.items() if key[0] is fam)
        if large != (old_total > self._ctx.config.large_cluster_threshold):
            return {key for key in snapshot.ports if key[0] is fam} | set(self._chains)
        if snapshot.revision == applied.revision + 1:
            names = snapshot.changed
        else:
            old, new = applied.ports, snapshot.ports
            names = frozenset(k[1] for k in old.keys() | new.keys()
                              if old.get(k) is not new.get(k) and old.get(k) != new.get(k))
        out = {(fam, spn) for spn in names}
        for spn in names:
            out.update(self._by_service.get((spn.namespace, spn.name), ()))
        return out
