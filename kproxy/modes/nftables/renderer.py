"""A stateful renderer for the sync loop: full and partial nftables transactions, as kube-proxy's.

Theory of operation
-------------------
kube-proxy's nftables ``syncProxyRules`` (``pkg/proxy/nftables/proxier.go``) syncs fully at
start, after a failed transaction and when asked (node labels changed; the caller also asks
periodically). A full sync rewrites the fixed part (:func:`~kproxy.modes.nftables.transaction.setup`),
flushes the six element containers and writes every Service. Otherwise it is partial:

- the chains of a Service whose Service or endpoints changed are added, flushed and refilled;
  the chains of an unchanged Service are left alone (but count as active);
- the elements of every port are recomputed and only the differences sent
  (``nftElementStorage``: a new key is added, a changed verdict deleted and re-added, a key no
  longer produced deleted);
- a per-service chain the kernel holds but no port uses is flushed now and deleted by a later
  sync that starts more than one second after the sync that last flushed it (kernels before
  6.2 notice a chain became unreferenced by a deleted map element only a little later); a stale
  affinity set is deleted at once.

:meth:`NftablesRenderer.render` is pure with respect to the kernel: the caller passes what the
kernel holds (its per-service chains and sets, from ``nft list table``) and the clock. The
result has two transactions: ``cleanup`` (the stale chains old enough to delete, run first and
separately, as kube-proxy does) and ``text``. :meth:`~NftablesRenderer.commit` or
:meth:`~NftablesRenderer.failed` follows, as with the iptables renderer.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TypeVar

from kproxy.errors import InvalidArgument
from kproxy.model.names import IPFamily, ServicePortName
from kproxy.model.snapshot import ServicePortInfo, Snapshot
from kproxy.modes.nftables.config import FamilyContext, NftablesConfig, family_context
from kproxy.modes.nftables.names import is_affinity_set_name, is_service_chain_name
from kproxy.modes.nftables.service import PortPlan, port_plan
from kproxy.modes.nftables.transaction import ELEMENT_CONTAINERS, Transaction, setup

__all__ = ["STALE_CHAIN_AGE_S", "NftablesRenderer", "RenderResult", "render_transaction"]

#: How long (seconds) a flushed stale chain waits before it is deleted (kube-proxy: one second).
STALE_CHAIN_AGE_S = 1.0

_Storage = dict[str, dict[str, str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderResult:
    """One rendered sync.

    Attributes:
        full: a full sync.
        text: the transaction for ``nft -f`` (``""`` when nothing changed).
        cleanup: the transaction deleting stale chains, run before ``text`` (``""``: none).
        operations: how many operations ``text`` holds (knftables' ``NumOperations``).
        written_ports: how many ports had their chains rewritten.
        stale_chains: per-service chains flushed and waiting to be deleted after this sync.
        deleted_chains: the chains ``cleanup`` deletes.
    """

    full: bool
    text: str
    cleanup: str = ""
    operations: int = 0
    written_ports: int = 0
    stale_chains: frozenset[str] = frozenset()
    deleted_chains: tuple[str, ...] = ()


_Ref = tuple[str, str]  # (container, key) of one element
_Key = tuple[IPFamily, ServicePortName]
_Work = tuple[_Key, int, "PortPlan | None", "PortPlan | None"]


@dataclass(slots=True)
class _Pending:
    """What a render changes, applied to the renderer only by :meth:`NftablesRenderer.commit`."""

    result: RenderResult
    snapshot: Snapshot
    ports: dict[int, tuple[_Key, ServicePortInfo, PortPlan] | None] = field(default_factory=dict)
    values: dict[_Ref, str | None] = field(default_factory=dict)
    owners: dict[_Ref, int] = field(default_factory=dict)
    chains: dict[str, int] = field(default_factory=dict)
    sets: dict[str, int] = field(default_factory=dict)
    stale: dict[str, float] = field(default_factory=dict)


_T = TypeVar("_T")


def _merge_counts(table: dict[_T, int], updates: dict[_T, int]) -> None:
    for name, n in updates.items():
        if n > 0:
            table[name] = n
        else:
            table.pop(name, None)


def _order(key: _Key) -> tuple[str, str, str, str]:
    spn = key[1]
    return (spn.namespace, spn.name, spn.port, spn.protocol.value)


class _Sync:
    """One render's bookkeeping over the committed state (reference counts of elements, chains and
    affinity sets owned by ports), so a partial render touches only the ports that changed."""

    def __init__(self, r: NftablesRenderer, tx: Transaction, pending: _Pending) -> None:
        self.r, self.tx, self.p = r, tx, pending

    def _count(self, table: dict[str, int], committed: dict[str, int], name: str, delta: int) -> None:
        table[name] = table.get(name, committed.get(name, 0)) + delta

    def present(self, ref: _Ref) -> bool:
        if ref in self.p.values:
            return self.p.values[ref] is not None
        return ref[1] in self.r._storage[ref[0]]

    def value(self, ref: _Ref) -> str | None:
        if ref in self.p.values:
            return self.p.values[ref]
        return self.r._storage[ref[0]].get(ref[1])

    def drop(self, plan: PortPlan) -> None:
        """The port's previous plan no longer holds its elements, chains and sets."""
        for el in plan.elements:
            ref = (el.container, el.key)
            self.p.owners[ref] = self.p.owners.get(ref, self.r._owners.get(ref, 0)) - 1
        for chain in plan.chains:
            self._count(self.p.chains, self.r._chains, chain, -1)
        for name in plan.affinity_sets:
            self._count(self.p.sets, self.r._sets, name, -1)

    def write(self, plan: PortPlan, rewrite: bool) -> None:
        """Hold the port's elements, chains and sets; when ``rewrite``, write its chains and their
        head (the tail follows in :meth:`write_tail`, after every port's head)."""
        tx = self.tx
        chains, committed = self.p.chains, self.r._chains
        for chain in plan.chains:
            chains[chain] = chains.get(chain, committed.get(chain, 0)) + 1
            if rewrite:
                tx.ensure_chain(chain)
        for name in plan.affinity_sets:
            self._count(self.p.sets, self.r._sets, name, +1)
        owners, committed_owners, values = self.p.owners, self.r._owners, self.p.values
        for el in plan.elements:
            ref = (el.container, el.key)
            owners[ref] = owners.get(ref, committed_owners.get(ref, 0)) + 1
            old = self.value(ref)
            if old is None:
                tx.element("add", el.container, el.key, el.value, el.comment)
            elif old != el.value:
                tx.element("delete", el.container, el.key)
                tx.element("add", el.container, el.key, el.value, el.comment)
            values[ref] = el.value
        if rewrite:
            tx.lines.extend(plan.head)

    def write_tail(self, plan: PortPlan) -> None:
        """The rest of a rewritten port's rules."""
        self.tx.tail.extend(plan.tail)

    def finish(self, existing_chains: Collection[str] | None, existing_sets: Collection[str] | None,
               deleted: tuple[str, ...], now_s: float) -> None:
        """Flush stale chains, delete stale affinity sets and elements no port holds."""
        p, tx = self.p, self.tx
        stale = p.stale
        active = {c for c, n in p.chains.items() if n > 0}
        for chain in [c for c in stale if c in active]:
            del stale[chain]
        flush = {c for c, n in p.chains.items() if n <= 0 and self.r._chains.get(c, 0) > 0} | set(stale)
        if existing_chains is not None:
            held = {c for c, n in self.r._chains.items() if n > 0 and p.chains.get(c, 1) > 0} | active
            flush |= {c for c in set(existing_chains).difference(deleted) - held if is_service_chain_name(c)}
        for chain in sorted(flush):
            tx.op("flush", "chain", chain, tail=True)
            stale[chain] = now_s
        gone = {s for s, n in p.sets.items() if n <= 0 and self.r._sets.get(s, 0) > 0}
        if existing_sets is not None:
            live = {s for s, n in self.r._sets.items() if n > 0 and p.sets.get(s, 1) > 0}
            live |= {s for s, n in p.sets.items() if n > 0}
            gone |= {s for s in existing_sets if is_affinity_set_name(s) and s not in live}
        for name in sorted(gone):
            tx.op("delete", "set", name, tail=True)
        for _, container in ELEMENT_CONTAINERS:
            for ref in sorted(r for r, n in p.owners.items() if r[0] == container and n <= 0):
                if self.present(ref):
                    tx.element("delete", container, ref[1])
                p.values[ref] = None


