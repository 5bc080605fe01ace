"""The ebpf mode's map contents from a Snapshot, with Cilium's agent layout rules, and the
partial-sync diff of map operations.

:class:`MapState` keeps what Cilium's BPF reconciler keeps between syncs
(``pkg/loadbalancer/reconciler/bpf_reconciler.go``): the service ids (``rev_nat_index``) and
backend ids, allocated from 1 and stable for as long as their frontend or backend lives (a
released id is not reused before the allocator wraps, as ``idAllocator``), the backend
reference counts, and the rendered entries of every frontend. :meth:`MapState.sync` takes a
Snapshot and returns the map operations that turn the previous contents into the new ones,
touching only the frontends of changed service ports; :func:`render` is the pure whole-map
rendering (a first sync into an empty state).

Per frontend, as ``updateFrontend``:

- backends sorted (active first, then by address and port); each gets a slot ``1..N`` except
  maintenance ones; ``count`` is the active backends, or the terminating ones when none is
  active (KEP-1669), and ``qcount`` the rest (terminating with active ones present, quarantined);
- the master entry (slot 0) has ``count``, ``qcount``, ``rev_nat_index``, the flags, the
  per-service algorithm in the upper 8 bits of the first word and the affinity timeout in the
  lower 24;
- a Maglev table over the first ``count`` backends where ``useMaglev`` says so (none, and the
  table deleted, with no such backend);
- affinity-match entries for the active backends of a Service with affinity;
- source-range LPM entries for the Service's ranges of the frontend's family;
- the reverse-NAT entry ``rev_nat_index -> frontend address:port``.

Backends are upserted before the slots that use them and deleted after the last slot that
used them, so the datapath never reads a dangling backend id.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from kproxy.errors import InvalidArgument
from kproxy.model import IPFamily, Protocol, ServicePortName
from kproxy.model.snapshot import ServicePortInfo, Snapshot
from kproxy.modes.ebpf.config import EbpfConfig
from kproxy.modes.ebpf.frontends import BackendPlan, FrontendPlan, plan_frontends
from kproxy.modes.ebpf.layout import (
    IPPROTO,
    SOURCE_RANGE_DENY,
    AffinityMatchKey,
    Backend,
    BackendState,
    MaglevOuterKey,
    ReverseNat,
    ReverseNatKey,
    Scope,
    ServiceFlag,
    ServiceFlag2,
    ServiceKey,
    ServiceValue,
    SourceRangeKey,
    backend_key,
    maglev_inner_pack,
)
from kproxy.modes.ebpf.maglev import MaglevBackend, backend_hash_string, lookup_table

__all__ = ["EbpfMaps", "MapOp", "MapState", "OpKind", "RenderedFrontend", "render", "slot_layout"]

#: ``firstFreeServiceID``/``maxSetOfServiceID`` and the backend twins (``id_allocator.go``).
_MAX_SERVICE_ID = 0xFFFF
_MAX_BACKEND_ID = 0xFFFFFFFF
_AFFINITY_MATCH = "cilium_lb_affinity_match"
#: Where ``backend_slot`` (host-order ``__u16``) sits in ``lb4_key``/``lb6_key``, and the
#: host-order words of a slot value's first field.
_SLOT_AT = {"4": 6, "6": 18}
_ACTIVE, _TERMINATING = BackendState.ACTIVE, BackendState.TERMINATING
_QUARANTINED, _MAINTENANCE = BackendState.QUARANTINED, BackendState.MAINTENANCE
_U16 = struct.Struct("=H")
_U32 = struct.Struct("=I")
_ZERO = b"\0"


class OpKind(StrEnum):
    """A map operation: ``BPF_MAP_UPDATE_ELEM`` or ``BPF_MAP_DELETE_ELEM``."""

    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class MapOp:
    """One map operation.

    Attributes:
        map: the map's name (:data:`~kproxy.modes.ebpf.layout.MAP_SPECS`).
        kind: update or delete.
        key: the key's bytes.
        value: the value's bytes for an update (for a Maglev outer map, the inner map's one
            value, ``__u32[M]``), None for a delete.
    """

    map: str
    kind: OpKind
    key: bytes
    value: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderedFrontend:
    """One frontend as written to the maps.

    Attributes:
        name, family: the service port it belongs to.
        plan: its address, type, flags, backends (:class:`FrontendPlan`).
        rev_nat_index: its service id.
        master: the slot-0 value.
        slots: the backend id of slot 1..N.
        slot_states: the state of each slot's backend (a quarantined one is flagged on its slot).
        maglev: its Maglev table (empty when it has none).
        affinity_match: the backend ids with an affinity-match entry.
        packed: every ``(map, key, value)`` it owns, as bytes (:meth:`entries`), made once.
    """

    name: ServicePortName
    family: IPFamily
    plan: FrontendPlan
    rev_nat_index: int
    master: ServiceValue
    slots: tuple[int, ...]
    slot_states: tuple[BackendState, ...]
    maglev: tuple[int, ...]
    affinity_match: tuple[int, ...]
    packed: tuple[tuple[str, bytes, bytes], ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        v = "6" if self.family is IPFamily.IPv6 else "4"
        object.__setattr__(self, "packed", tuple(self.entries(v)))

    def entries(self, v: str) -> Iterator[tuple[str, bytes, bytes]]:
        """Every ``(map, key, value)`` this frontend owns (``v`` is ``4`` or ``6``): the slots,
        reverse NAT, Maglev, affinity-match and source-range entries, the master entry last (as
        ``updateFrontend`` writes it, so that ``count`` never covers a slot not yet written)."""
        p = self.plan
        proto = IPPROTO[p.protocol]
        key = ServiceKey(address=p.address, dport=p.port, proto=proto, scope=p.scope)
        # Slots carry the master's flags without the source-range bits (``slotFlagParams``):
        # bit 6 of flags2 means quarantined on a slot.
        slot_flags = self.master.flags & ~ServiceFlag.SOURCE_RANGE
        slot_flags2 = self.master.flags2 & ~SOURCE_RANGE_DENY
        if self.slots:
            # The fast path of a fill: the slot keys differ only in ``backend_slot``, so the
            # first slot is packed by the layout classes and the rest reuse its bytes.
            first_key = ServiceKey(address=p.address, dport=p.port, backend_slot=1, proto=proto,
                                   scope=p.scope).pack()
            first_value = ServiceValue(backend_id=self.slots[0], rev_nat_index=self.rev_nat_index,
                                       flags=slot_flags, flags2=slot_flags2).pack()
            head, tail = first_key[:_SLOT_AT[v]], first_key[_SLOT_AT[v] + 2:]
            rest = first_value[4:]
            quarantined = ServiceValue(rev_nat_index=self.rev_nat_index, flags=slot_flags,
                                       flags2=slot_flags2 | ServiceFlag2.QUARANTINED).pack()[4:]
            services = f"cilium_lb{v}_services_v2"
            pairs = zip(self.slots, self.slot_states, strict=True)
            for slot, (backend_id, state) in enumerate(pairs, start=1):
                yield (services, head + _U16.pack(slot) + tail,
                       _U32.pack(backend_id) + (quarantined if state is _QUARANTINED else rest))
        yield (f"cilium_lb{v}_reverse_nat", ReverseNatKey(rev_nat_index=self.rev_nat_index).pack(),
               ReverseNat(address=p.address, port=p.port).pack())
        if self.maglev:
            yield (f"cilium_lb{v}_maglev", MaglevOuterKey(rev_nat_index=self.rev_nat_index).pack(),
                   maglev_inner_pack(self.maglev))
        for backend_id in self.affinity_match:
            match = AffinityMatchKey(backend_id=backend_id, rev_nat_id=self.rev_nat_index)
            yield _AFFINITY_MATCH, match.pack(), _ZERO
        for cidr in p.source_ranges:
            net, _, bits = cidr.partition("/")
            yield (f"cilium_lb{v}_source_range",
                   SourceRangeKey(rev_nat_id=self.rev_nat_index, address=net, prefix=int(bits)).pack(), _ZERO)
        yield f"cilium_lb{v}_services_v2", key.pack(), self.master.pack()


@dataclass(frozen=True, slots=True, kw_only=True)
class EbpfMaps:
    """The whole map contents at one sync, frozen (what ``kproxy render`` prints).

    Attributes:
        frontends: every frontend, by family then address, port, protocol and scope.
        backends: ``(backend_id, Backend)`` by id.
        backend_bytes: ``{backend_id: (map, key, value)}`` already packed (optional: what is
            missing is packed by :meth:`entries`).
    """

    frontends: tuple[RenderedFrontend, ...]
    backends: tuple[tuple[int, Backend], ...]
    backend_bytes: Mapping[int, tuple[str, bytes, bytes]] = field(default_factory=dict, compare=False,
                                                                   repr=False)

    def entries(self) -> dict[str, dict[bytes, bytes]]:
        """Every map's entries as bytes, ``{map name: {key: value}}`` (a full fill)."""
        out: dict[str, dict[bytes, bytes]] = {}
        for backend_id, be in self.backends:
            packed = self.backend_bytes.get(backend_id)
            if packed is None:
                packed = (_backends_map(be.address), backend_key(backend_id), be.pack())
            out.setdefault(packed[0], {})[packed[1]] = packed[2]
        for fe in self.frontends:
            for name, key, value in fe.packed:
                out.setdefault(name, {})[key] = value
        return out


