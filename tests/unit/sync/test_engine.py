"""The sync engine end to end: MemorySource -> tracker -> runner -> a recording consumer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from kproxy.errors import InvalidArgument, SourceError
from kproxy.model import NodeConfig, ServicePortName, Snapshot
from kproxy.sources import Emit, ManifestSource, MemorySource, Synced
from kproxy.sync import FakeClock, SyncEngine, settle
from tests.unit.sync.builders import addresses, running

NODE = NodeConfig(hostname="node-a")
WEB = ServicePortName(namespace="default", name="web")
API = ServicePortName(namespace="default", name="api")


class Recording:
    """A consumer that records (time, snapshot) and raises on the chosen calls."""

    def __init__(self, clock: FakeClock, fail_on: set[int] | None = None) -> None:
        self.clock = clock
        self.fail_on = fail_on or set()
        self.calls: list[tuple[float, Snapshot]] = []

    async def apply(self, snapshot: Snapshot) -> None:
        self.calls.append((self.clock.now(), snapshot))
        if len(self.calls) in self.fail_on:
            raise OSError(f"apply {len(self.calls)} failed")

    @property
    def revisions(self) -> list[tuple[float, int]]:
        return [(t, s.revision) for t, s in self.calls]


def cluster() -> MemorySource:
    src = MemorySource()
    src.add_service("default/web", "10.0.0.1", [80])
    src.set_endpoints("default/web", ["127.0.0.2:8080", "127.0.0.3:8080"])
    return src


def engine(src: object, *consumers: Recording, clock: FakeClock) -> SyncEngine:
    return SyncEngine(src, NODE, consumers, min_sync_period_s=1.0,  # type: ignore[arg-type]
                      sync_period_s=30.0, clock=clock)


async def test_initial_state_is_synced_once_at_start() -> None:
    """The initial objects reach the consumer as revision 1 with every port changed."""
    clock = FakeClock()
    rec = Recording(clock)
    eng = engine(cluster(), rec, clock=clock)
    async with running(eng.run):
        snap = await eng.wait_synced(1)
    assert rec.revisions == [(0.0, 1)]
    assert snap is eng.snapshot and snap.changed == {WEB}
    assert addresses(snap, "default/web") == ["127.0.0.2:8080", "127.0.0.3:8080"]
    assert eng.sync_count == 1 and eng.last_sync_time == 0.0


async def test_changes_sync_after_the_min_period_and_coalesce() -> None:
    """Three changes at 0.2-0.4 s make one sync at 1.0 s naming only the changed ports."""
    clock = FakeClock()
    src = cluster()
    rec = Recording(clock)
    eng = engine(src, rec, clock=clock)
    async with running(eng.run):
        await clock.run_for(0.2)
        src.set_endpoints("default/web", ["127.0.0.4:8080"])
        src.add_service("default/api", "10.0.0.2", [443])
        await clock.run_for(0.2)
        src.set_endpoints("default/api", ["127.0.0.5:8443"])
        assert eng.oldest_pending_age() == pytest.approx(0.2)
        await clock.run_for(0.5)
        assert eng.sync_count == 1
        await clock.run_for(0.2)
    assert rec.revisions == [(0.0, 1), (1.0, 2)]
    snap = rec.calls[-1][1]
    assert snap.changed == {WEB, API}
    assert addresses(snap, "default/web") == ["127.0.0.4:8080"]
    assert addresses(snap, "default/api") == ["127.0.0.5:8443"]
    assert eng.oldest_pending_age() is None


async def test_periodic_sync_without_changes() -> None:
    """With no change, a sync happens every sync_period_s with an empty changed set."""
    clock = FakeClock()
    rec = Recording(clock)
    eng = engine(cluster(), rec, clock=clock)
    async with running(eng.run):
        await clock.run_for(61)
    assert rec.revisions == [(0.0, 1), (30.0, 2), (60.0, 3)]
    assert rec.calls[1][1].changed == frozenset()
    assert rec.calls[1][1].same_state(rec.calls[0][1])


async def test_no_sync_before_the_source_is_synced() -> None:
    """A source that never reports synced() gets nothing applied, even after the sync period."""

    class Silent:
        async def run(self, emit: Emit, synced: Synced) -> None:
            emit([])
            await asyncio.Event().wait()

    clock = FakeClock()
    rec = Recording(clock)
    eng = engine(Silent(), rec, clock=clock)
    async with running(eng.run):
        await clock.run_for(100)
    assert rec.calls == [] and eng.snapshot is None and not eng.is_synced


async def test_failed_first_sync_is_retried_with_the_full_state() -> None:
    """A consumer failing the first sync leaves no snapshot in force and gets it all again at 30 s."""
    clock = FakeClock()
    rec = Recording(clock, fail_on={1})
    eng = engine(cluster(), rec, clock=clock)
    with capture_logs() as logs:
        async with running(eng.run):
            await clock.run_for(29)
            assert eng.snapshot is None and eng.failure_count == 1
            await clock.run_for(2)
    assert rec.revisions == [(0.0, 1), (30.0, 1)]
    assert rec.calls[1][1].changed == {WEB}
    assert eng.snapshot is not None and eng.snapshot.revision == 1
    assert any(e["event"].startswith("consumer failed") and e["revision"] == 1 for e in logs)


async def test_failure_keeps_last_good_snapshot_and_retry_is_a_full_sync() -> None:
    """When a change fails to apply, the last good snapshot stays and the retry names every port."""
    clock = FakeClock()
    src = cluster()
    src.add_service("default/api", "10.0.0.2", [443])
    rec = Recording(clock, fail_on={2})
    eng = engine(src, rec, clock=clock)
    async with running(eng.run):
        await eng.wait_synced(1)
        src.set_endpoints("default/web", ["127.0.0.9:8080"])
        await clock.run_for(1.5)
        assert eng.snapshot is not None and eng.snapshot.revision == 1
        await clock.run_for(30)
    assert rec.revisions[:3] == [(0.0, 1), (1.0, 2), (31.0, 2)]
    retried = rec.calls[2][1]
    assert retried.changed == {WEB, API}
    assert addresses(retried, "default/web") == ["127.0.0.9:8080"]
    assert eng.snapshot is not None and eng.snapshot.revision == 2


async def test_only_the_failed_consumer_is_called_on_retry() -> None:
    """A consumer that already holds the current snapshot is not called again by a retry."""
    clock = FakeClock()
    good, bad = Recording(clock), Recording(clock, fail_on={1})
    eng = engine(cluster(), good, bad, clock=clock)
    async with running(eng.run):
        await clock.run_for(31)
    assert good.revisions == [(0.0, 1)]
    assert bad.revisions == [(0.0, 1), (30.0, 1)]
    assert eng.snapshot is not None and eng.snapshot.revision == 1


async def test_wait_synced_waits_for_the_revision() -> None:
    """wait_synced(2) returns only after the second snapshot has been applied."""
    clock = FakeClock()
    src = cluster()
    eng = engine(src, Recording(clock), clock=clock)
    async with running(eng.run), asyncio.TaskGroup() as tg:
        waiter = tg.create_task(eng.wait_synced(2))
        await settle()
        assert not waiter.done()
        src.delete("Service", "default", "web")
        await clock.run_for(1)
    assert waiter.result().revision == 2 and len(waiter.result()) == 0


@pytest.mark.parametrize(("kw", "name"), [
    ({"min_sync_period_s": 40.0}, "min_sync_period_s"),
    ({"sync_period_s": 0.0}, "sync_period_s"),
    ({"min_sync_period_s": -1.0}, "min_sync_period_s"),
    ({"retry_period_s": float("nan")}, "retry_period_s"),
])
def test_arguments_are_validated_eagerly(kw: dict[str, float], name: str) -> None:
    """Impossible periods raise InvalidArgument naming the argument."""
    with pytest.raises(InvalidArgument, match=name):
        SyncEngine(MemorySource(), NODE, [], **kw)  # type: ignore[arg-type]


def test_consumer_without_apply_is_rejected() -> None:
    """A consumer lacking apply() raises InvalidArgument naming its index."""
    with pytest.raises(InvalidArgument, match=r"consumers\[0\]"):
        SyncEngine(MemorySource(), NODE, [object()])  # type: ignore[list-item]


async def test_source_error_stops_the_engine_and_is_raised_as_itself() -> None:
    """A source that fails makes run() raise its SourceError, unwrapped from the TaskGroup."""

    class Broken:
        async def run(self, emit: Emit, synced: Synced) -> None:
            raise SourceError("manifest path 'x.yaml' does not exist")

    eng = engine(Broken(), Recording(FakeClock()), clock=FakeClock())
    with pytest.raises(SourceError, match=r"x\.yaml"):
        await eng.run()


async def test_manifest_edit_reaches_the_consumer(tmp_path: Path) -> None:
    """With a ManifestSource, an edited file is applied at the next poll (0.5 s) as revision 2."""
    path = tmp_path / "web.yaml"
    text = ("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
            "spec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}\n---\n"
            "apiVersion: v1\nkind: Endpoints\nmetadata: {name: web}\n"
            "subsets: [{addresses: [{ip: ADDR}], ports: [{port: 8080}]}]\n")
    path.write_text(text.replace("ADDR", "127.0.0.2"))
    clock = FakeClock()
    rec = Recording(clock)
    src = ManifestSource([tmp_path], poll_interval_s=0.5, clock=clock, parse_in_thread=False)
    eng = engine(src, rec, clock=clock)
    async with running(eng.run):
        await clock.run_for(2)
        path.write_text(text.replace("ADDR", "127.0.0.33"))
        await clock.run_for(1)
    assert rec.revisions == [(0.0, 1), (2.5, 2)]
    assert addresses(rec.calls[-1][1], "default/web") == ["127.0.0.33:8080"]
