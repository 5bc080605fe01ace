"""MemorySource: initial state, immediate events while running, strict add/update/delete."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kproxy.errors import InvalidArgument, InvalidObject
from kproxy.model import EndpointSlice, Service
from kproxy.sources import Event, EventType, MemorySource, Source
from tests.unit.sync.builders import running, svc


class Collector:
    """Records emitted batches and the synced() call."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = []
        self.synced_after = -1

    def emit(self, batch: Sequence[Event]) -> None:
        self.batches.append(list(batch))

    def synced(self) -> None:
        self.synced_after = len(self.batches)

    def kinds(self) -> list[list[tuple[EventType, str]]]:
        return [[(e.type, str(e.key)) for e in b] for b in self.batches]


async def test_initial_state_is_emitted_before_synced() -> None:
    """Objects added before run() arrive as one ADDED batch, then synced() is called."""
    src = MemorySource([svc("web")])
    src.add(svc("api", "10.0.0.2"))
    col = Collector()
    async with running(lambda: src.run(col.emit, col.synced)):
        assert src.running
    assert col.kinds() == [[(EventType.ADDED, "Service default/api"),
                            (EventType.ADDED, "Service default/web")]]
    assert col.synced_after == 1
    assert not src.running


async def test_calls_while_running_emit_at_once() -> None:
    """add, update and delete while running each emit one batch synchronously."""
    src = MemorySource()
    col = Collector()
    async with running(lambda: src.run(col.emit, col.synced)):
        src.add(svc("web"))
        assert len(col.batches) == 2
        src.update(svc("web", "10.0.0.9"))
        src.delete("Service", "default", "web")
    assert col.kinds()[1:] == [[(EventType.ADDED, "Service default/web")],
                               [(EventType.UPDATED, "Service default/web")],
                               [(EventType.DELETED, "Service default/web")]]
    deleted = col.batches[-1][0].obj
    assert isinstance(deleted, Service) and deleted.cluster_ips == ("10.0.0.9",)


def test_add_update_delete_are_strict() -> None:
    """Adding twice, updating or deleting a missing object raise InvalidArgument."""
    src = MemorySource([svc("web")])
    with pytest.raises(InvalidArgument, match="already exists"):
        src.add(svc("web"))
    with pytest.raises(InvalidArgument, match="does not exist"):
        src.update(svc("api"))
    with pytest.raises(InvalidArgument, match="does not exist"):
        src.delete("Service", "default", "api")
    with pytest.raises(InvalidArgument, match="kind"):
        src.delete("Pod", "default", "web")
    src.delete(svc("web"))
    assert src.objects() == ()


def test_apply_parses_a_list_and_upserts() -> None:
    """apply() of a List adds new objects and updates existing ones, with defaults applied."""
    src = MemorySource([svc("web", "10.0.0.5")])
    applied = src.apply({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
         "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}},
        {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web"},
         "subsets": [{"addresses": [{"ip": "10.1.0.1"}], "ports": [{"port": 8080}]}]},
    ]})
    assert len(applied) == 2
    web = src.get("Service", "default", "web")
    assert isinstance(web, Service) and web.cluster_ips == ("10.0.0.1",)
    assert web.ports[0].target_port == 80


def test_apply_of_an_invalid_object_raises_and_changes_nothing() -> None:
    """apply() raises the InvalidObject naming the field and applies nothing."""
    src = MemorySource()
    with pytest.raises(InvalidObject, match=r"spec.ports\[0\].port"):
        src.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                   "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 99999}]}})
    assert src.objects() == ()


def test_set_endpoints_builds_slices_and_replaces_its_earlier_ones() -> None:
    """set_endpoints groups addresses per family and port, and drops its stale slices."""
    src = MemorySource()
    src.add_service("default/web", ["10.0.0.1", "fd00::1"], [{"name": "http", "port": 80}])
    src.set_endpoints("default/web", ["127.0.0.2:8080", "[fd00::2]:8080", "127.0.0.3:9090"],
                      port_name="http", node_name="node-a")
    names = sorted(o.name for o in src.objects() if isinstance(o, EndpointSlice))
    assert names == ["web-http-ipv4-8080", "web-http-ipv4-9090", "web-http-ipv6-8080"]
    src.set_endpoints("default/web", ["127.0.0.2:8080"], port_name="http")
    slices = [o for o in src.objects() if isinstance(o, EndpointSlice)]
    assert [s.name for s in slices] == ["web-http-ipv4-8080"]
    assert slices[0].endpoints[0].node_name is None
    src.set_endpoints("default/web", [], port_name="http")
    assert [o.name for o in src.objects()] == ["web"]


def test_set_endpoints_rejects_bad_addresses() -> None:
    """An address without a port raises InvalidArgument quoting it."""
    with pytest.raises(InvalidArgument, match=r"'127\.0\.0\.1'"):
        MemorySource().set_endpoints("web", ["127.0.0.1"])


async def test_a_source_runs_only_once_at_a_time() -> None:
    """A second concurrent run() raises InvalidArgument."""
    src = MemorySource()
    col = Collector()
    async with running(lambda: src.run(col.emit, col.synced)):
        with pytest.raises(InvalidArgument, match="already running"):
            await src.run(col.emit, col.synced)


def test_memory_source_is_a_source() -> None:
    """MemorySource satisfies the Source protocol."""
    assert isinstance(MemorySource(), Source)
