"""The Source interface and its events.

A source produces batches of :class:`Event` (a Service or EndpointSlice added, updated or
deleted). kube-proxy's informers do the same through ``OnServiceAdd/Update/Delete`` and
``OnEndpointSliceAdd/Update/Delete`` handlers, and say when their initial list has been
delivered (``HasSynced``); kube-proxy does not program anything before both Services and
EndpointSlices are synced. A source's ``run`` therefore calls ``synced()`` once its initial
state has been emitted.

:func:`object_key` and :func:`diff_objects` are the pure helpers every source uses to turn
"the objects I see now" into events (the manifests source on a reload, the ``kube`` source's
reflector on a relist after its watch expired, as client-go's ``Reflector`` replaces its store).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple, Protocol, runtime_checkable

from kproxy.errors import InvalidArgument
from kproxy.model import DestinationRule, EndpointSlice, Ingress, KubeObject, Service

__all__ = [
    "Emit",
    "Event",
    "EventType",
    "ObjectKey",
    "Source",
    "Synced",
    "diff_objects",
    "object_key",
]


class EventType(StrEnum):
    """What happened to an object."""

    ADDED = "ADDED"
    UPDATED = "UPDATED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One change of one object.

    Attributes:
        type: ADDED, UPDATED or DELETED.
        obj: the Service or EndpointSlice (for DELETED, the last known object).

    Raises:
        InvalidArgument: ``type`` is not an EventType or ``obj`` is neither a Service nor an
            EndpointSlice.
    """

    type: EventType
    obj: KubeObject

    def __post_init__(self) -> None:
        if not isinstance(self.type, EventType):
            raise InvalidArgument(f"expected an EventType, got {self.type!r}")
        if not isinstance(self.obj, Service | EndpointSlice | Ingress | DestinationRule):
            raise InvalidArgument(
                f"expected a Service, EndpointSlice, Ingress or DestinationRule, got "
                f"{type(self.obj).__name__} {self.obj!r}")

    @property
    def key(self) -> ObjectKey:
        """The object's identity."""
        return object_key(self.obj)


class ObjectKey(NamedTuple):
    """An object's identity: kind (``Service``, ``EndpointSlice``, ``Ingress``, ``DestinationRule``),
    namespace and name."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def object_key(obj: KubeObject) -> ObjectKey:
    """The :class:`ObjectKey` of a Service, EndpointSlice, Ingress or DestinationRule (kind = class name)."""
    return ObjectKey(type(obj).__name__, obj.namespace, obj.name)


def diff_objects(
    old: Mapping[ObjectKey, KubeObject], new: Mapping[ObjectKey, KubeObject]
) -> list[Event]:
    """The events that turn the object set ``old`` into ``new``.

    Returns:
        DELETED for keys only in ``old`` (with the old object), ADDED for keys only in ``new``,
        UPDATED for keys whose object differs; unchanged objects give nothing. Sorted by key,
        deletions first, so a consumer never sees two objects with one key.
    """
    events = [Event(type=EventType.DELETED, obj=old[k]) for k in sorted(old.keys() - new.keys())]
    for key in sorted(new):
        before = old.get(key)
        if before is None:
            events.append(Event(type=EventType.ADDED, obj=new[key]))
        elif before != new[key]:
            events.append(Event(type=EventType.UPDATED, obj=new[key]))
    return events


#: ``emit(batch)``: deliver a batch of events to the engine (it must not block).
Emit = Callable[[Sequence[Event]], None]
#: ``synced()``: the initial state has been emitted.
Synced = Callable[[], None]


@runtime_checkable
class Source(Protocol):
    """Something that produces Service and EndpointSlice events.

    ``run`` emits the initial state (one or more batches, possibly empty), then calls
    ``synced()`` exactly once, then emits changes as they happen until it is cancelled.
    ``emit`` must be called from the event loop's thread and never blocks. A source that
    cannot start raises :class:`~kproxy.errors.SourceError` from ``run``.
    """

    async def run(self, emit: Emit, synced: Synced) -> None:
        """Emit batches of events until cancelled; call ``synced()`` once the initial state is out."""
        ...
