"""Large batches are folded and checked out in a worker thread, without losing order or the synced point."""

from __future__ import annotations

import asyncio
import threading

from kproxy.model import NodeConfig, Snapshot
from kproxy.sources import Emit, Synced
from kproxy.sync import SyncEngine
from kproxy.sync.engine import LARGE_BATCH
from kproxy.sync.tracker import ChangeTracker
from tests.unit.sync.builders import added, deleted, eps, running, svc

COUNT = 4 * LARGE_BATCH


def _ip(i: int) -> str:
    return f"10.96.{i // 250}.{i % 250 + 1}"


class _BigThenSmall:
    """Emits one large batch, synced, then small changes at once (while the big one is folded)."""

    async def run(self, emit: Emit, synced: Synced) -> None:
        """Emit, then wait to be cancelled."""
        emit([e for i in range(COUNT) for e in (added(svc(f"s{i}", _ip(i))),
                                               added(eps(f"s{i}-a", f"s{i}", [f"10.1.0.{i % 250 + 1}"])))])
        synced()
        emit([deleted(svc("s0", _ip(0)))])
        emit([added(svc("late", "10.97.0.1"))])
        await asyncio.Event().wait()


class _Keep:
    """A consumer keeping every Snapshot it gets."""

    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    async def apply(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot``."""
        self.snapshots.append(snapshot)


async def test_a_large_batch_then_small_changes_end_in_the_right_state() -> None:
    """The first Snapshot holds the whole large batch; changes emitted meanwhile apply after it, in order."""
    keep = _Keep()
    engine = SyncEngine(_BigThenSmall(), NodeConfig(hostname="n"), [keep], min_sync_period_s=0.0)
    async with running(engine.run):
        async with asyncio.timeout(30):
            while engine.snapshot is None or engine.snapshot.get("default/late") is None:
                await asyncio.sleep(0.01)
    first = keep.snapshots[0]
    assert len(first) >= COUNT - 1  # never an empty or partial first sync
    last = keep.snapshots[-1]
    assert last.get("default/s0") is None and last.get("default/late") is not None
    assert len(last) == COUNT  # s0 gone, late added
    assert last.get(f"default/s{COUNT - 1}") is not None


async def test_a_large_checkout_runs_in_a_worker_thread() -> None:
    """The checkout of many pending Services happens on a thread other than the event loop's."""
    threads: list[int] = []
    original = ChangeTracker.checkout

    def recording(self: ChangeTracker) -> Snapshot:
        threads.append(threading.get_ident())
        return original(self)

    engine = SyncEngine(_BigThenSmall(), NodeConfig(hostname="n"), [_Keep()], min_sync_period_s=0.0)
    engine.tracker.checkout = recording.__get__(engine.tracker)  # type: ignore[method-assign]
    async with running(engine.run):
        await engine.wait_synced(1)
    assert threads and threads[0] != threading.get_ident()