class _Ids:
    """Cilium's ``idAllocator``: ids from 1, the next one after the last given, wrapping to 1
    past the maximum and skipping those in use; a released id waits for the wrap."""

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.next = 1
        self.by_key: dict[object, int] = {}
        self.used: set[int] = set()

    def acquire(self, key: object) -> int:
        found = self.by_key.get(key)
        if found is not None:
            return found
        if len(self.used) >= self.maximum:
            raise InvalidArgument(f"no free id left (all {self.maximum} in use)")
        candidate = self.next
        while candidate in self.used:
            candidate = candidate + 1 if candidate < self.maximum else 1
        self.next = candidate + 1 if candidate < self.maximum else 1
        self.by_key[key] = candidate
        self.used.add(candidate)
        return candidate

    def release(self, key: object) -> None:
        found = self.by_key.pop(key, None)
        if found is not None:
            self.used.discard(found)


_PortKey = tuple[IPFamily, ServicePortName]
_BackendIdentity = tuple[str, int, Protocol]


@dataclass(slots=True)
class MapState:
    """The reconciler's state between syncs (mutable: the thin stateful shell of the mode).

    Attributes:
        config: the node addresses and Cilium's flags.
        ops_total: map operations returned by every sync so far.
    """

    config: EbpfConfig = field(default_factory=EbpfConfig)
    ops_total: int = 0
    _frontends: dict[_PortKey, tuple[RenderedFrontend, ...]] = field(default_factory=dict)
    _infos: dict[_PortKey, ServicePortInfo] = field(default_factory=dict)
    _owners: dict[tuple[str, int, Protocol, Scope], _PortKey] = field(default_factory=dict)
    _service_ids: _Ids = field(default_factory=lambda: _Ids(_MAX_SERVICE_ID))
    _backend_ids: _Ids = field(default_factory=lambda: _Ids(_MAX_BACKEND_ID))
    _backends: dict[int, Backend] = field(default_factory=dict)
    _backend_plans: dict[int, BackendPlan] = field(default_factory=dict)
    _backend_bytes: dict[int, tuple[str, bytes, bytes]] = field(default_factory=dict)
    _refs: dict[int, int] = field(default_factory=dict)
    _revision: int | None = None

    def sync(self, snapshot: Snapshot) -> tuple[MapOp, ...]:
        """Bring the state to ``snapshot``; return the map operations, in a safe order.

        Only the service ports in ``snapshot.changed`` are looked at when the snapshot follows
        the last one synced (revision + 1); otherwise every port is compared.

        Raises:
            InvalidArgument: no free service or backend id is left.
        """
        if self._revision is not None and snapshot.revision == self._revision + 1:
            keys = {(family, spn) for spn in snapshot.changed for family in IPFamily
                    if (family, spn) in snapshot.ports or (family, spn) in self._infos}
        else:
            keys = {k for k, info in snapshot.ports.items() if self._infos.get(k) != info}
            keys |= {k for k in self._infos if k not in snapshot.ports}
        self._revision = snapshot.revision
        first: list[MapOp] = []
        ops: list[MapOp] = []
        touched: set[int] = set()
        for key in sorted(keys):
            info = snapshot.ports.get(key)
            self._sync_port(key, info, first, ops, touched)
        for backend_id in sorted(touched):
            if self._refs.get(backend_id, 0) <= 0:
                be = self._backends.pop(backend_id)
                self._backend_plans.pop(backend_id, None)
                self._backend_bytes.pop(backend_id, None)
                self._refs.pop(backend_id, None)
                self._backend_ids.release((be.address, be.port, _proto_of(be.proto)))
                ops.append(MapOp(_backends_map(be.address), OpKind.DELETE, backend_key(backend_id)))
        result = tuple(first + ops)
        self.ops_total += len(result)
        return result

    def maps(self) -> EbpfMaps:
        """The whole current contents, frozen."""
        fes = [fe for group in self._frontends.values() for fe in group]
        fes.sort(key=lambda fe: (fe.family, fe.plan.address, fe.plan.port, fe.plan.protocol, fe.plan.scope))
        return EbpfMaps(frontends=tuple(fes), backends=tuple(sorted(self._backends.items())),
                        backend_bytes=MappingProxyType(dict(self._backend_bytes)))

    def _sync_port(self, key: _PortKey, info: ServicePortInfo | None, first: list[MapOp],
                   ops: list[MapOp], touched: set[int]) -> None:
        old = {fe.plan.key: fe for fe in self._frontends.get(key, ())}
        plans = plan_frontends(info, self.config) if info is not None else ()
        new: list[RenderedFrontend] = []
        seen: set[tuple[str, int, Protocol, Scope]] = set()
        for plan in plans:
            # A frontend two service ports claim (the same NodePort, an external IP that is
            # another Service's LoadBalancer address) stays with the port that took it first,
            # as Cilium's writer refuses the conflicting one.
            if plan.key in seen or self._owners.setdefault(plan.key, key) != key:
                continue
            seen.add(plan.key)
            fe = self._render(key, plan, first, touched)
            prev = old.pop(plan.key, None)
            self._diff(prev, fe, ops)
            if prev is not None:
                self._unref(prev, touched)
            new.append(fe)
        for prev in old.values():
            self._diff(prev, None, ops)
            self._unref(prev, touched)
            self._service_ids.release(prev.plan.key)
            self._owners.pop(prev.plan.key, None)
        if info is None:
            self._frontends.pop(key, None)
            self._infos.pop(key, None)
        else:
            self._frontends[key] = tuple(new)
            self._infos[key] = info

    def _render(self, key: _PortKey, plan: FrontendPlan, first: list[MapOp],
                touched: set[int]) -> RenderedFrontend:
        rev = self._service_ids.acquire(plan.key)
        acquire = self._backend_ids.acquire
        plans, refs = self._backend_plans, self._refs
        ids: list[int] = []
        for be in plan.backends:
            backend_id = acquire((be.address, be.port, be.protocol))
            known = plans.get(backend_id)
            if known is not be and known != be:
                value = Backend(address=be.address, port=be.port, proto=IPPROTO[be.protocol], state=be.state)
                self._backends[backend_id] = value
                plans[backend_id] = be
                packed = (_backends_map(be.address), _U32.pack(backend_id), value.pack())
                self._backend_bytes[backend_id] = packed
                first.append(MapOp(packed[0], OpKind.UPDATE, packed[1], packed[2]))
            refs[backend_id] = refs.get(backend_id, 0) + 1
            touched.add(backend_id)
            ids.append(backend_id)
        picked, active, inactive = slot_layout(plan.backends)
        in_slots = [(ids[i], plan.backends[i]) for i in picked]
        master = ServiceValue.master_entry(
            count=active, qcount=inactive, rev_nat_index=rev, flags=plan.flags, flags2=plan.flags2,
            affinity_timeout_s=plan.affinity_timeout_s, algorithm=plan.algorithm)
        table: tuple[int, ...] = ()
        if plan.use_maglev and active:
            table = lookup_table((MaglevBackend(backend_id=i, hash_string=_hash_string(be))
                                  for i, be in in_slots[:active]), self.config.maglev)
        matches = (tuple(i for i, be in in_slots if be.state is _ACTIVE)
                   if plan.affinity_timeout_s else ())
        return RenderedFrontend(name=key[1], family=key[0], plan=plan, rev_nat_index=rev, master=master,
                                slots=tuple(i for i, _ in in_slots),
                                slot_states=tuple(be.state for _, be in in_slots), maglev=table,
                                affinity_match=matches)

    def _unref(self, fe: RenderedFrontend, touched: set[int]) -> None:
        for be in fe.plan.backends:
            backend_id = self._backend_ids.by_key[(be.address, be.port, be.protocol)]
            self._refs[backend_id] -= 1
            touched.add(backend_id)

    @staticmethod
    def _diff(old: RenderedFrontend | None, new: RenderedFrontend | None, ops: list[MapOp]) -> None:
        """The operations turning ``old``'s entries into ``new``'s: updates of new or changed
        entries first, then deletes of the entries ``new`` no longer has."""
        if old is None:
            packed = new.packed if new is not None else ()
            ops.extend(MapOp(name, OpKind.UPDATE, key, value) for name, key, value in packed)
            return
        if new is None:
            ops.extend(MapOp(name, OpKind.DELETE, key) for name, key, _ in old.packed)
            return
        before = {(name, key): value for name, key, value in old.packed}
        after = {(name, key): value for name, key, value in new.packed}
        for (name, key), value in after.items():
            if before.get((name, key)) != value:
                ops.append(MapOp(name, OpKind.UPDATE, key, value))
        for name, key in before:
            if (name, key) not in after:
                ops.append(MapOp(name, OpKind.DELETE, key))


