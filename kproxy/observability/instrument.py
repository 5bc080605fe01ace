"""Tie a source, the sync engine and a consumer to the proxy's health and metrics.

kube-proxy's proxiers call ``healthzServer.QueuedUpdate`` and set the "last queued" metric when
a change is queued for sync, and ``Updated`` with the sync duration, "last synced" and network
programming latencies after a successful sync. kproxy gets the same hooks without touching the
engine: :meth:`Instruments.source` wraps the source's ``emit`` (events seen; a change queued
once the engine is synced and has pending changes) and :meth:`Instruments.consumer` wraps the
consumer that programs the data plane (its duration and outcome).

Network programming latency is ``now - last-change-trigger-time`` of each EndpointSlice
change, observed after the sync that applied it (a change whose Service is still pending in
the engine's tracker waits for the next sync). As kube-proxy, trigger times from before the
proxy started are ignored, the wall clock of the API server is trusted, and a deleted
EndpointSlice adds no observation (kube-proxy's ``EndpointsChangeTracker`` ignores deletions,
kubernetes PR #95363: a deletion's trigger time says when the slice last changed, not when it
went away).

``kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`` is set when the source starts, as
kube-proxy's ``SyncLoop`` synthesises it "as the informers are syncing" (PR #90972), so a quiet
cluster and a restarted proxy have a sample; afterwards each change queued for sync sets it.

A failed apply counts in ``kubeproxy_sync_proxy_rules_iptables_restore_failures_total`` for the
IP family whose consumer failed only: :meth:`Instruments.consumer` takes the per-family
consumers (a mode's ``config.family``, or a ``family`` attribute), applies them in order as one
timed sync and attributes a failure to the family of the one that raised; a consumer without a
family counts for every family.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from kproxy.clock import Clock
from kproxy.model import EndpointSlice, IPFamily, NamespacedName, Service, Snapshot
from kproxy.observability.health import ProxyHealth
from kproxy.observability.metrics import ProxyMetrics
from kproxy.sources.base import Emit, Event, EventType, Source, Synced
from kproxy.sync.engine import Consumer, SyncEngine, consumer_name

__all__ = ["Instruments", "family_of", "parse_trigger_time"]

_log = structlog.get_logger("kproxy.observability")


def parse_trigger_time(text: str) -> float | None:
    """Wall-clock seconds of an RFC 3339 ``last-change-trigger-time``, or None when empty or unreadable."""
    if not text:
        return None
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    if "." in raw:  # Python reads at most 6 fractional digits; the API may write 9
        head, _, rest = raw.partition(".")
        digits = "".join(ch for ch in rest if ch.isdigit())
        raw = f"{head}.{digits[:6]}{rest[len(digits):]}"
    try:
        when = datetime.datetime.fromisoformat(raw)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


class Instruments:
    """The hooks between the engine and :class:`ProxyHealth` / :class:`ProxyMetrics`.

    Args:
        health: the proxy's health state.
        metrics: the metrics.
        clock: monotonic time for sync durations.
        wall: wall-clock seconds, for network programming latency.
    """

    def __init__(self, health: ProxyHealth, metrics: ProxyMetrics, *, clock: Clock,
                 wall: Callable[[], float]) -> None:
        self.health = health
        self.metrics = metrics
        self._clock = clock
        self._wall = wall
        self._start_wall = wall()
        self._engine: SyncEngine | None = None
        self._triggers: list[tuple[NamespacedName, float]] = []
        self._pending_services: set[NamespacedName] = set()
        self._pending_endpoints: set[NamespacedName] = set()

    def attach(self, engine: SyncEngine) -> None:
        """Read the engine's tracker to know whether events left changes pending."""
        self._engine = engine

    def source(self, inner: Source) -> Source:
        """``inner`` with its events observed on their way to the engine."""
        return _ObservedSource(inner, self._on_events, self._on_start)

    def consumer(self, inner: Consumer, *more: Consumer) -> Consumer:
        """``inner`` (then ``more``, in order) as one consumer whose syncs are timed, counted and reported.

        Args:
            inner, more: the consumers that program the data plane, e.g. one mode per IP
                family. They are applied in order; the first that raises ends the sync, and
                the failure is counted for its family only (:func:`family_of`).

        Returns:
            A :class:`~kproxy.sync.engine.Consumer`; a failure is re-raised as itself.
        """
        return _TimedConsumer((inner, *more), self)

    # -- hooks -------------------------------------------------------------------------------

    def _on_events(self, events: Sequence[Event]) -> None:
        services = slices = 0
        for event in events:
            obj = event.obj
            if isinstance(obj, Service):
                services += 1
                self._pending_services.add(obj.key)
            elif isinstance(obj, EndpointSlice):
                slices += 1
                self._pending_endpoints.add(obj.service)
                if event.type is EventType.DELETED:  # kube-proxy ignores deletions (PR #95363)
                    continue
                when = parse_trigger_time(obj.trigger_time)
                if when is not None and when >= self._start_wall:
                    self._triggers.append((obj.service, when))
        self.metrics.changes(services=services, endpoint_slices=slices)
        self.metrics.pending(services=len(self._pending_services), endpoints=len(self._pending_endpoints))
        engine = self._engine
        if engine is not None and engine.is_synced and engine.tracker.pending_count:
            self.health.queued()
            self.metrics.queued()

    def _on_synced(self, duration_s: float) -> None:
        still = set() if self._engine is None else {p.service for p in self._engine.tracker.pending()}
        now = self._wall()
        done = [now - t for name, t in self._triggers if name not in still]
        self._triggers = [(name, t) for name, t in self._triggers if name in still]
        self._pending_services &= still
        self._pending_endpoints &= still
        self.metrics.pending(services=len(self._pending_services), endpoints=len(self._pending_endpoints))
        self.metrics.synced(duration_s, done)
        self.health.updated()

    def _on_failed(self, family: str | None) -> None:
        self.metrics.sync_failed(family)

    def _on_start(self) -> None:
        self.metrics.queued()


