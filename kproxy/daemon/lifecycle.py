"""``kproxy run`` from start to exit: signals, reloads and the drain.

Theory of operation: the daemon runs *generations*. A generation is one source, one node and one
sync engine over the data plane (the userspace proxy, or the kernel modes), with health and
metrics beside it. Signals move it on:

- SIGTERM or SIGINT stops the generation and shuts down: the userspace proxy stops accepting and
  drains open connections for ``--drain-timeout`` (kube-proxy has no drain; it holds no
  connections). A second SIGINT or SIGTERM during the drain cuts it short: the remaining
  connections are dropped and the process exits at once.
- SIGHUP (kube-proxy has none; users asked for it, as nginx and HAProxy reload on it) rebuilds
  the run configuration from the same flags, re-reading ``--config`` and the environment. A
  configuration that no longer validates is logged and the running one is kept. Otherwise a new
  generation starts, which reads the manifests afresh. The userspace proxy is kept when its
  listening settings did not change, so unchanged Services keep their listeners and
  connections; otherwise it drains and a new one starts. Kernel modes get fresh modes (a full
  sync; they hold no connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum

import structlog

from kproxy.config.run import RunConfig
from kproxy.daemon.kernel import KernelRunOptions, build_modes, serve_modes
from kproxy.daemon.setup import (
    build_source,
    log_config_warnings,
    node_watch,
    observability_options,
    read_node_facts,
    read_stdin_manifests,
)
from kproxy.daemon.userspace import UserspaceOptions, new_proxy, raise_nofile_limit, serve_with
from kproxy.errors import ConfigError
from kproxy.model import KubeObject
from kproxy.modes.userspace import UserspaceProxy, check_bind_address, check_loopback_block
from kproxy.modes.userspace.http.listener import IngressListener, IngressOptions

__all__ = ["Signals", "StopReason", "run_daemon"]

_log = structlog.get_logger("kproxy")


class StopReason(StrEnum):
    """Why a generation ended."""

    RELOAD = "reload"
    SHUTDOWN = "shutdown"


@dataclass(slots=True)
class Signals:
    """What the process was asked to do, set from signal handlers on the event loop.

    Attributes:
        wake: set when a generation should end (a stop or a reload was asked for).
        shutdown: SIGTERM or SIGINT arrived.
        hurry: a second SIGTERM or SIGINT arrived: cut the drain short.
        reload: SIGHUP arrived and was not acted on yet.
    """

    wake: asyncio.Event = field(default_factory=asyncio.Event)
    shutdown: asyncio.Event = field(default_factory=asyncio.Event)
    hurry: asyncio.Event = field(default_factory=asyncio.Event)
    reload: bool = False

    def on_stop(self, signum: int) -> None:
        """SIGTERM/SIGINT: the first stops, the second cuts the drain short."""
        name = signal.Signals(signum).name
        if self.shutdown.is_set():
            _log.warning("second stop signal: cutting the drain short", signal=name)
            self.hurry.set()
        else:
            _log.info("stop signal: shutting down", signal=name)
            self.shutdown.set()
        self.wake.set()

    def on_reload(self) -> None:
        """SIGHUP: reload the configuration and the manifests (ignored once shutting down)."""
        if self.shutdown.is_set():
            _log.info("SIGHUP ignored: shutting down")
            return
        _log.info("SIGHUP: reloading the configuration and the manifests")
        self.reload = True
        self.wake.set()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """Route SIGTERM, SIGINT and SIGHUP to this object."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.on_stop, sig)
        loop.add_signal_handler(signal.SIGHUP, self.on_reload)


async def _until_woken(signals: Signals, stop: asyncio.Event) -> None:
    await signals.wake.wait()
    stop.set()


async def _generation(run: RunConfig, proxy: UserspaceProxy | None, signals: Signals,
                      stdin_objects: tuple[KubeObject, ...] | None) -> StopReason:
    """Run one generation (see the module docstring) until a signal ends it."""
    source = build_source(run, stdin_objects=stdin_objects)
    zone, eligible = await read_node_facts(run)
    node = replace(run.node.node_config(run.source.service_proxy_name), zone=zone)
    observability = observability_options(run, eligible=eligible)
    watch = node_watch(run)
    follow_zone = run.node.zone is None
    stop = asyncio.Event()
    extra = [await start_ingress_listener(run)] if run.ingress.bind_address is not None else []
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(_until_woken(signals, stop), name="kproxy-signals")
            if proxy is not None:
                await serve_with(proxy, source, node, UserspaceOptions.from_run(run), stop, observability,
                                 node_watch=watch, follow_zone=follow_zone, extra_consumers=extra)
            else:
                options = KernelRunOptions.from_run(run)
                await serve_modes(build_modes(node, options), source, node, options, stop, observability,
                                  node_watch=watch, follow_zone=follow_zone, extra_consumers=extra)
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:  # e.g. a ConfigError from a bind address: report it as itself
            raise group.exceptions[0] from group
        raise
    finally:
        for listener in extra:
            await listener.aclose()
    signals.wake.clear()
    if signals.shutdown.is_set():
        return StopReason.SHUTDOWN
    signals.reload = False
    return StopReason.RELOAD