def slot_layout(backends: Sequence[BackendPlan]) -> tuple[tuple[int, ...], int, int]:
    """Which of a frontend's sorted backends get slots 1..N, and the master's ``count`` and
    ``qcount``, as ``updateFrontend``: maintenance backends get no slot; ``count`` is the active
    backends, or the terminating ones when none is active (KEP-1669); ``qcount`` is the rest
    (quarantined, and terminating when some backend is active).

    Returns:
        ``(indices into backends, count, qcount)``.
    """
    picked: list[int] = []
    active = terminating = 0
    for i, be in enumerate(backends):
        state = be.state
        if state is _MAINTENANCE:
            continue
        picked.append(i)
        if state is _ACTIVE:
            active += 1
        elif state is _TERMINATING:
            terminating += 1
    inactive = len(picked) - active - terminating
    if active == 0:
        return tuple(picked), terminating, inactive
    return tuple(picked), active, inactive + terminating


def _hash_string(be: BackendPlan) -> str:
    return backend_hash_string(be.address, be.port, be.protocol)


def _backends_map(address: str) -> str:
    return f"cilium_lb{'6' if ':' in address else '4'}_backends_v3"


def _proto_of(number: int) -> Protocol:
    for proto, num in IPPROTO.items():
        if num == number:
            return proto
    raise InvalidArgument(f"unknown protocol number {number}")


def render(snapshot: Snapshot, config: EbpfConfig) -> EbpfMaps:
    """The maps of ``snapshot`` filled from empty (ids from 1, in the order of the ports).

    Raises:
        InvalidArgument: more frontends or backends than Cilium's ids allow.
    """
    state = MapState(config=config)
    state.sync(snapshot)
    return state.maps()
