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

from kproxy.errors import InvalidArgument
from kproxy.model.names import IPFamily, NamespacedName
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


@dataclass(slots=True)
class _Pending:
    result: RenderResult
    snapshot: Snapshot
    storage: _Storage
    stale: dict[str, float] = field(default_factory=dict)


def _order(info: ServicePortInfo) -> tuple[str, str, str, str]:
    spn = info.name
    return (spn.namespace, spn.name, spn.port, spn.protocol.value)


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

    def _changed(self, applied: Snapshot, snapshot: Snapshot) -> frozenset[NamespacedName]:
        if snapshot.revision == applied.revision + 1:
            return frozenset(spn.service for spn in snapshot.changed)
        old, new = applied.ports, snapshot.ports
        return frozenset(k[1].service for k in old.keys() | new.keys()
                         if old.get(k) is not new.get(k) and old.get(k) != new.get(k))

    def render(self, snapshot: Snapshot, *, existing_chains: Collection[str] = (),
               existing_sets: Collection[str] = (), now_s: float = 0.0,
               full: bool | None = None) -> RenderResult:
        """Render ``snapshot``; nothing is remembered until :meth:`commit`.

        Args:
            snapshot: the state to program.
            existing_chains: the chains of the family's ``kube-proxy`` table in the kernel now.
            existing_sets: its sets (for stale affinity sets).
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
        cleanup = Transaction(self._ctx.ip)
        deleted = tuple(sorted(c for c, at in stale.items() if at < now_s - STALE_CHAIN_AGE_S))
        for chain in deleted:
            cleanup.op("delete", "chain", chain)
            del stale[chain]
        tx = Transaction(self._ctx.ip)
        storage: _Storage = {name: ({} if full else dict(held)) for name, held in self._storage.items()}
        if full:
            setup(tx, self._ctx, first=self._first)
        changed = frozenset() if full or applied is None else self._changed(applied, snapshot)
        ports = sorted((info for (fam, _), info in snapshot.ports.items() if fam is self._family), key=_order)
        active: set[str] = set()
        active_sets: set[str] = set()
        leftover = {name: set(held) for name, held in storage.items()}
        written = 0
        for info in ports:
            plan = self._plan(info)
            rewrite = full or info.name.service in changed
            active.update(plan.chains)
            active_sets.update(plan.affinity_sets)
            if rewrite:
                written += 1
                for chain in plan.chains:
                    tx.ensure_chain(chain)
            for el in plan.elements:
                held = storage[el.container]
                old = held.get(el.key)
                if old is None:
                    tx.element("add", el.container, el.key, el.value, el.comment)
                    held[el.key] = el.value
                else:
                    if old != el.value:
                        tx.element("delete", el.container, el.key)
                        tx.element("add", el.container, el.key, el.value, el.comment)
                        held[el.key] = el.value
                    leftover[el.container].discard(el.key)
            if rewrite:
                for kind, name, text in plan.body:
                    if kind == "set":
                        tx.op("add", "set", name, text)
                    else:
                        rule, _, comment = text.partition(' comment "')
                        tx.rule(name, rule, comment[:-1] if comment else "")
        for chain in sorted(set(existing_chains) - set(deleted)):
            if not is_service_chain_name(chain):
                continue
            if chain in active:
                stale.pop(chain, None)
            else:
                tx.op("flush", "chain", chain)
                stale[chain] = now_s
        for name in sorted(existing_sets):
            if is_affinity_set_name(name) and name not in active_sets:
                tx.op("delete", "set", name)
        for _, name in ELEMENT_CONTAINERS:
            for key in sorted(leftover[name]):
                tx.element("delete", name, key)
                del storage[name][key]
        result = RenderResult(full=full, text=tx.text(), cleanup=cleanup.text(), operations=len(tx),
                              written_ports=written, stale_chains=frozenset(stale), deleted_chains=deleted)
        self._pending = _Pending(result, snapshot, storage, stale)
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
        self._storage = pending.storage
        self._stale = pending.stale
        self._pending = None
        self._needs_full = False
        if result.full:
            self._first = False
        live = {id(info) for info in pending.snapshot.ports.values()}
        self._plans = {i: p for i, p in self._plans.items() if i in live}


def render_transaction(snapshot: Snapshot, config: NftablesConfig) -> str:
    """The full-sync transaction of ``snapshot`` for ``config.family`` (``kproxy render``).

    Returns:
        ``nft -f`` input in the ``add`` form, every chain added before a rule names it; the
        first-sync add-and-delete of the base chains is included, as a fresh kube-proxy writes it.
    """
    return NftablesRenderer(config).render(snapshot, full=True).text
