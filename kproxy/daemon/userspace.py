"""The thin shell that runs kproxy: a source, the sync engine and the userspace data plane.

``kproxy run`` calls :func:`serve`; harnesses that want the proxy in their own event loop use
:func:`running_userspace_proxy`, an async context manager that yields once the first sync has
been applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import resource
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from kproxy.config.defaults import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_LOOPBACK_BLOCK,
    DEFAULT_MIN_SYNC_PERIOD_S,
    DEFAULT_SYNC_PERIOD_S,
    DEFAULT_UDP_TIMEOUT_S,
)
from kproxy.config.run import RunConfig
from kproxy.daemon.engine import build_engine, run_until_stopped
from kproxy.model import NodeConfig, Protocol, ServicePortName
from kproxy.model.names import IPFamily
from kproxy.modes.userspace import AddressEntry, UserspaceProxy
from kproxy.modes.userspace.limits import ConnectionLimits
from kproxy.observability.server import Observability, ObservabilityOptions
from kproxy.sources.base import Source
from kproxy.sync.engine import Consumer, SyncEngine

if TYPE_CHECKING:
    from kproxy.sources.kube import NodeWatch

__all__ = ["RunningProxy", "UserspaceOptions", "new_proxy", "raise_nofile_limit", "running_userspace_proxy",
           "serve"]

log = structlog.get_logger("kproxy")


@dataclass(frozen=True, slots=True, kw_only=True)
class UserspaceOptions:
    """How the userspace data plane listens and how the engine syncs.

    Attributes:
        bind_address: one address for every service port (each gets its own port), or None
            for one loopback address per Service in ``loopback_block``.
        loopback_block: the IPv4 block per-Service addresses come from.
        address_map_path: where to write the address table as JSON, or None.
        udp_idle_timeout_s: seconds a UDP session may stay idle.
        min_sync_period_s, sync_period_s: the bounded-frequency runner's bounds, in seconds.
        drain_timeout_s: on shutdown, how long open TCP connections may take to finish.
        max_connections, max_connections_per_service: relayed TCP connections open at once, in
            total and per service port; a connection over a cap is reset. None sizes them from
            the soft RLIMIT_NOFILE when the proxy starts (after :func:`serve` raised it), see
            :class:`~kproxy.modes.userspace.limits.ConnectionLimits`.
        max_udp_sessions, max_udp_sessions_per_service: UDP sessions open at once, in total and
            per service port; a new flow over a cap closes the least recently active session.
            None sizes them from RLIMIT_NOFILE, as above.
    """

    bind_address: str | None = None
    loopback_block: str = DEFAULT_LOOPBACK_BLOCK
    address_map_path: str | os.PathLike[str] | None = None
    udp_idle_timeout_s: float = DEFAULT_UDP_TIMEOUT_S
    min_sync_period_s: float = DEFAULT_MIN_SYNC_PERIOD_S
    sync_period_s: float = DEFAULT_SYNC_PERIOD_S
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    max_connections: int | None = None
    max_connections_per_service: int | None = None
    max_udp_sessions: int | None = None
    max_udp_sessions_per_service: int | None = None

    @classmethod
    def from_run(cls, run: RunConfig) -> UserspaceOptions:
        """The userspace options of a run configuration (its userspace and sync sections)."""
        us = run.userspace
        return cls(bind_address=us.bind_address, loopback_block=us.loopback_block,
                   address_map_path=us.address_map, udp_idle_timeout_s=us.udp_timeout_s,
                   min_sync_period_s=run.sync.min_sync_period_s, sync_period_s=run.sync.sync_period_s,
                   drain_timeout_s=us.drain_timeout_s, max_connections=us.max_connections,
                   max_connections_per_service=us.max_connections_per_service,
                   max_udp_sessions=us.max_udp_sessions,
                   max_udp_sessions_per_service=us.max_udp_sessions_per_service)

    @property
    def data_plane(self) -> tuple[object, ...]:
        """The settings the listening proxy is built with (a reload keeps the proxy when they are equal)."""
        return (self.bind_address, self.loopback_block, self.address_map_path, self.udp_idle_timeout_s)

    def limits(self) -> ConnectionLimits:
        """The connection caps: the ones given, the rest sized from the soft RLIMIT_NOFILE now.

        Raises:
            InvalidArgument: a cap is not an int >= 1.
        """
        return ConnectionLimits.from_nofile(
            max_connections=self.max_connections,
            max_connections_per_service=self.max_connections_per_service,
            max_udp_sessions=self.max_udp_sessions,
            max_udp_sessions_per_service=self.max_udp_sessions_per_service)



def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit, as servers do at start-up.

    Go's runtime does this for every program on Linux since Go 1.19 (``syscall`` package,
    ``origRlimitNofile``), and systemd's documentation asks daemons to do it themselves rather
    than run with the 1024 soft default. A failure is logged and the limit left as it was.

    Returns:
        ``(before, after)``: the soft limit in descriptors (-1 for unlimited) before and after.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the open-file limit", soft=soft, hard=hard, error=str(exc),
                    effect="connection and session caps are sized from the soft limit")
        return soft, soft
    log.info("raised the open-file limit to the hard limit", soft_was=soft, soft=hard)
    return soft, hard



@dataclass(slots=True)
class RunningProxy:
    """A userspace proxy running in the caller's event loop.

    Attributes:
        engine: the sync engine (its ``snapshot`` is the state in force).
        proxy: the data plane.
        observability: health, metrics and health check node ports, when asked for.
    """

    engine: SyncEngine
    proxy: UserspaceProxy
    observability: Observability | None = None

    def address_table(self) -> list[AddressEntry]:
        """Every service port with the address it listens on."""
        return self.proxy.address_table()

    def listen_address(
        self, service: str | ServicePortName, protocol: Protocol | str = "TCP",
        family: IPFamily | str | None = None,
    ) -> tuple[str, int]:
        """Where a client connects to reach ``service`` over ``protocol`` (and ``family``).

        Args:
            service: ``ns/name`` (a Service with one port of that protocol), or ``ns/name:PORT``
                where PORT is the port's name or its number, e.g. ``shop/web:80``,
                ``shop/web:p80`` or ``demo/web:http``.
            protocol: TCP or UDP.
            family: IPv4 or IPv6 for a dual-stack port; None takes the first family served,
                IPv4 before IPv6.

        Returns:
            ``(ip, port)``.

        Raises:
            LookupError: no such service port is served, or ``ns/name`` alone matches several
                ports (the message lists the served names).
            InvalidArgument: ``family`` is not IPv4 or IPv6.
        """
        listen = self.proxy.find_listen_address(str(service), str(protocol).upper(), family)
        host, _, port = listen.rpartition(":")
        return host.strip("[]"), int(port)

    async def wait_synced(self, min_revision: int = 1, timeout_s: float = 5.0) -> None:
        """Wait until a snapshot of at least ``min_revision`` has been applied.

        Raises:
            TimeoutError: it did not happen within ``timeout_s`` seconds.
        """
        async with asyncio.timeout(timeout_s):
            await self.engine.wait_synced(min_revision=min_revision)


@contextlib.asynccontextmanager
async def running_userspace_proxy(
    source: Source,
    *,
    node: NodeConfig | None = None,
    options: UserspaceOptions | None = None,
    startup_timeout_s: float = 10.0,
    observability: ObservabilityOptions | None = None,
) -> AsyncIterator[RunningProxy]:
    """Run the userspace proxy for ``source`` inside the current event loop.

    Yields once the first snapshot has been applied; on exit stops accepting, drains open
    connections (``options.drain_timeout_s``) and closes every listener.

    Args:
        source: where Services and EndpointSlices come from (e.g. a ``MemorySource``).
        node: the node to proxy for (default: no hostname, IPv4 and IPv6).
        options: listening and sync options.
        startup_timeout_s: how long to wait for the first sync, in seconds.
        observability: serve ``/healthz``, ``/metrics`` and health check node ports too.

    Raises:
        TimeoutError: the first sync did not happen in time.
        ConfigError: an observability address is malformed or cannot be bound.
    """
    opts = options or UserspaceOptions()
    the_node = node or NodeConfig()
    proxy = new_proxy(opts)
    engine, obs = _engine(source, the_node, proxy, opts, observability)
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = []
            if obs is not None:
                tasks.append(tg.create_task(obs.run(), name="kproxy-observability"))
                await obs.wait_started()
            tasks.append(tg.create_task(engine.run(), name="kproxy-sync-engine"))
            running = RunningProxy(engine=engine, proxy=proxy, observability=obs)
            try:
                await running.wait_synced(1, startup_timeout_s)
                yield running
            finally:
                for task in tasks:
                    task.cancel()
    finally:
        await proxy.aclose(opts.drain_timeout_s)


def _engine(
    source: Source, node: NodeConfig, proxy: UserspaceProxy, options: UserspaceOptions,
    observability: ObservabilityOptions | None, extra: Sequence[Consumer] = (),
) -> tuple[SyncEngine, Observability | None]:
    return build_engine(source, node, [proxy, *extra], min_sync_period_s=options.min_sync_period_s,
                        sync_period_s=options.sync_period_s, observability=observability, proxy=proxy)


def new_proxy(options: UserspaceOptions) -> UserspaceProxy:
    """A userspace data plane listening as ``options`` say (nothing bound until its first apply).

    Raises:
        ConfigError: ``loopback_block`` is not an IPv4 CIDR, or ``bind_address`` is not an IP address.
    """
    return UserspaceProxy(bind_address=options.bind_address, loopback_block=options.loopback_block,
                          address_map_path=options.address_map_path,
                          udp_idle_timeout_s=options.udp_idle_timeout_s, clock=time.monotonic,
                          limits=options.limits())


async def serve_with(
    proxy: UserspaceProxy, source: Source, node: NodeConfig, options: UserspaceOptions, stop: asyncio.Event,
    observability: ObservabilityOptions | None = None, *, node_watch: NodeWatch | None = None,
    follow_zone: bool = True, extra_consumers: Sequence[Consumer] = (),
) -> None:
    """Keep ``proxy`` in sync with ``source`` until ``stop`` is set; the caller closes the proxy.

    ``extra_consumers`` (the HTTP plane's listener) get every Snapshot after the proxy.

    A reload (SIGHUP) runs this again with a new source and node on the same proxy, so the
    listeners of unchanged Services and their open connections carry on.

    Raises:
        ConfigError: an observability address is malformed or cannot be bound.
    """
    engine, obs = _engine(source, node, proxy, options, observability, extra_consumers)
    log.info("starting", node=node.hostname, families=[str(f) for f in node.ip_families],
             min_sync_period_s=options.min_sync_period_s, sync_period_s=options.sync_period_s)
    await run_until_stopped(engine, obs, stop, node_watch=node_watch, follow_zone=follow_zone)


async def serve(
    source: Source, node: NodeConfig, options: UserspaceOptions, stop: asyncio.Event,
    observability: ObservabilityOptions | None = None, *, node_watch: NodeWatch | None = None,
    follow_zone: bool = True, exiting: bool = True,
) -> None:
    """Serve until ``stop`` is set, then shut down cleanly, draining for ``options.drain_timeout_s``.

    At start-up the soft RLIMIT_NOFILE is raised to the hard limit (:func:`raise_nofile_limit`)
    before the connection caps are sized from it. With ``observability``, ``/healthz``,
    ``/livez``, ``/metrics`` and health check node ports are served beside the engine; with
    ``node_watch``, this node's Node is followed (see :func:`run_until_stopped`).

    Args:
        exiting: the process exits after this returns (``kproxy run``). Then, once stopped,
            every object still alive is moved out of the cyclic garbage collector's reach
            (``gc.freeze()``): with 200 Services the interpreter's final collections over them
            took 0.7 to 1.5 s between "stopped" and exit, 60 to 210 ms with the freeze
            (``tests/benchmarks/bench_userspace_shutdown.py``). Pass False when the process
            goes on after this returns, so they are still collected.

    Raises:
        ConfigError: an observability address is malformed or cannot be bound, or
            ``--address-map`` is a folder or in a folder that does not exist.
    """
    raise_nofile_limit()
    proxy = new_proxy(options)
    try:
        await serve_with(proxy, source, node, options, stop, observability, node_watch=node_watch,
                         follow_zone=follow_zone)
        log.info("stopping", drain_timeout_s=options.drain_timeout_s)
    finally:
        await proxy.aclose(options.drain_timeout_s)
    log.info("stopped")
    if exiting:
        gc.freeze()
