"""Fold source events into pending changes and hand out Snapshots, as kube-proxy's trackers.

Theory of operation
-------------------
kube-proxy's ``ServiceChangeTracker`` and ``EndpointsChangeTracker`` keep, per Service, the
*first previous* and the *last current* state since the last sync, and drop the entry when the
two are equal again (an add followed by a delete nets to nothing). :class:`ChangeTracker` does
the same with one key per Service (``namespace/name``): the state of a Service is its Service
object (or None) plus every EndpointSlice labelled ``kubernetes.io/service-name`` with its name.
EndpointSlices are known by ``namespace/slice-name``; a slice whose label moves to another
Service changes both Services.

:meth:`ChangeTracker.checkout` rebuilds the ServicePortInfos of the pending Services only
(:func:`kproxy.model.build_service_ports`), keeps every other one from the previous Snapshot,
and names in ``changed`` the ServicePortNames whose infos were added, removed or differ.

Each checkout also finds :class:`PortConflict`: two Services answering on one ClusterIP, port
and protocol. The API server's allocator never gives a ClusterIP twice, so kube-proxy has no
rule for it (its proxiers write every port, in Go map order, and the first rule to match wins);
hand-written manifests can, so the conflict is named (both objects and where each came from)
for the engine to report.

Pure: no asyncio, no I/O. Time comes from an injected ``now`` callable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kproxy.errors import InvalidArgument
from kproxy.model import (
    DestinationRule,
    EndpointSlice,
    Ingress,
    IPFamily,
    NamespacedName,
    NodeConfig,
    Service,
    ServicePortInfo,
    ServicePortName,
    Snapshot,
    build_service_ports,
)
from kproxy.sources.base import Event, EventType

__all__ = ["ChangeTracker", "PendingChange", "PortConflict", "changed_names", "port_conflicts"]

_PortKey = tuple[IPFamily, ServicePortName]


@dataclass(frozen=True, slots=True, kw_only=True)
class _ServiceState:
    """One Service's inputs: its object (None when absent) and its slices by slice key."""

    service: Service | None
    slices: Mapping[NamespacedName, EndpointSlice]


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingChange:
    """A Service with changes not yet checked out.

    Attributes:
        service: the Service's ``namespace/name``.
        queued_at: when its first change since the last checkout arrived (seconds, clock time),
            or None when the tracker has no clock.
    """

    service: NamespacedName
    queued_at: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PortConflict:
    """Several Service ports on one ClusterIP, port and protocol.

    Attributes:
        address: ``IP:PORT/PROTOCOL``.
        ports: the ServicePortNames sharing it, sorted by namespace/name: kproxy writes its
            rules in that order, so where several have endpoints the first one matches.
        sources: where each Service came from (a file, ``kube``, ``memory``), in the same order.
    """

    address: str
    ports: tuple[ServicePortName, ...]
    sources: tuple[str, ...]

    def __str__(self) -> str:
        named = ", ".join(f"Service {p} ({src or 'unknown source'})"
                          for p, src in zip(self.ports, self.sources, strict=True))
        return f"{self.address} is used by {named}"


def port_conflicts(
    ports: Mapping[_PortKey, ServicePortInfo], services: Mapping[NamespacedName, Service]
) -> tuple[PortConflict, ...]:
    """Every ClusterIP, port and protocol used by more than one Service port, sorted by address."""
    users: dict[tuple[str, int, str], list[ServicePortName]] = {}
    for (_, spn), info in ports.items():
        if info.cluster_ip:
            users.setdefault((info.cluster_ip, info.port, str(info.protocol)), []).append(spn)
    out = []
    for (ip, port, proto), names in sorted(users.items()):
        if len(names) < 2:
            continue
        names.sort(key=lambda n: (n.namespace, n.name, n.port))
        where = "[" + ip + "]" if ":" in ip else ip
        srcs = tuple(getattr(services.get(NamespacedName(namespace=n.namespace, name=n.name)), "source", "")
                     for n in names)
        out.append(PortConflict(address=f"{where}:{port}/{proto}", ports=tuple(names), sources=srcs))
    return tuple(out)


