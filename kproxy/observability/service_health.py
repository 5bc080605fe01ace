"""Health check node ports: an HTTP server per LoadBalancer Service with externalTrafficPolicy Local.

As kube-proxy's service health server (``pkg/proxy/healthcheck/service_health.go``): every
Service with a ``healthCheckNodePort`` (the API sets one for type LoadBalancer with
``externalTrafficPolicy: Local``) gets a listener on that port on each configured address.
It answers 200 when the Service has local ready endpoints and the proxy is healthy, 503
otherwise, with the JSON body ``{"service": {"namespace", "name"}, "localEndpoints": N,
"serviceProxyHealthy": bool}``. Load balancers probe it to send traffic only to nodes with
local endpoints. The count is of distinct local ready endpoint IPs over the Service's ports,
as kube-proxy's ``LocalReadyEndpoints``. A port that cannot be bound is logged and retried at
the next sync, never fatal.

:class:`ServiceHealthServer` is a sync-engine consumer: each Snapshot opens, keeps or closes
listeners and updates the counts.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import structlog
from aiohttp import web

from kproxy.model import NamespacedName, Snapshot
from kproxy.observability.health import ProxyHealth

__all__ = ["ServiceHealthServer", "health_check_ports", "local_ready_endpoints"]

_log = structlog.get_logger("kproxy.observability")


def health_check_ports(snapshot: Snapshot) -> dict[NamespacedName, int]:
    """``{Service: healthCheckNodePort}`` for every Service of ``snapshot`` that has one (pure)."""
    return {info.name.service: info.health_check_node_port for info in snapshot
            if info.health_check_node_port}


def local_ready_endpoints(snapshot: Snapshot) -> dict[NamespacedName, int]:
    """``{Service: number of distinct local ready endpoint IPs}`` (pure; Services with none left out)."""
    ips: dict[NamespacedName, set[str]] = {}
    for info in snapshot:
        for ep in info.endpoints:
            if ep.is_local and ep.ready:
                ips.setdefault(info.name.service, set()).add(ep.ip)
    return {name: len(found) for name, found in ips.items()}


@dataclass(slots=True, eq=False)
class _Instance:
    port: int
    runner: web.AppRunner
    bound: list[tuple[str, int]]


class ServiceHealthServer:
    """Open, keep and close health check node port listeners as Snapshots arrive.

    Args:
        addresses: the IPs each listener binds (kube-proxy: the node IPs within
            ``nodePortAddresses``, or all addresses).
        health: the proxy's health (``serviceProxyHealthy``); None means always healthy.
    """

    def __init__(self, addresses: Sequence[str] = ("127.0.0.1",), *,
                 health: ProxyHealth | None = None) -> None:
        self._addresses = tuple(addresses)
        self._health = health
        self._instances: dict[NamespacedName, _Instance] = {}
        self._counts: dict[NamespacedName, int] = {}

    def listeners(self) -> dict[str, list[tuple[str, int]]]:
        """``{"namespace/name": [(host, port), ...]}`` of the open listeners."""
        return {str(name): list(inst.bound) for name, inst in sorted(self._instances.items())}

    async def apply(self, snapshot: Snapshot) -> None:
        """Make the listeners match ``snapshot`` (never raises for a port that cannot be bound)."""
        wanted = health_check_ports(snapshot)
        self._counts = local_ready_endpoints(snapshot)
        for name in [n for n, inst in self._instances.items() if wanted.get(n) != inst.port]:
            inst = self._instances.pop(name)
            _log.info("closing health check node port", service=str(name), port=inst.port)
            await inst.runner.cleanup()
        for name, port in sorted(wanted.items()):
            if name not in self._instances:
                inst_or_none = await self._open(name, port)
                if inst_or_none is not None:
                    self._instances[name] = inst_or_none

    async def aclose(self) -> None:
        """Close every listener."""
        while self._instances:
            _, inst = self._instances.popitem()
            await inst.runner.cleanup()

    async def _open(self, name: NamespacedName, port: int) -> _Instance | None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handler(name))
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        bound: list[tuple[str, int]] = []
        try:
            for host in self._addresses:
                site = web.TCPSite(runner, host, port, reuse_address=True)
                await site.start()
                sockets = getattr(site._server, "sockets", None) or []
                bound.extend((str(s.getsockname()[0]), int(s.getsockname()[1])) for s in sockets)
        except OSError as err:
            await runner.cleanup()
            _log.error("cannot open health check node port; retried at the next sync", service=str(name),
                       port=port, error=err.strerror or str(err))
            return None
        _log.info("opened health check node port", service=str(name), port=port, addresses=bound)
        return _Instance(port=port, runner=runner, bound=bound)

    def _handler(self, name: NamespacedName) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(_: web.Request) -> web.Response:
            count = self._counts.get(name, 0)
            healthy = self._health.is_healthy() if self._health is not None else True
            body = {"service": {"namespace": name.namespace, "name": name.name},
                    "localEndpoints": count, "serviceProxyHealthy": healthy}
            return web.Response(status=200 if count and healthy else 503, text=json.dumps(body, indent=2),
                                content_type="application/json",
                                headers={"X-Content-Type-Options": "nosniff"})

        return handle
