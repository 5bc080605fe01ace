"""The kube source feeding the real userspace data plane, against the fake API server."""

from __future__ import annotations

import asyncio

from kproxy.daemon import UserspaceOptions, running_userspace_proxy
from kproxy.model import NodeConfig, Snapshot
from kproxy.sources.kube import KubeSource, api_client_factory
from kproxy.sync import SyncEngine
from tests.e2e.backends import identify, start_tcp_backend
from tests.fakeapi import FakeApiServer, endpoint_slice, service
from tests.fakeapi.harness import FAST, wait_for


def _source(api: FakeApiServer) -> KubeSource:
    return KubeSource(api_client_factory(master=api.url), options=FAST)


async def test_connection_reaches_a_newly_added_endpoint_within_two_seconds() -> None:
    """An endpoint added on the API server is served within 2 s at min-sync-period 1 s."""
    first = await start_tcp_backend("127.0.0.1")
    second = await start_tcp_backend("127.0.0.1")
    try:
        async with FakeApiServer() as api:
            api.apply(service("web", "10.96.0.10", ports=(80,)))
            api.apply(endpoint_slice("web", ["127.0.0.1"], first.port, name="web-1"))
            opts = UserspaceOptions(bind_address="127.0.0.1", min_sync_period_s=1.0)
            async with running_userspace_proxy(_source(api), options=opts) as running:
                host, port = running.listen_address("default/web")
                assert await identify(host, port) == first.identity
                loop = asyncio.get_running_loop()
                added = loop.time()
                api.apply(endpoint_slice("web", ["127.0.0.1"], second.port, name="web-2"))
                seen: set[str] = set()

                async def reached() -> bool:
                    seen.add(await identify(host, port))
                    return second.identity in seen

                async with asyncio.timeout(2.0):
                    while not await reached():
                        await asyncio.sleep(0.02)
                assert loop.time() - added < 2.0
    finally:
        await first.aclose()
        await second.aclose()


async def test_traffic_keeps_flowing_while_the_api_is_down() -> None:
    """During an API outage (dropped watches, every request failing) the last state keeps being served."""
    backend = await start_tcp_backend("127.0.0.1")
    try:
        async with FakeApiServer() as api:
            api.apply(service("web", "10.96.0.10"))
            api.apply(endpoint_slice("web", ["127.0.0.1"], backend.port))
            opts = UserspaceOptions(bind_address="127.0.0.1", min_sync_period_s=0.0, sync_period_s=0.2)
            async with running_userspace_proxy(_source(api), options=opts) as running:
                host, port = running.listen_address("default/web")
                api.fail(503)
                api.drop_watches()
                revision = running.engine.sync_count
                await wait_for(lambda: running.engine.sync_count >= revision + 3)  # periodic syncs go on
                for _ in range(5):
                    assert await identify(host, port) == backend.identity
                api.recover()
    finally:
        await backend.aclose()


class _Recorder:
    """A consumer that keeps the last Snapshot."""

    def __init__(self) -> None:
        self.last: Snapshot | None = None

    async def apply(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot``."""
        self.last = snapshot


async def test_five_thousand_services_with_their_slices_are_listed_and_synced() -> None:
    """5,000 Services and their slices are listed through the real client and synced in one snapshot."""
    async with FakeApiServer() as api:
        for i in range(5000):
            name = f"svc-{i}"
            api.apply(service(name, f"10.{96 + i // 65536}.{i // 256 % 256}.{i % 256}"))
            api.apply(
                endpoint_slice(
                    name, [f"10.1.{i // 256 % 256}.{i % 256}", f"10.2.{i // 256 % 256}.{i % 256}"], 8080
                )
            )
        recorder = _Recorder()
        engine = SyncEngine(_source(api), NodeConfig(hostname="node-a"), [recorder], min_sync_period_s=0.0)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(engine.run())
            try:
                async with asyncio.timeout(30):
                    snapshot = await engine.wait_synced(1)
            finally:
                task.cancel()
        assert len(snapshot) == 5000
        assert all(len(info.endpoints) == 2 for info in snapshot)
