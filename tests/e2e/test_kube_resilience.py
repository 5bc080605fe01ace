"""The kube source as kube-proxy and client-go behave: field selectors, dead watches, 410 relists."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator

from kproxy.sources import EventType
from kproxy.sources._kube_protocol import Backoff
from kproxy.sources.kube import SERVICE_FIELD_SELECTOR, KubeSource, KubeSourceOptions, api_client_factory
from tests.fakeapi import FakeApiServer, endpoint_slice, service
from tests.fakeapi.harness import FAST, Recorder, running_source, status_of, wait_for

#: Fast timings with a short bookmark interval: a watch silent for 0.6 s is dead.
QUICK = KubeSourceOptions(watch_timeout_s=30.0, stall_grace_s=0.5, list_timeout_s=5.0,
                          bookmark_interval_s=0.3, backoff=Backoff(initial_s=0.05, cap_s=0.2, jitter=0.0))


async def test_headless_services_never_cross_the_wire() -> None:
    """Services are listed and watched with spec.clusterIP!=None; a headless one is never served to kproxy."""
    async with FakeApiServer() as api:
        api.apply(service("web", "10.96.0.10"))
        api.apply(service("db", "None"))
        async with running_source(api) as (_, rec):
            await api.wait_watching(2)
            api.apply(service("cache", "None"))
            api.apply(service("api", "10.96.0.11"))
            await rec.wait_for(lambda: rec.seen(EventType.ADDED, "api"))
            await asyncio.sleep(0.1)
        names = {name for resource, name in api.served if resource == "services"}
        assert names == {"default/web", "default/api"}
        assert not any(e.obj.name in ("db", "cache") for e in rec.events)
        for request in api.requests:
            if request.resource == "services":
                assert request.query.get("fieldSelector") == SERVICE_FIELD_SELECTOR
            elif request.resource == "endpointslices":
                assert "fieldSelector" not in request.query
                assert request.query.get("labelSelector")


async def test_a_healthy_quiet_watch_with_bookmarks_is_never_cut() -> None:
    """With bookmarks every 0.2 s and a 0.6 s silence limit, 2 s of quiet keep one watch per kind."""
    async with FakeApiServer(bookmark_interval_s=0.2) as api, running_source(api, QUICK) as (source, _):
        await api.wait_watching(2)
        await asyncio.sleep(2.0)
        for kind in ("Service", "EndpointSlice"):
            status = status_of(source, kind)
            assert status["stalls"] == 0 and status["watches"] == 1 and status["failures"] == 0


async def test_a_watch_silent_for_two_bookmark_intervals_is_restarted_from_its_version() -> None:
    """A black-holed watch (no bookmark) is restarted after about two bookmark intervals, not its timeout."""
    async with FakeApiServer(bookmark_interval_s=0.2) as api, running_source(api, QUICK) as (source, rec):
        await api.wait_watching(2)
        version = status_of(source, "Service")["resource_version"]
        api.blackhole()
        api.restore()  # the open connections stay silent; new ones work
        api.apply(service("late", "10.96.0.20"))
        await rec.wait_for(lambda: rec.seen(EventType.ADDED, "late"), timeout_s=3.0)
        status = status_of(source, "Service")
        assert status["stalls"] >= 1 and status["lists"] == 1  # watched again, never relisted
        watches = [r.query for r in api.requests if r.resource == "services" and r.watch]
        assert watches[-1]["resourceVersion"] >= version


async def test_a_service_added_during_an_outage_is_served_soon_after_the_api_returns() -> None:
    """Watches black-holed and new requests reset for 1.5 s: a Service added meanwhile arrives within 2 s."""
    async with FakeApiServer(bookmark_interval_s=0.2) as api, running_source(api, QUICK) as (source, rec):
        await api.wait_watching(2)
        api.blackhole()
        api.apply(service("during", "10.96.0.21"))
        api.apply(endpoint_slice("during", ["10.0.0.21"], 8080))
        await asyncio.sleep(1.5)
        assert not rec.seen(EventType.ADDED, "during")
        assert status_of(source, "Service")["failures"] >= 1  # it kept retrying during the outage
        api.restore()
        loop = asyncio.get_running_loop()
        back = loop.time()
        await rec.wait_for(lambda: rec.seen(EventType.ADDED, "during")
                           and any(e.obj.name == "during-abc" for e in rec.events), timeout_s=5.0)
        assert loop.time() - back < 2.0


async def test_watch_connections_have_tcp_keepalive() -> None:
    """The kernel reports a keepalive timer on the source's open watch connections."""
    async with FakeApiServer(bookmark_interval_s=0.2) as api, running_source(api, QUICK):
        await api.wait_watching(2)
        out = subprocess.run(["ss", "-tnoH", "state", "established", "dst", f"127.0.0.1:{api.port}"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        lines = [line for line in out.splitlines() if line.strip()]
        assert len(lines) >= 2, out
        assert all("keepalive" in line for line in lines), out


async def test_a_410_relists_from_the_watch_cache_at_the_last_version() -> None:
    """After a 410 the relist asks for the last version with NotOlderThan: no quorum read reaches etcd."""
    async with FakeApiServer() as api:
        api.apply(service("gone", "10.96.0.30"))
        async with running_source(api) as (source, rec):
            await api.wait_watching(2)
            before = status_of(source, "Service")["resource_version"]
            api.delete("Service", "gone")
            api.expire()
            await rec.wait_for(lambda: rec.seen(EventType.DELETED, "gone"))
            await api.wait_watching(2)  # watching again after the relist
        lists = [r.query for r in api.requests if r.resource == "services" and not r.watch]
        assert len(lists) == 2 and status_of(source, "Service")["expired"] == 1
        assert lists[0]["resourceVersion"] == "0"
        assert lists[1]["resourceVersionMatch"] == "NotOlderThan"
        assert int(lists[1]["resourceVersion"]) >= int(str(before))
        assert api.quorum_lists == 0


async def test_a_relist_too_old_for_the_watch_cache_falls_back_to_a_quorum_list() -> None:
    """A NotOlderThan relist answered 410 is followed by one list without a version, then watching resumes."""
    async with FakeApiServer() as api:
        api.apply(service("gone", "10.96.0.30"))
        async with running_source(api) as (source, rec):
            await api.wait_watching(2)
            api.fail(503)  # the watches go down, then the watch cache moves on without them
            api.drop_watches()
            api.delete("Service", "gone")
            api.apply(service("new", "10.96.0.31"))
            api.expire(lists=True)
            api.recover()
            await rec.wait_for(lambda: rec.seen(EventType.DELETED, "gone")
                               and rec.seen(EventType.ADDED, "new"))
            await api.wait_watching(2)
            assert status_of(source, "Service")["quorum_lists"] == 1
        assert api.quorum_lists == 2  # one per reflector


@contextlib.asynccontextmanager
async def _many_sources(api: FakeApiServer, count: int) -> AsyncIterator[list[tuple[KubeSource, Recorder]]]:
    sources = [(KubeSource(api_client_factory(master=api.url), options=FAST), Recorder())
               for _ in range(count)]
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(s.run(r.emit, r.on_synced)) for s, r in sources]
        try:
            async with asyncio.timeout(20):
                for _, recorder in sources:
                    await recorder.synced.wait()
            yield sources
        finally:
            for task in tasks:
                task.cancel()


async def test_a_storm_of_410s_against_many_sources_stays_off_etcd() -> None:
    """20 sources through 5 rounds of 410s: every relist is served from the watch cache, none from etcd."""
    instances, rounds = 20, 5
    async with FakeApiServer() as api, _many_sources(api, instances) as sources:
        await api.wait_watching(2 * instances, timeout_s=20)
        for i in range(rounds):
            api.apply(service(f"svc-{i}", f"10.96.1.{i}"))
            api.expire()
            await wait_for(lambda i=i: all(status_of(s, "Service")["expired"] > i  # type: ignore[misc]
                                           for s, _ in sources), timeout_s=20)
            await api.wait_watching(2 * instances, timeout_s=20)
        last = f"svc-{rounds - 1}"
        await wait_for(lambda: all(r.seen(EventType.ADDED, last) for _, r in sources), timeout_s=20)
        lists = sum(1 for r in api.requests if not r.watch and r.resource in ("services", "endpointslices"))
        assert api.quorum_lists == 0
        assert lists <= 2 * instances * (rounds + 1)  # the first list, then at most one relist per 410
