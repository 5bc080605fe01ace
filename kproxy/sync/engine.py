"""The sync engine: source -> change tracker -> bounded-frequency runner -> consumers.

Theory of operation
-------------------
The source's events are folded into a :class:`~kproxy.sync.tracker.ChangeTracker` as they
arrive; once the source has said ``synced()`` each batch that leaves changes pending requests a
run (kube-proxy's ``OnServiceUpdate`` -> ``syncRunner.Run()`` once ``isInitialized``). Nothing
is synced before that, as kube-proxy waits for both its informers.

A run checks out a Snapshot when there are pending changes, on the first run and on every
periodic run, and hands it to every consumer in order (``await consumer.apply(snapshot)``).
A consumer must apply a snapshot wholly or not at all. If one raises, the error is logged, the
engine's :attr:`SyncEngine.snapshot` stays the last one every consumer accepted, and the run
fails so that the runner retries it. On the retry a consumer that failed gets the current
Snapshot with ``changed`` naming every port it has and had (a full sync, as kube-proxy's
``needFullSync`` after a failed sync); a consumer that did not fail and already holds the
current Snapshot is not called again.

Large changes stay off the event loop's critical path (the loop also carries the userspace
proxy's traffic): a batch of at least :data:`LARGE_BATCH` events is folded into the tracker in
a worker thread, and so is a checkout with at least :data:`LARGE_BATCH` pending Services
(building their ServicePortInfos is the expensive part). While the tracker is in a worker
thread, events arriving meanwhile (and node changes) wait in an inbox, in order, and are folded
in afterwards; ``synced()`` takes effect only once everything emitted before it is folded in.
Only one thread touches the tracker at a time, and never the loop while a thread does.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar, runtime_checkable

import structlog

from kproxy.clock import Clock, MonotonicClock
from kproxy.errors import InvalidArgument
from kproxy.model import NodeConfig, Snapshot
from kproxy.sources._gcpause import collector_paused
from kproxy.sources.base import Event, Source
from kproxy.sync.runner import BoundedFrequencyRunner, RunReason
from kproxy.sync.tracker import ChangeTracker

__all__ = ["LARGE_BATCH", "Consumer", "SyncEngine", "consumer_name"]

#: Events in one batch (or Services pending at a checkout) from which the tracker's work moves to a
#: worker thread. About 1 ms of work per 10 Services on the loop: below this it costs less than the
#: thread hand-off, above it would stall connections served by the same loop.
LARGE_BATCH = 256

_log = structlog.get_logger("kproxy.sync")
_T = TypeVar("_T")


@runtime_checkable
class Consumer(Protocol):
    """Anything that programs a Snapshot (a mode's applier, a recorder in tests)."""

    async def apply(self, snapshot: Snapshot) -> None:
        """Program ``snapshot`` wholly, or raise and leave the previous state in force."""
        ...


def _paused(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` with the cyclic collector paused (see :mod:`kproxy.sources._gcpause`)."""
    with collector_paused():
        return fn(*args)


def _fold(tracker: ChangeTracker, items: Sequence[Event | NodeConfig]) -> bool:
    """Apply events and node changes in order (in a worker thread); whether the node changed."""
    node_changed = False
    for item in items:
        if isinstance(item, NodeConfig):
            node_changed = tracker.set_node(item) or node_changed
        else:
            tracker.apply(item)
    return node_changed


def consumer_name(consumer: object) -> str:
    """What log lines call a consumer: its ``description`` when it has one, else its class name."""
    description = getattr(consumer, "description", None)
    return description if isinstance(description, str) and description else type(consumer).__name__


def _seconds(name: str, value: float, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) \
            or math.isinf(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(f"{name} must be a finite number of seconds {bound}, got {name}={value!r}")
    return float(value)


class SyncEngine:
    """Wire a source to consumers through a change tracker and a bounded-frequency runner.

    Args:
        source: where events come from (:class:`~kproxy.sources.base.Source`).
        node: the node Snapshots are built for.
        consumers: what programs each Snapshot, in order.
        min_sync_period_s: seconds between the end of a sync and the next (kube-proxy's
            ``--min-sync-period``, default 1 s).
        sync_period_s: seconds after which a sync happens anyway (``--sync-period``, 30 s).
        retry_period_s: seconds after a failed sync before it is retried; None means
            ``sync_period_s``, as kube-proxy's ``RetryAfter(syncPeriod)``.
        clock: the time source (default :class:`~kproxy.clock.MonotonicClock`).

    Raises:
        InvalidArgument: a negative, zero (except ``min_sync_period_s``) or non-finite period;
            ``min_sync_period_s`` > ``sync_period_s``; a consumer without ``apply``; a source
            without ``run``; ``node`` not a NodeConfig.
    """

    def __init__(
        self,
        source: Source,
        node: NodeConfig,
        consumers: Sequence[Consumer],
        *,
        min_sync_period_s: float = 1.0,
        sync_period_s: float = 30.0,
        retry_period_s: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(source, Source):
            raise InvalidArgument(f"source must have an async run(emit, synced), got {source!r}")
        for i, consumer in enumerate(consumers):
            if not isinstance(consumer, Consumer):
                raise InvalidArgument(
                    f"consumers[{i}] must have an async apply(snapshot), got {consumer!r}")
        min_s = _seconds("min_sync_period_s", min_sync_period_s, allow_zero=True)
        max_s = _seconds("sync_period_s", sync_period_s, allow_zero=False)
        if min_s > max_s:
            raise InvalidArgument(
                f"min_sync_period_s ({min_s}) must be <= sync_period_s ({max_s}); lower "
                "--min-sync-period or raise --sync-period")
        retry_s = None if retry_period_s is None else _seconds(
            "retry_period_s", retry_period_s, allow_zero=False)
        self._clock: Clock = clock or MonotonicClock()
        self._source = source
        self._consumers = tuple(consumers)
        self.tracker = ChangeTracker(node, now=self._clock.now)
        self.runner = BoundedFrequencyRunner(
            self._sync, min_interval_s=min_s, max_interval_s=max_s, retry_interval_s=retry_s,
            clock=self._clock, name="sync-engine")
        self._synced = asyncio.Event()
        self._progress = asyncio.Event()
        self._current: Snapshot | None = None
        self._applied: list[Snapshot | None] = [None] * len(self._consumers)
        self._failed: list[bool] = [False] * len(self._consumers)
        self._snapshot: Snapshot | None = None
        self._conflicts: set[str] = set()
        self._inbox: list[Event | NodeConfig] = []
        self._inbox_ready = asyncio.Event()
        self._in_thread = False
        self._tracker_free = asyncio.Event()
        self._tracker_free.set()
        self._synced_waiting = False
        self.last_sync_time: float | None = None
        """Clock time (seconds) when the last successful sync ended, or None."""
        self.sync_count = 0
        """How many syncs every consumer accepted."""
        self.failure_count = 0
        """How many syncs at least one consumer refused."""

    @property
    def snapshot(self) -> Snapshot | None:
        """The last Snapshot every consumer applied, or None before the first successful sync."""
        return self._snapshot

    @property
    def is_synced(self) -> bool:
        """The source has delivered its initial state."""
        return self._synced.is_set()

    def oldest_pending_age(self) -> float | None:
        """Seconds since the oldest change not yet synced was queued, or None when all are synced."""
        since = self.tracker.oldest_pending_since()
        return None if since is None else self._clock.now() - since

    async def wait_synced(self, min_revision: int = 1) -> Snapshot:
        """Wait until a Snapshot with revision >= ``min_revision`` has been applied by every consumer.

        Returns:
            That snapshot (:attr:`snapshot` at that moment).

        Raises:
            InvalidArgument: ``min_revision`` < 1.
        """
        if isinstance(min_revision, bool) or not isinstance(min_revision, int) or min_revision < 1:
            raise InvalidArgument(f"min_revision must be an int >= 1, got {min_revision=!r}")
        while self._snapshot is None or self._snapshot.revision < min_revision:
            await self._progress.wait()
        return self._snapshot

    async def run(self) -> None:
        """Run the source and, once it has synced, the runner, until cancelled.

        Raises:
            SourceError: the source failed (e.g. a manifest path is gone); the engine stops. An
                exception from the source or the runner is re-raised as itself when it is the
                only one, else as the ``ExceptionGroup`` of the TaskGroup.
        """
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._absorb(), name="sync-engine-inbox")
                tg.create_task(self._source.run(self._on_events, self._on_synced))
                await self._synced.wait()
                self.runner.request()
                tg.create_task(self.runner.run())
        except BaseExceptionGroup as group:
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from group
            raise

    def set_node(self, node: NodeConfig) -> None:
        """Proxy for ``node`` from now on (e.g. its zone label changed): every Service is resynced."""
        if self._in_thread or self._inbox:
            self._defer([node])
        elif self.tracker.set_node(node) and self._synced.is_set():
            self.runner.request()

    # -- callbacks from the source -----------------------------------------------------------

    def _on_events(self, events: Sequence[Event]) -> None:
        if self._in_thread or self._inbox or len(events) >= LARGE_BATCH:
            self._defer(events)
            return
        self.tracker.apply_all(events)
        if self._synced.is_set() and self.tracker.pending_count:
            self.runner.request()

    def _on_synced(self) -> None:
        if self._in_thread or self._inbox:
            self._synced_waiting = True  # takes effect once what came before is folded in
            return
        if not self._synced.is_set():
            _log.info("source synced", pending_services=self.tracker.pending_count)
        self._synced.set()

    def _defer(self, items: Sequence[Event | NodeConfig]) -> None:
        self._inbox.extend(items)
        self._inbox_ready.set()

    async def _absorb(self) -> None:
        """Fold the inbox into the tracker in a worker thread, whenever it fills, until cancelled."""
        while True:
            await self._inbox_ready.wait()
            self._inbox_ready.clear()
            if self._in_thread or not self._inbox:
                continue  # a checkout holds the tracker; it wakes this loop when done
            batch, self._inbox = self._inbox, []
            node_changed = await self._in_worker(_fold, self.tracker, batch)
            if self._synced_waiting and not self._inbox:
                self._synced_waiting = False
                self._on_synced()
            if self._synced.is_set() and (self.tracker.pending_count or node_changed):
                self.runner.request()

    async def _in_worker(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` in a worker thread with the tracker reserved for it.

        Cancelled meanwhile, it waits for the thread to finish before releasing the tracker (a
        thread cannot be stopped halfway), then re-raises the cancellation.
        """
        self._in_thread = True
        self._tracker_free.clear()
        work = asyncio.get_running_loop().run_in_executor(None, _paused, fn, *args)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            await asyncio.wait({work})
            raise
        finally:
            self._in_thread = False
            self._tracker_free.set()
            if self._inbox:
                self._inbox_ready.set()

    # -- one sync ----------------------------------------------------------------------------

    async def _sync(self, reason: RunReason) -> None:
        checkout = (self._current is None or self.tracker.pending_count > 0
                    or reason is RunReason.PERIODIC)
        if checkout:
            while self._in_thread:  # the inbox is being folded in: check out after it
                await self._tracker_free.wait()
            if self.tracker.pending_count >= LARGE_BATCH:
                self._current = await self._in_worker(self.tracker.checkout)
            else:
                self._current = self.tracker.checkout()
            self._report_conflicts()
        current = self._current
        assert current is not None
        errors: list[Exception] = []
        for i, consumer in enumerate(self._consumers):
            if self._applied[i] is current and not self._failed[i]:
                continue
            snapshot = self._for_consumer(i, current)
            try:
                await consumer.apply(snapshot)
            except Exception as err:
                self._failed[i] = True
                errors.append(err)
                # One line for the whole sync comes from the runner, with when it retries.
                _log.debug("consumer failed to apply snapshot; previous state kept",
                           consumer=consumer_name(consumer), revision=current.revision, error=str(err),
                           exc_info=err)
            else:
                self._applied[i] = current
                self._failed[i] = False
        if errors:
            self.failure_count += 1
            failed = [c for c, f in zip(self._consumers, self._failed, strict=True) if f]
            detail = "; ".join(f"{consumer_name(c)}: {' '.join(str(e).split()) or type(e).__name__}"
                               for c, e in zip(failed, errors, strict=True))
            raise ExceptionGroup(f"revision {current.revision} not applied ({detail}); previous state kept",
                                 errors)
        self._snapshot = current
        self.last_sync_time = self._clock.now()
        self.sync_count += 1
        log = _log.info if current.changed else _log.debug
        log("synced", revision=current.revision, reason=str(reason),
            changed=len(current.changed), ports=len(current))
        self._progress.set()
        self._progress = asyncio.Event()

    def _report_conflicts(self) -> None:
        """Warn once about each ClusterIP shared by several Services (the tracker finds them)."""
        now = {str(c): c for c in self.tracker.conflicts}
        for text in now.keys() - self._conflicts:
            conflict = now[text]
            _log.warning(
                "two Services use the same ClusterIP and port; the API server never allows this, so "
                "kube-proxy has no rule for it (its rules match in Go map order); kproxy programs both "
                "in namespace/name order: where both have endpoints the first one gets the traffic",
                address=conflict.address, services=[str(p) for p in conflict.ports],
                files=list(conflict.sources), first=str(conflict.ports[0]))
        self._conflicts = set(now)

    def _for_consumer(self, i: int, current: Snapshot) -> Snapshot:
        """``current`` as consumer ``i`` needs it: with a full ``changed`` after a failure or a gap."""
        last = self._applied[i]
        if not self._failed[i] and (
                (last is None and current.revision == 1)
                or (last is not None and last.revision == current.revision - 1)):
            return current
        every = {spn for _, spn in current.ports}
        if last is not None:
            every |= {spn for _, spn in last.ports}
        return replace(current, changed=frozenset(every))
