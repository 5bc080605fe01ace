"""kproxy follows its own Node (list + watch, ``fieldSelector=metadata.name``) as kube-proxy does."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp

from kproxy.daemon import UserspaceOptions, serve
from kproxy.model import NodeConfig
from kproxy.observability import ObservabilityOptions
from kproxy.sources import MemorySource
from kproxy.sources.kube import TO_BE_DELETED_TAINT, NodeInfo, NodeWatch, api_client_factory
from tests.fakeapi import FakeApiServer, node
from tests.fakeapi.harness import FAST, wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _healthz(port: int) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.get(
            f"http://127.0.0.1:{port}/healthz", timeout=aiohttp.ClientTimeout(5)) as resp:
        return resp.status, json.loads(await resp.text())


async def test_node_watch_reports_taint_deletion_timestamp_and_zone_changes() -> None:
    """Each change of this node's Node reaches on_node; other nodes are not even listed."""
    seen: list[NodeInfo] = []
    async with FakeApiServer() as api:
        api.apply(node("node-a", zone="z1"))
        api.apply(node("node-b", zone="z9"))
        watch = NodeWatch(api_client_factory(master=api.url), "node-a", options=FAST)
        task = asyncio.create_task(watch.run(seen.append))
        try:
            await wait_for(lambda: seen == [NodeInfo(name="node-a", zone="z1", eligible=True)])
            api.apply(node("node-a", zone="z2"))
            await wait_for(lambda: seen[-1] == NodeInfo(name="node-a", zone="z2", eligible=True))
            taint = {"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}
            api.apply(node("node-a", zone="z2", taints=[taint]))
            await wait_for(lambda: not seen[-1].eligible)
            api.apply(node("node-a", zone="z2"))
            await wait_for(lambda: seen[-1].eligible)
            deleting = node("node-a", zone="z2")
            deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            api.apply(deleting)
            await wait_for(lambda: not seen[-1].eligible)
        finally:
            task.cancel()
        assert all(info.name == "node-a" for info in seen)
        queries = [r.query for r in api.requests if r.resource == "nodes"]
        assert queries and all(q.get("fieldSelector") == "metadata.name=node-a" for q in queries)


async def test_healthz_turns_503_when_the_node_gets_the_autoscaler_taint() -> None:
    """`serve` with a NodeWatch: /healthz says nodeEligible false (503) once the Node is tainted."""
    port = _free_port()
    async with FakeApiServer() as api:
        api.apply(node("node-a", zone="z1"))
        stop = asyncio.Event()
        watch = NodeWatch(api_client_factory(master=api.url), "node-a", options=FAST)
        obs = ObservabilityOptions(healthz_bind_address=f"127.0.0.1:{port}", metrics_bind_address="")
        task = asyncio.create_task(serve(MemorySource(), NodeConfig(hostname="node-a"),
                                         UserspaceOptions(bind_address="127.0.0.1", drain_timeout_s=0.1),
                                         stop, obs, node_watch=watch))
        try:
            await api.wait_watching(1)
            await wait_for(lambda: bool(api.watch_count("nodes")))
            api.apply(node("node-a", taints=[{"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}]))
            async with asyncio.timeout(5):
                while True:
                    try:
                        status, body = await _healthz(port)
                    except aiohttp.ClientError:
                        status, body = 0, {}
                    if status == 503:
                        break
                    await asyncio.sleep(0.05)
            assert body["nodeEligible"] is False
        finally:
            stop.set()
            async with asyncio.timeout(10):
                await task


async def test_zone_label_change_reaches_the_snapshots() -> None:
    """A new topology zone label on the Node is the zone of the next Snapshot (topology hints follow it)."""
    from kproxy.daemon import follow_node
    from kproxy.sync import SyncEngine

    async with FakeApiServer() as api:
        api.apply(node("node-a", zone="z1"))
        engine = SyncEngine(MemorySource(), NodeConfig(hostname="node-a", zone="z1"), [],
                            min_sync_period_s=0.0, sync_period_s=1.0)
        watch = NodeWatch(api_client_factory(master=api.url), "node-a", options=FAST)
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(engine.run()), tg.create_task(watch.run(follow_node(engine, None)))]
            try:
                await asyncio.wait_for(engine.wait_synced(1), 5)
                api.apply(node("node-a", zone="z2"))
                await wait_for(lambda: engine.tracker.node.zone == "z2")
                await asyncio.wait_for(engine.wait_synced(2), 10)
                assert engine.snapshot is not None and engine.snapshot.node.zone == "z2"
            finally:
                for t in tasks:
                    t.cancel()