def family_of(consumer: Consumer) -> str | None:
    """The IP family (``"IPv4"``/``"IPv6"``) a consumer programs, or None when it has none.

    Read from ``consumer.family`` or ``consumer.config.family`` (the iptables and IPVS modes
    carry one family each, as kube-proxy runs one proxier per family).
    """
    for holder in (consumer, getattr(consumer, "config", None)):
        family = getattr(holder, "family", None)
        if isinstance(family, IPFamily | str) and str(family) in ("IPv4", "IPv6"):
            return str(family)
    return None


class _ObservedSource:
    def __init__(self, inner: Source, on_events: Callable[[Sequence[Event]], None],
                 on_start: Callable[[], None]) -> None:
        self._inner = inner
        self._on_events = on_events
        self._on_start = on_start

    def __getattr__(self, name: str) -> Any:  # status(), options ... of the wrapped source
        return getattr(self._inner, name)

    async def run(self, emit: Emit, synced: Synced) -> None:
        def observed(events: Sequence[Event]) -> None:
            emit(events)
            self._on_events(events)

        self._on_start()
        await self._inner.run(observed, synced)


class _TimedConsumer:
    def __init__(self, inners: tuple[Consumer, ...], instruments: Instruments) -> None:
        self._inners = inners
        self._instruments = instruments

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inners[0], name)

    @property
    def description(self) -> str:
        """What log lines call it: each consumer and its family, e.g. ``IptablesMode (IPv4)``."""
        names = [consumer_name(c) + (f" ({family})" if (family := family_of(c)) else "")
                 for c in self._inners]
        return " + ".join(names)

    async def apply(self, snapshot: Snapshot) -> None:
        clock = self._instruments._clock
        start = clock.now()
        for inner in self._inners:
            try:
                await inner.apply(snapshot)
            except Exception:
                self._instruments._on_failed(family_of(inner))
                raise
        self._instruments._on_synced(clock.now() - start)
