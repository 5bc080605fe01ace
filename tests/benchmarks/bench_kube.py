"""Benchmark: network programming latency and memory of the kube source, against the fake API server.

Latency: the time from the fake API server applying an EndpointSlice change to the sync engine
handing the data plane a Snapshot with that change, p50 and p99 over ``--changes`` changes (one
every ``--spacing-ms``) with ``--services`` Services present, for each ``--min-sync-period``.
The consumer is a recorder, not the userspace proxy: 5,000 Services would need 5,000 listening
sockets, more than a default file-descriptor limit, and the userspace apply is benchmarked on its
own in ``bench_userspace.py``. Memory: tracemalloc's count of what the source, tracker and
Snapshot hold for 1,000 Services with 10 endpoints each.

Run: ``python -m tests.benchmarks.bench_kube`` (about 30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
import tracemalloc

from kproxy.model import NodeConfig, Snapshot
from kproxy.sources.kube import KubeSource, KubeSourceOptions, api_client_factory
from kproxy.sync import SyncEngine
from tests.fakeapi import FakeApiServer, endpoint_slice, service


def _ip(prefix: int, i: int) -> str:
    return f"10.{prefix}.{i // 256 % 256}.{i % 256}"


class _Probe:
    """Records when each awaited (service name, endpoint IP) first appears in an applied Snapshot."""

    def __init__(self) -> None:
        self.waiting: dict[str, tuple[str, float]] = {}
        self.latencies: list[float] = []

    async def apply(self, snapshot: Snapshot) -> None:
        now = time.monotonic()
        for spn in snapshot.changed:
            wanted = self.waiting.get(spn.service.name)
            if wanted is None:
                continue
            info = snapshot.get(f"{spn.service}")
            if info is not None and any(ep.ip == wanted[0] for ep in info.endpoints):
                del self.waiting[spn.service.name]
                self.latencies.append(now - wanted[1])


async def _populate(api: FakeApiServer, services: int, endpoints_per_slice: int) -> None:
    for i in range(services):
        api.apply(service(f"svc-{i}", _ip(96, i)))
        api.apply(
            endpoint_slice(
                f"svc-{i}", [_ip(100 + k, i) for k in range(endpoints_per_slice)], 8080, name=f"svc-{i}-x"
            )
        )


async def latency(services: int, changes: int, min_sync_s: float, spacing_s: float) -> list[float]:
    """Seconds from each change on the server to its Snapshot being applied."""
    async with FakeApiServer() as api:
        await _populate(api, services, 1)
        probe = _Probe()
        source = KubeSource(api_client_factory(master=api.url), options=KubeSourceOptions())
        engine = SyncEngine(source, NodeConfig(hostname="node-a"), [probe], min_sync_period_s=min_sync_s)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(engine.run())
            await engine.wait_synced(1)
            await api.wait_watching(2)
            for n in range(changes):
                i = (n * 7919) % services
                new_ip = _ip(200 + n // 65536, n)
                probe.waiting[f"svc-{i}"] = (new_ip, time.monotonic())
                api.apply(endpoint_slice(f"svc-{i}", [new_ip], 8080, name=f"svc-{i}-x"))
                await asyncio.sleep(spacing_s)
            deadline = time.monotonic() + min_sync_s + 10
            while probe.waiting and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            task.cancel()
        return probe.latencies


async def memory(services: int, endpoints_per_slice: int) -> float:
    """Bytes held after syncing ``services`` Services with ``endpoints_per_slice`` endpoints each."""
    async with FakeApiServer() as api:
        await _populate(api, services, endpoints_per_slice)

        class _Keep:
            async def apply(self, snapshot: Snapshot) -> None:
                pass

        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        source = KubeSource(api_client_factory(master=api.url), options=KubeSourceOptions())
        engine = SyncEngine(source, NodeConfig(hostname="node-a"), [_Keep()], min_sync_period_s=0.0)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(engine.run())
            await engine.wait_synced(1)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - base
            task.cancel()
        tracemalloc.stop()
        return float(held)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--services", type=int, default=5000)
    parser.add_argument("--changes", type=int, default=1000)
    parser.add_argument("--spacing-ms", type=float, default=5.0)
    parser.add_argument("--min-sync-period", type=float, nargs="+", default=[1.0, 0.0])
    args = parser.parse_args()
    for min_sync in args.min_sync_period:
        got = await latency(args.services, args.changes, min_sync, args.spacing_ms / 1000)
        print(
            f"min-sync-period {min_sync:g} s, {args.services} Services, {len(got)}/{args.changes} changes: "
            f"p50 {statistics.median(got) * 1000:.0f} ms, p99 {_pct(got, 0.99) * 1000:.0f} ms, "
            f"max {max(got) * 1000:.0f} ms"
        )
    held = await memory(1000, 10)
    print(
        f"memory: {held / 2**20:.1f} MiB for 1,000 Services and 10,000 endpoints "
        f"({held / 1000 / 1024:.1f} KiB per Service)"
    )


if __name__ == "__main__":
    asyncio.run(main())
