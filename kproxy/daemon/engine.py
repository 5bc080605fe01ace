"""What every mode ``kproxy run`` runs shares: the instrumented sync engine and the run loop.

:func:`build_engine` wires a source and a mode's consumers into a
:class:`~kproxy.sync.SyncEngine`, timed for health and metrics when asked;
:func:`run_until_stopped` runs it (with observability and the Node watch beside it) until a
stop event is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from kproxy.model import NodeConfig
from kproxy.observability.server import Observability, ObservabilityOptions
from kproxy.sources.base import Source
from kproxy.sync.engine import Consumer, SyncEngine

if TYPE_CHECKING:
    from kproxy.sources.kube import NodeInfo, NodeWatch

__all__ = ["build_engine", "follow_node", "run_until_stopped"]

log = structlog.get_logger("kproxy")


def build_engine(
    source: Source, node: NodeConfig, consumers: Sequence[Consumer], *, min_sync_period_s: float,
    sync_period_s: float, observability: ObservabilityOptions | None = None, proxy: Any = None,
) -> tuple[SyncEngine, Observability | None]:
    """The sync engine for ``consumers``, instrumented for health and metrics when ``observability`` is given.

    Used by every mode ``kproxy run`` runs (kube-proxy serves ``/healthz``, ``/livez``,
    ``/metrics`` and health check node ports whatever its mode). With ``observability``, the
    consumers are timed as one sync (in order, as the engine would apply them), the source's
    events are observed, and a :class:`~kproxy.observability.ServiceHealthServer` follows them.

    Args:
        proxy: read for ``stats()`` at scrape time when it has them (the userspace data plane).

    Raises:
        ConfigError: an observability address is malformed.
    """
    if observability is None:
        return SyncEngine(source, node, list(consumers), min_sync_period_s=min_sync_period_s,
                          sync_period_s=sync_period_s), None

    obs = Observability(observability, sync_period_s=sync_period_s,
                        families=[str(f) for f in node.ip_families])
    engine = SyncEngine(obs.instruments.source(source), node,
                        [obs.instruments.consumer(*consumers), obs.service_health],
                        min_sync_period_s=min_sync_period_s, sync_period_s=sync_period_s)
    obs.bind(engine, proxy=proxy, source=source)
    return engine, obs


def follow_node(engine: SyncEngine, obs: Observability | None, *,
                follow_zone: bool = True) -> Callable[[NodeInfo], None]:
    """What to do when this node's Node changes: ``/healthz``'s eligibility, and its zone when followed."""

    def on_node(info: NodeInfo) -> None:
        if obs is not None:
            obs.health.node_eligible = info.eligible
        current = engine.tracker.node
        if follow_zone and info.zone != current.zone:
            log.info("node zone changed; resyncing for topology hints", zone=info.zone, was=current.zone)
            engine.set_node(replace(current, zone=info.zone))

    return on_node


async def run_until_stopped(engine: SyncEngine, obs: Observability | None, stop: asyncio.Event, *,
                            node_watch: NodeWatch | None = None, follow_zone: bool = True) -> None:
    """Run ``engine`` (and ``obs`` and ``node_watch`` beside it) until ``stop`` is set, then cancel them.

    Args:
        node_watch: follows this node's Node object (eligibility, and the zone unless
            ``follow_zone`` is False because ``--node-zone`` pinned it).

    Raises:
        ConfigError: an observability address cannot be used (re-raised as itself, not as a group).
    """
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(engine.run(), name="kproxy-sync-engine")]
            if obs is not None:
                tasks.append(tg.create_task(obs.run(), name="kproxy-observability"))
            if node_watch is not None:
                tasks.append(tg.create_task(node_watch.run(follow_node(engine, obs, follow_zone=follow_zone)),
                                            name="kproxy-node-watch"))
            await stop.wait()
            for task in tasks:
                task.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:  # e.g. a ConfigError from a bind address: report it as itself
            raise group.exceptions[0] from group
        raise
