"""Prometheus metrics with kube-proxy's names and buckets (``pkg/proxy/metrics/metrics.go``).

Every :class:`ProxyMetrics` owns its ``CollectorRegistry``: nothing is registered in
prometheus-client's global default registry, so several proxies (or tests) in one process do
not collide. kube-proxy's metrics, where they apply to kproxy:

=========================================================  ========================================
``kubeproxy_sync_proxy_rules_duration_seconds``            histogram, 1 ms doubling to ~16 s
``kubeproxy_network_programming_duration_seconds``         histogram, 0, 0.25 s ... 300 s; from the
                                                           EndpointSlice ``last-change-trigger-time``
``kubeproxy_sync_proxy_rules_last_timestamp_seconds``      gauge per ``ip_family``, wall clock
``kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds`` gauge per ``ip_family``, wall clock
``kubeproxy_sync_proxy_rules_{service,endpoint}_changes_pending`` / ``_total``
``kubeproxy_sync_proxy_rules_iptables_restore_failures_total`` per ``ip_family``: failed applies
                                                           (of whatever the mode programs)
``kubeproxy_proxy_healthz_total``, ``kubeproxy_proxy_livez_total``  per HTTP ``code``
=========================================================  ========================================

kproxy's own, read at scrape time from live objects (:class:`LiveCollector`): the userspace
proxy's ``kproxy_userspace_connections_total``, ``kproxy_userspace_bytes_total`` (``direction``)
and ``kproxy_userspace_dial_failures_total`` per Service port, and the kube source's
``kproxy_source_*`` counters with ``kproxy_source_last_activity_age_seconds`` (watch staleness).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "NETWORK_PROGRAMMING_BUCKETS",
    "SYNC_DURATION_BUCKETS",
    "LiveCollector",
    "ProxyMetrics",
]


def _linear(start: float, width: float, count: int) -> list[float]:
    return [start + i * width for i in range(count)]


#: ``prometheus.ExponentialBuckets(0.001, 2, 15)``: 1 ms to 16.384 s.
SYNC_DURATION_BUCKETS: tuple[float, ...] = tuple(0.001 * 2 ** i for i in range(15))
#: kube-proxy's merge of a leading 0, 0.25 s and 0.5 s, 1..59 s, 60..115 s by 5, 120..300 s by 30.
NETWORK_PROGRAMMING_BUCKETS: tuple[float, ...] = tuple(
    [0.0, *_linear(0.25, 0.25, 2), *_linear(1, 1, 59), *_linear(60, 5, 12), *_linear(120, 30, 7)])


class ProxyMetrics:
    """kube-proxy's metrics in a registry of their own.

    Args:
        families: the IP families proxied (``"IPv4"``, ``"IPv6"``), for the ``ip_family`` label.
        wall: wall-clock seconds (``time.time``) for the timestamp gauges.
    """

    def __init__(self, *, families: Sequence[str] = ("IPv4",), wall: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._families = tuple(families)
        self._wall = wall
        r = self.registry
        self.sync_duration = Histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds",
            buckets=SYNC_DURATION_BUCKETS, registry=r)
        self.network_programming = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            buckets=NETWORK_PROGRAMMING_BUCKETS, registry=r)
        self.last_sync = Gauge("kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                               "The last time proxy rules were successfully synced", ["ip_family"],
                               registry=r)
        self.last_queued = Gauge("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                                 "The last time a sync of proxy rules was queued", ["ip_family"], registry=r)
        self.endpoint_pending = Gauge("kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                                      "Pending proxy rules Endpoint changes", registry=r)
        self.endpoint_total = Counter("kubeproxy_sync_proxy_rules_endpoint_changes",
                                      "Cumulative proxy rules Endpoint changes", registry=r)
        self.service_pending = Gauge("kubeproxy_sync_proxy_rules_service_changes_pending",
                                     "Pending proxy rules Service changes", registry=r)
        self.service_total = Counter("kubeproxy_sync_proxy_rules_service_changes",
                                     "Cumulative proxy rules Service changes", registry=r)
        self.restore_failures = Counter("kubeproxy_sync_proxy_rules_iptables_restore_failures",
                                        "Cumulative proxy rules apply failures", ["ip_family"], registry=r)
        self.healthz = Counter("kubeproxy_proxy_healthz", "Cumulative proxy healthz HTTP status", ["code"],
                               registry=r)
        self.livez = Counter("kubeproxy_proxy_livez", "Cumulative proxy livez HTTP status", ["code"],
                             registry=r)
        for family in self._families:
            self.restore_failures.labels(ip_family=family)

    def changes(self, *, services: int, endpoint_slices: int) -> None:
        """Count Service and EndpointSlice events received."""
        if services:
            self.service_total.inc(services)
        if endpoint_slices:
            self.endpoint_total.inc(endpoint_slices)

    def pending(self, *, services: int, endpoints: int) -> None:
        """Set how many Services have Service or endpoint changes not yet synced."""
        self.service_pending.set(services)
        self.endpoint_pending.set(endpoints)

    def queued(self) -> None:
        """A sync was queued now."""
        now = self._wall()
        for family in self._families:
            self.last_queued.labels(ip_family=family).set(now)

    def synced(self, duration_s: float, latencies_s: Iterable[float] = ()) -> None:
        """A sync succeeded after ``duration_s`` seconds, with these network programming latencies (s)."""
        self.sync_duration.observe(duration_s)
        now = self._wall()
        for family in self._families:
            self.last_sync.labels(ip_family=family).set(now)
        for latency in latencies_s:
            self.network_programming.observe(max(latency, 0.0))

    def sync_failed(self, family: str | None = None) -> None:
        """A sync failed to apply for ``family`` (``"IPv4"``/``"IPv6"``), or for every family when None.

        kube-proxy counts ``iptables_restore_failures_total`` in the proxier of the family whose
        restore failed; a family not proxied here is counted as given (it names what failed).
        """
        for name in self._families if family is None else (family,):
            self.restore_failures.labels(ip_family=name).inc()

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)


class _HasStats(Protocol):
    def stats(self) -> Any: ...


class _HasStatus(Protocol):
    def status(self) -> Any: ...


class LiveCollector(Collector):
    """Metrics read at scrape time from a userspace proxy's ``stats()`` and a kube source's ``status()``.

    Args:
        proxy: an object with ``stats() -> {(service, protocol, family): TcpStats | UdpStats}``, or None.
        source: an object with ``status() -> tuple[ReflectorStatus, ...]``, or None.
        now: the clock of the source's ``last_activity`` (seconds).
    """

    def __init__(self, *, proxy: _HasStats | None = None, source: _HasStatus | None = None,
                 now: Callable[[], float] | None = None) -> None:
        self._proxy = proxy
        self._source = source
        self._now = now

    def collect(self) -> Iterator[Metric]:
        """Yield the current values."""
        if self._proxy is not None:
            yield from self._userspace()
        if self._source is not None:
            yield from self._reflectors()

    def describe(self) -> Iterator[Metric]:
        """Nothing to describe ahead of time (values are read at scrape time)."""
        return iter(())

    def _userspace(self) -> Iterator[Metric]:
        labels = ["service", "protocol", "ip_family"]
        conns = CounterMetricFamily("kproxy_userspace_connections",
                                    "Connections (TCP) or sessions (UDP) accepted", labels=labels)
        dials = CounterMetricFamily("kproxy_userspace_dial_failures", "Endpoint dials that failed",
                                    labels=labels)
        nbytes = CounterMetricFamily("kproxy_userspace_bytes", "Payload bytes relayed",
                                     labels=[*labels, "direction"])
        assert self._proxy is not None
        for (service, protocol, family), st in sorted(self._proxy.stats().items(), key=lambda kv: str(kv[0])):
            key = [str(service), str(protocol), str(family)]
            conns.add_metric(key, float(getattr(st, "accepted", getattr(st, "sessions_opened", 0))))
            dials.add_metric(key, float(getattr(st, "dial_failures", 0)))
            nbytes.add_metric([*key, "to_endpoint"], float(st.bytes_to_endpoint))
            nbytes.add_metric([*key, "to_client"], float(st.bytes_to_client))
        yield from (conns, dials, nbytes)

    def _reflectors(self) -> Iterator[Metric]:
        assert self._source is not None
        statuses = self._source.status()
        counters = {"lists": "List requests started (the first, and every relist)",
                    "watches": "Watch requests started", "failures": "API requests that failed",
                    "expired": "Watches answered 410 Gone (resource version expired)",
                    "stalls": "Watches restarted after falling silent",
                    "malformed": "Malformed objects or events skipped",
                    "quorum_lists": "Lists read from etcd (no resource version) rather than the watch cache"}
        for field, help_text in counters.items():
            family = CounterMetricFamily(f"kproxy_source_{field}", help_text, labels=["kind"])
            for st in statuses:
                family.add_metric([st.kind], float(getattr(st, field)))
            yield family
        age = GaugeMetricFamily("kproxy_source_last_activity_age_seconds",
                                "Seconds since the API last sent anything on this kind's list or watch",
                                labels=["kind"])
        now = self._now() if self._now is not None else None
        for st in statuses:
            if now is not None:
                age.add_metric([st.kind], max(now - st.last_activity, 0.0))
        yield age
