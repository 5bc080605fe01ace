"""An in-process source driven by calls from a test harness or an embedding program.

Calls made before :meth:`MemorySource.run` starts build the initial state; calls made while it
runs reach the engine at once, synchronously, through the ``emit`` callback (so after
``source.add(svc)`` returns, the engine's tracker already holds the change). Every call must
come from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, overload

from kproxy.errors import InvalidArgument, InvalidObject
from kproxy.model import LABEL_SERVICE_NAME, KubeObject, parse_objects
from kproxy.sources.base import Emit, Event, EventType, ObjectKey, Synced, object_key

__all__ = ["MemorySource"]

_KINDS = ("Service", "EndpointSlice", "Ingress", "DestinationRule")


def _split_name(name: str) -> tuple[str, str]:
    ns, sep, rest = name.partition("/")
    if not sep:
        ns, rest = "default", name
    if not ns or not rest or "/" in rest:
        raise InvalidArgument(f"expected 'namespace/name' or 'name', got {name!r}")
    return ns, rest


def _split_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        raise InvalidArgument(
            f"expected an endpoint 'ip:port' or '[ipv6]:port', got {text!r}") from None
    if not sep or not 1 <= number <= 65535:
        raise InvalidArgument(f"expected an endpoint 'ip:port' with port 1..65535, got {text!r}")
    return host, number


class MemorySource:
    """A Source whose objects are added, changed and deleted by method calls.

    Args:
        objects: the initial objects (Services and EndpointSlices).

    Raises:
        InvalidArgument: two initial objects share kind, namespace and name.
    """

    def __init__(self, objects: Iterable[KubeObject] = ()) -> None:
        self._objects: dict[ObjectKey, KubeObject] = {}
        self._emit: Emit | None = None
        self._helper_slices: dict[tuple[str, str, str, str], set[ObjectKey]] = {}
        for obj in objects:
            self.add(obj)

    # -- reading -----------------------------------------------------------------------------

    def objects(self) -> tuple[KubeObject, ...]:
        """Every object, sorted by kind, namespace and name."""
        return tuple(self._objects[k] for k in sorted(self._objects))

    def get(self, kind: str, namespace: str, name: str) -> KubeObject | None:
        """The object with this identity, or None."""
        return self._objects.get(ObjectKey(kind, namespace, name))

    @property
    def running(self) -> bool:
        """True while :meth:`run` is delivering events."""
        return self._emit is not None

    # -- changing ----------------------------------------------------------------------------

    def add(self, obj: KubeObject) -> None:
        """Add a new object (event ADDED).

        Raises:
            InvalidArgument: it already exists (use :meth:`update` or :meth:`apply`), or it is
                not a Service or EndpointSlice.
        """
        key = self._key(obj)
        if key in self._objects:
            raise InvalidArgument(f"{key} already exists; use update() or apply() to change it")
        self._commit([Event(type=EventType.ADDED, obj=obj)])

    def update(self, obj: KubeObject) -> None:
        """Replace an existing object (event UPDATED).

        Raises:
            InvalidArgument: it does not exist (use :meth:`add` or :meth:`apply`).
        """
        key = self._key(obj)
        if key not in self._objects:
            raise InvalidArgument(f"{key} does not exist; use add() or apply() to create it")
        self._commit([Event(type=EventType.UPDATED, obj=obj)])

    @overload
    def delete(self, target: KubeObject, /) -> None: ...
    @overload
    def delete(self, target: str, namespace: str, name: str, /) -> None: ...

    def delete(self, target: KubeObject | str, namespace: str | None = None,
               name: str | None = None, /) -> None:
        """Delete an object given itself or its kind, namespace and name (event DELETED).

        Raises:
            InvalidArgument: it does not exist, or the arguments are incomplete.
        """
        if isinstance(target, str):
            if target not in _KINDS or namespace is None or name is None:
                raise InvalidArgument(
                    f"expected delete(obj) or delete(kind, namespace, name) with kind in {_KINDS}, "
                    f"got {target=}, {namespace=}, {name=}")
            key = ObjectKey(target, namespace, name)
        else:
            key = self._key(target)
        held = self._objects.get(key)
        if held is None:
            raise InvalidArgument(f"{key} does not exist; nothing to delete")
        self._commit([Event(type=EventType.DELETED, obj=held)])

    def apply(self, raw: Mapping[str, Any]) -> list[KubeObject]:
        """Parse an API dict (an object or a List) and add or update what it holds, as ``kubectl apply``.

        Returns:
            The objects applied.

        Raises:
            InvalidObject: the dict, or any object in it, is invalid (nothing is applied).
        """
        result = parse_objects(raw, source="memory")
        if result.problems:
            raise result.problems[0]
        if not result.objects and not result.ignored_kinds:
            raise InvalidObject(source="memory", problem=f"no Service or EndpointSlice in {raw!r}")
        self._commit(self._upserts(result.objects))
        return list(result.objects)

    def add_service(
        self,
        name: str,
        cluster_ip: str | Sequence[str],
        ports: Sequence[int | Mapping[str, Any]] = (80,),
        **spec: Any,
    ) -> KubeObject:
        """Add or update a Service built from a few arguments.

        Args:
            name: ``namespace/name`` (or ``name`` in ``default``).
            cluster_ip: the cluster IP, or the list of cluster IPs (dual-stack).
            ports: port numbers (an unnamed TCP port if there is one, else ``p<port>``) or
                ``spec.ports`` entries as the API spells them.
            **spec: more ``spec`` fields, by their API names (``type="NodePort"``,
                ``sessionAffinity="ClientIP"``).

        Raises:
            InvalidObject: the resulting Service is invalid.
        """
        ns, svc_name = _split_name(name)
        ips = [cluster_ip] if isinstance(cluster_ip, str) else list(cluster_ip)
        port_specs = [
            dict(p) if isinstance(p, Mapping)
            else ({"port": p} if len(ports) == 1 else {"name": f"p{p}", "port": p})
            for p in ports
        ]
        raw = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"namespace": ns, "name": svc_name},
               "spec": {"clusterIPs": ips, "ports": port_specs, **spec}}
        return self.apply(raw)[0]

    def set_endpoints(
        self,
        service: str,
        addresses: Sequence[str],
        *,
        port_name: str = "",
        protocol: str = "TCP",
        node_name: str | None = None,
        ready: bool = True,
    ) -> None:
        """Replace the endpoints of one port of a Service with ``addresses``.

        Builds one EndpointSlice per address family and endpoint port, named
        ``<service>-<port_name or "port">-<family>-<port>``; slices made earlier by this helper
        for the same Service, port name and protocol are deleted. ``[]`` removes them all.

        Args:
            service: ``namespace/name`` of the Service.
            addresses: ``"ip:port"`` strings (``"[ip6]:port"`` for IPv6).
            port_name: the Service port's name (``""`` for an unnamed port).
            protocol: TCP, UDP or SCTP.
            node_name: the ``nodeName`` of every endpoint.
            ready: the ``ready`` (and ``serving``) condition of every endpoint.

        Raises:
            InvalidArgument: a malformed service name or address.
            InvalidObject: a resulting slice is invalid.
        """
        ns, svc_name = _split_name(service)
        groups: dict[tuple[str, int], list[str]] = {}
        for text in addresses:
            ip, port = _split_address(text)
            family = "IPv6" if ":" in ip else "IPv4"
            groups.setdefault((family, port), []).append(ip)
        slices = []
        for (family, port), ips in sorted(groups.items()):
            endpoint: dict[str, Any] = {"conditions": {"ready": ready, "serving": ready}}
            if node_name is not None:
                endpoint["nodeName"] = node_name
            slices.append({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"namespace": ns,
                             "name": f"{svc_name}-{port_name or 'port'}-{family.lower()}-{port}",
                             "labels": {LABEL_SERVICE_NAME: svc_name}},
                "addressType": family,
                "endpoints": [{**endpoint, "addresses": [ip]} for ip in ips],
                "ports": [{"name": port_name, "protocol": protocol, "port": port}],
            })
        result = parse_objects({"apiVersion": "v1", "kind": "List", "items": slices}, source="memory")
        if result.problems:
            raise result.problems[0]
        helper_key = (ns, svc_name, port_name, protocol)
        new_keys = {object_key(obj) for obj in result.objects}
        stale = sorted(self._helper_slices.get(helper_key, set()) - new_keys)
        events = [Event(type=EventType.DELETED, obj=self._objects[k]) for k in stale if k in self._objects]
        events.extend(self._upserts(result.objects))
        self._helper_slices[helper_key] = new_keys
        self._commit(events)

    # -- the Source interface ----------------------------------------------------------------

    async def run(self, emit: Emit, synced: Synced) -> None:
        """Emit the current objects as one ADDED batch, call ``synced()``, then relay calls until cancelled.

        Raises:
            InvalidArgument: it is already running.
        """
        if self._emit is not None:
            raise InvalidArgument("this MemorySource is already running; a source feeds one engine")
        emit([Event(type=EventType.ADDED, obj=obj) for obj in self.objects()])
        synced()
        self._emit = emit
        try:
            await asyncio.Event().wait()  # forever: changes are pushed by the methods above
        finally:
            self._emit = None

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _key(obj: KubeObject) -> ObjectKey:
        # Event() validates the type; do it here too so add/update fail before any change.
        return Event(type=EventType.ADDED, obj=obj).key

    def _upserts(self, objects: Iterable[KubeObject]) -> list[Event]:
        events = []
        view: dict[ObjectKey, KubeObject] = {}
        for obj in objects:
            key = object_key(obj)
            held = view.get(key, self._objects.get(key))
            if held is None:
                events.append(Event(type=EventType.ADDED, obj=obj))
            elif held != obj:
                events.append(Event(type=EventType.UPDATED, obj=obj))
            view[key] = obj
        return events

    def _commit(self, events: Sequence[Event]) -> None:
        for event in events:
            if event.type is EventType.DELETED:
                self._objects.pop(event.key, None)
            else:
                self._objects[event.key] = event.obj
        if events and self._emit is not None:
            self._emit(list(events))
