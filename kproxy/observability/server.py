"""The health and metrics HTTP servers, and :class:`Observability`, which the daemon runs beside the engine.

Addresses follow kube-proxy's flags: ``--healthz-bind-address`` (``/healthz``, ``/livez``; port
10256) and ``--metrics-bind-address`` (``/metrics``, and ``/healthz`` and ``/proxyMode`` as
kube-proxy's metrics server has; port 10249). kproxy binds both to 127.0.0.1 by default:
kube-proxy's healthz default is 0.0.0.0 because cloud load balancers probe it from outside the
node, but kproxy mostly runs on developer machines, where a health endpoint open to the network
is a surprise; pass ``--healthz-bind-address 0.0.0.0:10256`` to get kube-proxy's behaviour.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kproxy.clock import Clock, MonotonicClock
from kproxy.errors import ConfigError, InvalidArgument
from kproxy.observability.debug import DebugEndpoints, add_debug_routes
from kproxy.observability.health import ProxyHealth
from kproxy.observability.http import BindAddress, parse_bind_address, serving
from kproxy.observability.instrument import Instruments
from kproxy.observability.metrics import LiveCollector, ProxyMetrics
from kproxy.observability.service_health import ServiceHealthServer
from kproxy.sync.engine import SyncEngine

__all__ = [
    "DEFAULT_HEALTHZ_BIND_ADDRESS",
    "DEFAULT_METRICS_BIND_ADDRESS",
    "HEALTHZ_PORT",
    "METRICS_PORT",
    "Observability",
    "ObservabilityOptions",
    "healthz_app",
    "metrics_app",
]

_log = structlog.get_logger("kproxy.observability")

#: kube-proxy's ``ports.ProxyHealthzPort`` and ``ports.ProxyStatusPort``.
HEALTHZ_PORT = 10256
METRICS_PORT = 10249
DEFAULT_HEALTHZ_BIND_ADDRESS = f"127.0.0.1:{HEALTHZ_PORT}"
DEFAULT_METRICS_BIND_ADDRESS = f"127.0.0.1:{METRICS_PORT}"

_JSON_HEADERS = {"X-Content-Type-Options": "nosniff"}
#: Seconds between attempts to bind a health or metrics address that failed (kube-proxy: 5 s).
RETRY_BIND_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservabilityOptions:
    """Where the health and metrics endpoints listen.

    Attributes:
        healthz_bind_address: ``IP[:PORT]`` for ``/healthz`` and ``/livez``; ``""`` disables.
        metrics_bind_address: ``IP[:PORT]`` for ``/metrics``; ``""`` disables.
        health_check_addresses: the IPs health check node ports bind.
        health_timeout_s: how long a change may wait before ``/healthz`` says 503 (seconds);
            None means twice the sync period, as kube-proxy.
        node_eligible: the node's eligibility at start (see :class:`ProxyHealth`).
        proxy_mode: what ``/proxyMode`` answers.
        healthz_name, metrics_name: what error messages call the two addresses: the flag, or
            the ``--config`` file's field when the value came from there.
    """

    healthz_bind_address: str = DEFAULT_HEALTHZ_BIND_ADDRESS
    metrics_bind_address: str = DEFAULT_METRICS_BIND_ADDRESS
    health_check_addresses: tuple[str, ...] = ("127.0.0.1",)
    health_timeout_s: float | None = None
    node_eligible: bool = True
    proxy_mode: str = "userspace"
    healthz_name: str = "--healthz-bind-address"
    metrics_name: str = "--metrics-bind-address"


def healthz_app(health: ProxyHealth, metrics: ProxyMetrics | None = None) -> web.Application:
    """``/healthz`` and ``/livez`` as kube-proxy's health server answers them."""

    async def healthz(_: web.Request) -> web.Response:
        answer = health.healthz()
        if metrics is not None:
            metrics.healthz.labels(code=str(answer.status)).inc()
        return web.Response(status=answer.status, text=answer.body, content_type="application/json",
                            headers=_JSON_HEADERS)

    async def livez(_: web.Request) -> web.Response:
        answer = health.livez()
        if metrics is not None:
            metrics.livez.labels(code=str(answer.status)).inc()
        return web.Response(status=answer.status, text=answer.body, content_type="application/json",
                            headers=_JSON_HEADERS)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    return app