async def start_ingress_listener(run: RunConfig) -> IngressListener:
    """Bind ``--ingress-bind-address`` and start serving (404 until the first sync).

    Raises:
        ConfigError: the address cannot be bound (naming the flag).
    """
    assert run.ingress.bind_address is not None
    host, port = run.ingress.bind_address
    listener = IngressListener(IngressOptions(host=host, port=port, ingress_class=run.ingress.ingress_class))
    try:
        await listener.start()
    except OSError as err:
        raise ConfigError(f"--ingress-bind-address: cannot listen on {host}:{port}: "
                          f"{err.strerror or err}") from err
    return listener


async def _close(proxy: UserspaceProxy, drain_timeout_s: float, signals: Signals) -> None:
    """Close ``proxy``, draining for ``drain_timeout_s`` unless a second stop signal cuts it short."""
    _log.info("stopping", drain_timeout_s=drain_timeout_s)
    async with asyncio.TaskGroup() as tg:
        closing = tg.create_task(proxy.aclose(drain_timeout_s), name="kproxy-drain")
        hurry = tg.create_task(signals.hurry.wait(), name="kproxy-hurry")
        await asyncio.wait((closing, hurry), return_when=asyncio.FIRST_COMPLETED)
        if not closing.done():
            closing.cancel()
            _log.warning("drain cut short; the remaining connections are dropped")
        hurry.cancel()


def _reloaded(load: Callable[[], RunConfig], current: RunConfig) -> RunConfig:
    try:
        new = load()
    except ConfigError as err:
        _log.error("reload failed; the running configuration is kept", error=str(err))
        return current
    log_config_warnings(new)
    _log.info("configuration reloaded", proxy_mode=new.proxy_mode, node=new.node.hostname)
    return new


async def run_daemon(load: Callable[[], RunConfig], first: RunConfig | None = None) -> None:
    """Run ``kproxy run`` until SIGTERM/SIGINT, reloading on SIGHUP (see the module docstring).

    Args:
        load: builds the run configuration (again) from the same flags, the ``--config`` file
            and the environment; called on each SIGHUP.
        first: the configuration to start with (default: ``load()``).

    Raises:
        ConfigError: the first configuration cannot start (a source, an address, root for
            ``--kernel linux``); after a reload such an error is logged and the last good
            configuration runs again.
    """
    run = first or load()
    log_config_warnings(run)
    if run.proxy_mode == "userspace":  # at start-up, before anything listens: each names its flag
        if run.userspace.bind_address is not None:
            check_bind_address(run.userspace.bind_address)
        else:
            check_loopback_block(run.userspace.loopback_block)
    if run.proxy_mode == "userspace":
        raise_nofile_limit()  # before the connection caps are sized from it
    signals = Signals()
    signals.install(asyncio.get_running_loop())
    stdin_objects = read_stdin_manifests() if run.source.reads_stdin else None  # a stream is read once
    proxy = new_proxy(UserspaceOptions.from_run(run)) if run.proxy_mode == "userspace" else None
    last_good = run
    try:
        while True:
            try:
                reason = await _generation(run, proxy, signals, stdin_objects)
            except ConfigError as err:
                if run is last_good:
                    raise
                _log.error("the reloaded configuration cannot start; the last good one runs again",
                           error=str(err))
                run = last_good
                if proxy is not None and run.proxy_mode != "userspace":
                    await _close(proxy, 0.0, signals)
                    proxy = None
                if proxy is None and run.proxy_mode == "userspace":
                    proxy = new_proxy(UserspaceOptions.from_run(run))
                continue
            if reason is StopReason.SHUTDOWN:
                break
            last_good = run
            new = _reloaded(load, run)
            plane = UserspaceOptions.from_run(run).data_plane
            new_plane = UserspaceOptions.from_run(new).data_plane
            same_plane = new.proxy_mode == "userspace" and plane == new_plane
            if proxy is not None and not same_plane:
                await _close(proxy, run.userspace.drain_timeout_s, signals)
                proxy = None
            if proxy is None and new.proxy_mode == "userspace":
                proxy = new_proxy(UserspaceOptions.from_run(new))
            run = new
    finally:
        if proxy is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await _close(proxy, run.userspace.drain_timeout_s, signals)
    _log.info("stopped")
    gc.freeze()  # the process exits now: spare it the final collections (see daemon.userspace.serve)
