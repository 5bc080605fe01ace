"""Small builders of model objects and an async harness shared by the sync and source tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

from kproxy.model import (
    EndpointConditions,
    EndpointPort,
    EndpointSlice,
    IPFamily,
    Protocol,
    Service,
    ServicePort,
    SliceEndpoint,
    Snapshot,
)
from kproxy.sources import Event, EventType
from kproxy.sync import settle


def svc(name: str, ip: str = "10.0.0.1", ports: Sequence[tuple[str, int]] = (("", 80),),
        ns: str = "default") -> Service:
    """A ClusterIP Service with TCP ports ``(name, port)``."""
    return Service(namespace=ns, name=name, cluster_ips=(ip,), ports=tuple(
        ServicePort(name=n, protocol=Protocol.TCP, port=p, target_port=p) for n, p in ports))


def eps(name: str, service: str, ips: Sequence[str], port: int = 8080, port_name: str = "",
        ns: str = "default", ready: bool = True, node: str | None = None) -> EndpointSlice:
    """An IPv4 EndpointSlice of ``service`` with one TCP port."""
    return EndpointSlice(
        namespace=ns, name=name, service_name=service, address_type=IPFamily.IPv4,
        endpoints=tuple(SliceEndpoint(address=ip, node_name=node,
                                      conditions=EndpointConditions(ready=ready, serving=ready))
                        for ip in ips),
        ports=(EndpointPort(name=port_name, protocol=Protocol.TCP, port=port),))


def added(obj: Any) -> Event:
    """An ADDED event."""
    return Event(type=EventType.ADDED, obj=obj)


def updated(obj: Any) -> Event:
    """An UPDATED event."""
    return Event(type=EventType.UPDATED, obj=obj)


def deleted(obj: Any) -> Event:
    """A DELETED event."""
    return Event(type=EventType.DELETED, obj=obj)


def addresses(snapshot: Snapshot, name: str) -> list[str]:
    """The endpoint addresses of port ``name`` (text form) in IPv4."""
    info = snapshot.get(name)
    assert info is not None, f"{name} not in snapshot {sorted(map(str, snapshot.changed))}"
    return [ep.address for ep in info.endpoints]


@contextlib.asynccontextmanager
async def running(fn: Callable[[], Coroutine[Any, Any, None]]) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``fn()`` in a TaskGroup for the body of the block, then cancel it."""
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(fn())
        await settle()
        try:
            yield task
        finally:
            task.cancel()