def metrics_app(metrics: ProxyMetrics, *, proxy_mode: str = "userspace", debug: DebugEndpoints | None = None,
                debug_why_not: str = "") -> web.Application:
    """``/metrics`` (Prometheus text), ``/healthz`` (``ok``) and ``/proxyMode``, as kube-proxy serves
    them, and kproxy's ``/debug/rules`` and ``/debug/trace`` (:mod:`kproxy.observability.debug`),
    answered by ``debug`` or, without one, 404 saying ``debug_why_not``."""

    async def render(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def mode(_: web.Request) -> web.Response:
        return web.Response(text=proxy_mode)

    app = web.Application()
    app.router.add_get("/metrics", render)
    app.router.add_get("/healthz", ok)
    app.router.add_get("/proxyMode", mode)
    add_debug_routes(app, debug, why_not=debug_why_not or f"{proxy_mode} mode")
    return app


class Observability:
    """Health, metrics and health check node ports for one running proxy.

    Args:
        options: addresses and timeouts.
        sync_period_s: the engine's sync period (seconds), for the default health timeout.
        families: the IP families proxied (``ip_family`` labels).
        clock: monotonic time (default real); ``wall``: wall-clock seconds (default ``time.time``).

    Raises:
        ConfigError: a bind address is malformed.
        InvalidArgument: ``sync_period_s`` is not > 0.
    """

    def __init__(self, options: ObservabilityOptions | None = None, *, sync_period_s: float = 30.0,
                 families: Sequence[str] = ("IPv4",), clock: Clock | None = None,
                 wall: Callable[[], float] | None = None) -> None:
        if not sync_period_s > 0:
            raise InvalidArgument(f"sync_period_s must be > 0 seconds, got {sync_period_s=}")
        self.options = options or ObservabilityOptions()
        self._healthz_at = parse_bind_address(self.options.healthz_bind_address, default_port=HEALTHZ_PORT,
                                              flag=self.options.healthz_name)
        self._metrics_at = parse_bind_address(self.options.metrics_bind_address, default_port=METRICS_PORT,
                                              flag=self.options.metrics_name)
        self._clock: Clock = clock or MonotonicClock()
        wall_clock = wall or time.time
        self.health = ProxyHealth(self.options.health_timeout_s or 2 * sync_period_s, clock=self._clock,
                                  wall=wall_clock)
        self.health.node_eligible = self.options.node_eligible
        self.metrics = ProxyMetrics(families=families, wall=wall_clock)
        self.instruments = Instruments(self.health, self.metrics, clock=self._clock, wall=wall_clock)
        self.service_health = ServiceHealthServer(self.options.health_check_addresses, health=self.health)
        self.healthz_address: BindAddress | None = None
        """Where ``/healthz`` listens once :meth:`run` started (port resolved), else None."""
        self.metrics_address: BindAddress | None = None
        """Where ``/metrics`` listens once :meth:`run` started, else None."""
        self._started = asyncio.Event()
        self._attempted = 0
        self._debug: DebugEndpoints | None = None
        self._debug_why_not = ""

    def serve_debug(self, debug: DebugEndpoints | None, *, why_not: str = "") -> None:
        """Answer ``/debug/rules`` and ``/debug/trace`` with ``debug`` (call before :meth:`run`);
        None keeps them answering 404 with ``why_not``."""
        self._debug, self._debug_why_not = debug, why_not

    def bind(self, engine: SyncEngine, *, proxy: Any = None, source: Any = None) -> None:
        """Observe ``engine``; read ``proxy.stats()`` and ``source.status()`` at scrape time when present."""
        self.instruments.attach(engine)
        live = LiveCollector(proxy=proxy if hasattr(proxy, "stats") else None,
                             source=source if hasattr(source, "status") else None, now=self._clock.now)
        self.metrics.registry.register(live)

    async def wait_started(self) -> None:
        """Wait until every HTTP server listens or has failed once to bind."""
        await self._started.wait()

    async def run(self) -> None:
        """Serve the endpoints until cancelled; close health check node ports on the way out.

        As kube-proxy, an address that cannot be bound is logged and retried every
        ``RETRY_BIND_S`` seconds; it never stops the proxy.
        """
        try:
            async with asyncio.TaskGroup() as tg:
                pending = []
                if self._healthz_at is not None:
                    pending.append(tg.create_task(self._serve(
                        healthz_app(self.health, self.metrics), self._healthz_at, "healthz")))
                if self._metrics_at is not None:
                    pending.append(tg.create_task(self._serve(
                        metrics_app(self.metrics, proxy_mode=self.options.proxy_mode, debug=self._debug,
                                    debug_why_not=self._debug_why_not), self._metrics_at,
                        "metrics")))
                if not pending:
                    self._started.set()
        finally:
            await self.service_health.aclose()

    async def _serve(self, app: web.Application, address: BindAddress, endpoint: str) -> None:
        what = self.options.healthz_name if endpoint == "healthz" else self.options.metrics_name
        while True:
            try:
                async with serving(app, address, what=what) as bound:
                    if endpoint == "healthz":
                        self.healthz_address = bound
                    else:
                        self.metrics_address = bound
                    _log.info("listening", endpoint=endpoint, address=f"{bound[0]}:{bound[1]}")
                    self._mark_started()
                    await asyncio.Event().wait()
            except ConfigError as err:
                _log.error(f"cannot serve {endpoint} on {what}; retrying in {RETRY_BIND_S:.1f} s",
                           endpoint=what, error=str(err), retry_in_s=RETRY_BIND_S)
                self._mark_started(failed=True)
                app = _fresh(app)
                await self._clock.sleep(RETRY_BIND_S)

    def _mark_started(self, failed: bool = False) -> None:
        self._attempted += 1
        wanted = (self._healthz_at is not None) + (self._metrics_at is not None)
        if self._attempted >= wanted:
            self._started.set()


def _fresh(app: web.Application) -> web.Application:
    """A new Application with ``app``'s routes (an aiohttp app cannot be set up twice)."""
    new = web.Application()
    for route in app.router.routes():
        if route.method == "GET" and route.resource is not None:
            new.router.add_get(route.resource.canonical, route.handler)
    return new
