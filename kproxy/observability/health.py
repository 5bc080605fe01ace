"""kube-proxy's ``/healthz`` and ``/livez``: the proxier health state and its HTTP answers.

Theory of operation (``pkg/proxy/healthcheck/proxy_health.go``)
----------------------------------------------------------------
:meth:`ProxyHealth.queued` is called when a change that needs a sync arrives (kube-proxy's
``QueuedUpdate``); it remembers the *oldest* such change. :meth:`ProxyHealth.updated` is called
after every successful sync (``Updated``); it forgets the queued change and records the time.
The proxy is unhealthy when a queued change has waited ``timeout_s`` or longer (kube-proxy passes
twice ``--sync-period``); it is healthy while starting up (before its first successful sync),
and again after the next successful sync. So a proxy whose syncs keep failing turns unhealthy
even while new changes keep arriving: the oldest one is never forgotten.

``/healthz`` also requires the node to be eligible (not being deleted, not tainted
``ToBeDeletedByClusterAutoscaler``); ``/livez`` ignores the node. Both answer JSON: healthy
answers report ``lastUpdated`` = ``currentTime``, as kube-proxy does for compatibility.

Pure: times come from an injected :class:`~kproxy.clock.Clock` (decisions) and a wall-clock
callable (the times shown).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from dataclasses import dataclass

from kproxy.clock import Clock
from kproxy.errors import InvalidArgument

__all__ = ["HealthAnswer", "ProxyHealth", "go_time"]


def go_time(epoch_s: float | None) -> str:
    """Wall-clock seconds as Go's ``time.Time.String()`` prints them in UTC (what kube-proxy's ``%q`` shows).

    ``None`` is Go's zero time, ``0001-01-01 00:00:00 +0000 UTC``. Fractions print to the
    nanosecond without trailing zeros, as Go's ``.999999999`` layout.
    """
    if epoch_s is None:
        return "0001-01-01 00:00:00 +0000 UTC"
    whole = math.floor(epoch_s)
    nanos = round((epoch_s - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    when = datetime.datetime.fromtimestamp(whole, tz=datetime.UTC)
    frac = f".{nanos:09d}".rstrip("0") if nanos else ""
    return when.strftime("%Y-%m-%d %H:%M:%S") + frac + " +0000 UTC"


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthAnswer:
    """One HTTP answer of ``/healthz`` or ``/livez``.

    Attributes:
        status: 200 or 503.
        body: the JSON text kube-proxy writes.
    """

    status: int
    body: str


class ProxyHealth:
    """The proxier's health, as kube-proxy's ``ProxyHealthServer`` keeps it.

    Args:
        timeout_s: how long a queued change may wait before the proxy is unhealthy (seconds,
            > 0; kube-proxy: ``2 * syncPeriod``).
        clock: monotonic time for the decisions.
        wall: wall-clock seconds (``time.time``) for the times shown.

    Raises:
        InvalidArgument: ``timeout_s`` is not > 0.
    """

    def __init__(self, timeout_s: float, *, clock: Clock, wall: Callable[[], float]) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
            raise InvalidArgument(f"timeout_s must be > 0 seconds, got {timeout_s=!r}")
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self._wall = wall
        self._oldest_queued: float | None = None
        self._last_updated: tuple[float, float] | None = None  # (clock, wall)
        self.node_eligible = True
        """False once the node is being deleted or tainted ``ToBeDeletedByClusterAutoscaler``."""

    def queued(self) -> None:
        """A change needing a sync arrived (kube-proxy's ``QueuedUpdate``): keep the oldest."""
        if self._oldest_queued is None:
            self._oldest_queued = self._clock.now()

    def updated(self) -> None:
        """A sync succeeded (``Updated``): nothing is waiting any more."""
        self._oldest_queued = None
        self._last_updated = (self._clock.now(), self._wall())

    @property
    def oldest_queued_age_s(self) -> float | None:
        """Seconds the oldest unsynced change has waited, or None."""
        return None if self._oldest_queued is None else self._clock.now() - self._oldest_queued

    @property
    def last_updated_wall(self) -> float | None:
        """Wall-clock seconds of the last successful sync, or None."""
        return None if self._last_updated is None else self._last_updated[1]

    def is_healthy(self) -> bool:
        """Healthy while starting up, or when no change has waited ``timeout_s`` or longer."""
        if self._last_updated is None or self._oldest_queued is None:
            return True
        return self._clock.now() - self._oldest_queued < self.timeout_s

    def healthz(self) -> HealthAnswer:
        """The ``/healthz`` answer: the proxier's health and the node's eligibility."""
        healthy = self.is_healthy() and self.node_eligible
        return self._answer(healthy, extra=f', "nodeEligible": {str(self.node_eligible).lower()}')

    def livez(self) -> HealthAnswer:
        """The ``/livez`` answer: the proxier's health only."""
        return self._answer(self.is_healthy(), extra="")

    def _answer(self, healthy: bool, *, extra: str) -> HealthAnswer:
        now = self._wall()
        last = now if healthy else self.last_updated_wall
        body = f'{{"lastUpdated": "{go_time(last)}","currentTime": "{go_time(now)}"{extra}}}'
        return HealthAnswer(status=200 if healthy else 503, body=body)