class NftablesRenderer:
    """Render successive snapshots of one IP family as kube-proxy's nftables sync loop would.

    Args:
        config: the proxier's settings.
        family: the family rendered; None means ``config.family``.
    """

    def __init__(self, config: NftablesConfig, family: IPFamily | None = None) -> None:
        cfg = config if family is None else config.for_family(family)
        self._ctx: FamilyContext = family_context(cfg)
        self._family = cfg.family
        self._needs_full = True
        self._first = True
        self._applied: Snapshot | None = None
        self._storage: _Storage = {name: {} for _, name in ELEMENT_CONTAINERS}
        self._owners: dict[_Ref, int] = {}
        self._chains: dict[str, int] = {}
        self._sets: dict[str, int] = {}
        #: id(ServicePortInfo) -> (key, info, plan) of every committed port (the info held
        #: keeps its id from being reused).
        self._ports: dict[int, tuple[_Key, ServicePortInfo, PortPlan]] = {}
        #: key -> id of its committed ServicePortInfo (the index of ``_ports`` by key, kept
        #: across syncs so a partial render never rebuilds it).
        self._by_key: dict[_Key, int] = {}
        self._stale: dict[str, float] = {}
        self._pending: _Pending | None = None
        self._plans: dict[int, tuple[ServicePortInfo, PortPlan]] = {}

    @property
    def config(self) -> NftablesConfig:
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
    def stale_chains(self) -> frozenset[str]:
        """Per-service chains flushed and not yet deleted (kube-proxy's ``staleChains``)."""
        return frozenset(self._stale)

    def request_full(self) -> None:
        """Make the next render full (periodic resync, node labels changed)."""
        self._needs_full = True

    def failed(self) -> None:
        """The last render could not be applied: sync fully next time, forget the stale chains."""
        self._pending = None
        self._needs_full = True
        self._stale = {}

    def _plan(self, info: ServicePortInfo) -> PortPlan:
        held = self._plans.get(id(info))
        if held is None or held[0] is not info:
            held = self._plans[id(info)] = (info, port_plan(info, self._ctx))
        return held[1]

    def _changed(self, applied: Snapshot, snapshot: Snapshot) -> set[tuple[str, str]]:
        if snapshot.revision == applied.revision + 1:
            return {(spn.namespace, spn.name) for spn in snapshot.changed}
        old, new = applied.ports, snapshot.ports
        return {(k[1].namespace, k[1].name) for k in old.keys() | new.keys()
                if old.get(k) is not new.get(k) and old.get(k) != new.get(k)}

    def render(self, snapshot: Snapshot, *, existing_chains: Collection[str] | None = None,
               existing_sets: Collection[str] | None = None, now_s: float = 0.0,
               full: bool | None = None) -> RenderResult:
        """Render ``snapshot``; nothing is remembered until :meth:`commit`.

        Args:
            snapshot: the state to program.
            existing_chains: the chains of the family's ``kube-proxy`` table in the kernel now
                (``nft list table``), as kube-proxy lists them every sync; None trusts what this
                renderer committed (it is the table's only writer). Per-service chains among
                them that no port uses are flushed as stale.
            existing_sets: its sets, for stale affinity sets (None: as committed).
            now_s: the clock (seconds), for the age of stale chains.
            full: force a full (True) or partial (False) render; None follows :attr:`needs_full`.

        Raises:
            InvalidArgument: ``full=False`` with nothing committed yet.
        """
        applied = self._applied
        if full is None:
            full = self._needs_full or applied is None
        if not full and applied is None:
            raise InvalidArgument("a partial render needs a committed render first; pass full=True or None")
        stale = dict(self._stale)
        deleted = tuple(sorted(c for c, at in stale.items() if at < now_s - STALE_CHAIN_AGE_S))
        cleanup = Transaction(self._ctx.ip)
        for chain in deleted:
            cleanup.op("delete", "chain", chain)
            del stale[chain]
        tx = Transaction(self._ctx.ip)
        pending = _Pending(result=RenderResult(full=full, text=""), snapshot=snapshot, stale=stale)
        sync = _Sync(self, tx, pending)
        if full:
            setup(tx, self._ctx, first=self._first)
            self._reset_into(pending)
        changed = set() if full or applied is None else self._changed(applied, snapshot)
        work = self._work(snapshot, full, changed, pending)
        for _, ident, old, _new in work:
            if old is not None:
                sync.drop(old)
            pending.ports.setdefault(ident, None)
        for key, _, _, new in work:
            if new is not None:
                info = snapshot.ports[key]
                pending.ports[id(info)] = (key, info, new)
                sync.write(new, True)
        for _, _, _, new in work:
            if new is not None:
                sync.write_tail(new)
        sync.finish(existing_chains, existing_sets, deleted, now_s)
        pending.result = RenderResult(
            full=full, text=tx.text(), cleanup=cleanup.text(), operations=len(tx),
            written_ports=sum(1 for w in work if w[3] is not None), stale_chains=frozenset(stale),
            deleted_chains=deleted)
        self._pending = pending
        return pending.result

    def _work(self, snapshot: Snapshot, full: bool, changed: set[tuple[str, str]],
              pending: _Pending) -> list[_Work]:
        """``(key, id, old plan, new plan)`` of every port to drop or (re)write, in port order.

        Ports are matched by the identity of their ServicePortInfo first (the change tracker
        reuses the objects of unchanged Services, so an unchanged port costs no hashing of its
        key), then by key and equality (a snapshot built afresh); an equal port is only rebound.
        """
        fam, committed = self._family, self._ports
        work: list[_Work] = []
        seen: set[int] = set()
        by_key = self._by_key
        changed_names = {name for _, name in changed}
        for key, info in snapshot.ports.items():
            if key[0] is not fam:
                continue
            ident = id(info)
            seen.add(ident)
            held = None if full else committed.get(ident)
            if held is not None and held[1] is not info:
                held = None
            spn = key[1]
            # The name first: a str hashes once and most names are not in ``changed``.
            svc_changed = spn.name in changed_names and (spn.namespace, spn.name) in changed
            if held is None and not full:
                old_ident = by_key.get(key)
                if old_ident is not None and committed[old_ident][1] == info:
                    seen.add(old_ident)
                    held = committed[old_ident]
                    pending.ports[old_ident] = None
                    pending.ports[ident] = (key, info, held[2])
                    if svc_changed:
                        work.append((key, old_ident, held[2], held[2]))
                    continue
            if held is not None and not svc_changed:
                continue
            work.append((key, ident, held[2] if held else None, self._plan(info)))
        if not full:
            work.extend((committed[i][0], i, committed[i][2], None) for i in committed.keys() - seen)
        work.sort(key=lambda w: _order(w[0]))
        return work

    def _reset_into(self, pending: _Pending) -> None:
        """A full render starts from empty containers: every committed count goes to zero."""
        pending.owners.update((ref, 0) for ref in self._owners)
        pending.values.update((ref, None) for ref in self._owners)
        pending.chains.update((c, 0) for c in self._chains)
        pending.sets.update((s, 0) for s in self._sets)
        pending.ports.update((k, None) for k in self._ports)

    def commit(self, result: RenderResult) -> None:
        """``result`` (the last render) was applied: remember its state.

        Raises:
            InvalidArgument: ``result`` is not the last render, or was already committed.
        """
        p = self._pending
        if p is None or p.result is not result:
            raise InvalidArgument("commit() expects the RenderResult of the latest render()")
        if result.full:
            self._owners, self._chains, self._sets, self._ports, self._by_key = {}, {}, {}, {}, {}
            self._storage = {name: {} for _, name in ELEMENT_CONTAINERS}
        for (container, element), value in p.values.items():
            if value is None:
                self._storage[container].pop(element, None)
            else:
                self._storage[container][element] = value
        _merge_counts(self._owners, p.owners)
        _merge_counts(self._chains, p.chains)
        _merge_counts(self._sets, p.sets)
        for ident, held in p.ports.items():
            if held is None:
                old = self._ports.pop(ident, None)
                if old is not None and self._by_key.get(old[0]) == ident:
                    del self._by_key[old[0]]
            else:
                self._ports[ident] = held
                self._by_key[held[0]] = ident
        self._applied = p.snapshot
        self._stale = p.stale
        self._pending = None
        self._needs_full = False
        if result.full:
            self._first = False
        if result.full or len(self._plans) > 2 * len(self._ports) + 64:
            live = {id(info) for info in p.snapshot.ports.values()}
            self._plans = {i: held for i, held in self._plans.items() if i in live}


def render_transaction(snapshot: Snapshot, config: NftablesConfig) -> str:
    """The full-sync transaction of ``snapshot`` for ``config.family`` (``kproxy render``).

    Returns:
        ``nft -f`` input in the ``add`` form, every chain added before a rule names it; the
        first-sync add-and-delete of the base chains is included, as a fresh kube-proxy writes it.
    """
    return NftablesRenderer(config).render(snapshot, full=True).text