def changed_names(
    old: Mapping[_PortKey, ServicePortInfo], new: Mapping[_PortKey, ServicePortInfo]
) -> frozenset[ServicePortName]:
    """The ServicePortNames whose info was added, removed or differs between two port maps."""
    return frozenset(key[1] for key in set(old) | set(new) if old.get(key) != new.get(key))


class ChangeTracker:
    """Folds Service and EndpointSlice events and builds Snapshots incrementally.

    Args:
        node: the node the Snapshots are built for.
        now: a clock reading in seconds (e.g. ``clock.now``), used to record when each pending
            change was first queued; None records no times.

    Invariant: ``checkout().same_state(build_snapshot(services, slices, node))`` for the
    Services and slices known at that moment.
    """

    def __init__(self, node: NodeConfig, *, now: Callable[[], float] | None = None) -> None:
        if not isinstance(node, NodeConfig):
            raise InvalidArgument(f"expected a NodeConfig, got {type(node).__name__} {node=}")
        self._node = node
        self._now = now
        self._services: dict[NamespacedName, Service] = {}
        self._slices: dict[NamespacedName, EndpointSlice] = {}
        self._slices_of: dict[NamespacedName, set[NamespacedName]] = {}
        self._pending: dict[NamespacedName, tuple[_ServiceState, float | None]] = {}
        self._ports_of: dict[NamespacedName, dict[_PortKey, ServicePortInfo]] = {}
        self._snapshot: Snapshot | None = None
        # The HTTP plane's objects: no ports of their own, handed out whole with each Snapshot.
        self._l7: dict[tuple[str, str, str], Ingress | DestinationRule] = {}
        self._l7_checked_out: dict[tuple[str, str, str], Ingress | DestinationRule] = {}
        self.conflicts: tuple[PortConflict, ...] = ()
        """The ClusterIP conflicts of the last Snapshot handed out (see :class:`PortConflict`)."""

    @property
    def node(self) -> NodeConfig:
        """The node Snapshots are built for."""
        return self._node

    def set_node(self, node: NodeConfig) -> bool:
        """Build Snapshots for ``node`` from now on (its zone changed); every Service is rebuilt.

        Returns:
            whether the node differs (and every Service is now pending).

        Raises:
            InvalidArgument: ``node`` is not a NodeConfig.
        """
        if not isinstance(node, NodeConfig):
            raise InvalidArgument(f"expected a NodeConfig, got {type(node).__name__} {node=}")
        if node == self._node:
            return False
        self._node = node
        for key in self._services:
            self._touch(key)
        return True

    @property
    def snapshot(self) -> Snapshot | None:
        """The last Snapshot handed out, or None before the first checkout."""
        return self._snapshot

    @property
    def pending_count(self) -> int:
        """How many Services have changes not yet checked out (no-ops excluded); Ingresses and
        DestinationRules that changed count as one more."""
        return len(self._pending) + (self._l7 != self._l7_checked_out)

    def pending(self) -> tuple[PendingChange, ...]:
        """The pending Services, oldest change first."""
        items = [PendingChange(service=k, queued_at=t) for k, (_, t) in list(self._pending.items())]
        return tuple(sorted(items, key=lambda p: (p.queued_at or 0.0, p.service)))

    def oldest_pending_since(self) -> float | None:
        """When the oldest pending change was queued (seconds, clock time); None if none or no clock."""
        times = [t for _, t in list(self._pending.values()) if t is not None]
        return min(times) if times else None

    def services(self) -> tuple[Service, ...]:
        """Every Service currently known, sorted by namespace/name."""
        return tuple(self._services[k] for k in sorted(self._services))

    def endpoint_slices(self) -> tuple[EndpointSlice, ...]:
        """Every EndpointSlice currently known, sorted by namespace/slice name."""
        return tuple(self._slices[k] for k in sorted(self._slices))

    def apply(self, event: Event) -> None:
        """Fold one event. DELETED of an unknown object and UPDATED of an unknown one (an add) are fine.

        Raises:
            InvalidArgument: ``event`` is not an :class:`Event` of a Service or EndpointSlice.
        """
        if not isinstance(event, Event):
            raise InvalidArgument(f"expected an Event, got {type(event).__name__} {event!r}")
        obj = event.obj
        if isinstance(obj, Service):
            self._touch(obj.key)
            if event.type is EventType.DELETED:
                self._services.pop(obj.key, None)
            else:
                self._services[obj.key] = obj
            self._settle(obj.key)
        elif isinstance(obj, EndpointSlice):
            self._apply_slice(event.type, obj)
        elif isinstance(obj, Ingress | DestinationRule):
            key = (type(obj).__name__, obj.namespace, obj.name)
            if event.type is EventType.DELETED:
                self._l7.pop(key, None)
            else:
                self._l7[key] = obj
        else:
            raise InvalidArgument(f"expected a Service or EndpointSlice event, got {obj!r}")

    def apply_all(self, events: Iterable[Event]) -> None:
        """Fold several events in order."""
        for event in events:
            self.apply(event)

    def checkout(self) -> Snapshot:
        """Hand out the next Snapshot (revision + 1) and clear the pending changes.

        Only pending Services are rebuilt; the others keep their ServicePortInfo objects.
        ``changed`` names the ports added, removed or different since the previous Snapshot
        (every port for the first one).
        """
        old_ports: dict[_PortKey, ServicePortInfo] = {}
        new_ports: dict[_PortKey, ServicePortInfo] = {}
        for key in self._pending:
            old_ports.update(self._ports_of.pop(key, {}))
            svc = self._services.get(key)
            if svc is None:
                continue
            built = build_service_ports(svc, self._slices_of_service(key).values(), self._node)
            if built:
                self._ports_of[key] = built
                new_ports.update(built)
        self._pending.clear()
        ports: dict[_PortKey, ServicePortInfo] = {}
        for infos in self._ports_of.values():
            ports.update(infos)
        if new_ports or old_ports:
            self.conflicts = port_conflicts(ports, self._services)
        revision = 1 if self._snapshot is None else self._snapshot.revision + 1
        self._l7_checked_out = dict(self._l7)
        l7 = [self._l7[k] for k in sorted(self._l7)]
        self._snapshot = Snapshot(revision=revision, node=self._node, ports=MappingProxyType(ports),
                                  changed=changed_names(old_ports, new_ports),
                                  ingresses=tuple(o for o in l7 if isinstance(o, Ingress)),
                                  destination_rules=tuple(o for o in l7 if isinstance(o, DestinationRule)))
        return self._snapshot

    # -- internals ---------------------------------------------------------------------------

    def _apply_slice(self, kind: EventType, eps: EndpointSlice) -> None:
        skey = NamespacedName(namespace=eps.namespace, name=eps.name)
        old = self._slices.get(skey)
        owners = {eps.service} | ({old.service} if old is not None else set())
        for owner in owners:
            self._touch(owner)
        if old is not None:
            self._slices_of[old.service].discard(skey)
            if not self._slices_of[old.service]:
                del self._slices_of[old.service]
            del self._slices[skey]
        if kind is not EventType.DELETED:
            self._slices[skey] = eps
            self._slices_of.setdefault(eps.service, set()).add(skey)
        for owner in owners:
            self._settle(owner)

    def _slices_of_service(self, key: NamespacedName) -> dict[NamespacedName, EndpointSlice]:
        return {s: self._slices[s] for s in self._slices_of.get(key, ())}

    def _state(self, key: NamespacedName) -> _ServiceState:
        return _ServiceState(service=self._services.get(key), slices=self._slices_of_service(key))

    def _touch(self, key: NamespacedName) -> None:
        """Remember ``key``'s state before its first change since the last checkout."""
        if key not in self._pending:
            self._pending[key] = (self._state(key), self._now() if self._now else None)

    def _settle(self, key: NamespacedName) -> None:
        """Drop ``key`` from the pending set when it is back to its state at the last checkout."""
        previous, _ = self._pending[key]
        if previous == self._state(key):
            del self._pending[key]
