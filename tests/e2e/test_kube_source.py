"""The kube source against the fake API server, through kubernetes-asyncio over TCP."""

from __future__ import annotations

import asyncio

from kproxy.model import LABEL_SERVICE_PROXY_NAME
from kproxy.sources import EventType
from kproxy.sources._kube_protocol import LABEL_HEADLESS
from kproxy.sources.kube import KubeSourceOptions
from tests.fakeapi import FakeApiServer, endpoint_slice, service
from tests.fakeapi.harness import FAST, running_source, status_of


async def test_initial_list_emits_selected_objects_then_synced_once() -> None:
    """The first lists emit every selected object, then synced() is called exactly once."""
    async with FakeApiServer() as api:
        api.apply(service("web", "10.96.0.10"))
        api.apply(endpoint_slice("web", ["10.0.0.1"], 8080))
        api.apply(service("other", "10.96.0.11", labels={LABEL_SERVICE_PROXY_NAME: "cilium"}))
        api.apply(endpoint_slice("hl", ["10.0.0.2"], 80, labels={LABEL_HEADLESS: ""}))
        async with running_source(api) as (_, rec):
            assert sorted((e.type, str(e.key)) for e in rec.events) == [
                (EventType.ADDED, "EndpointSlice default/web-abc"),
                (EventType.ADDED, "Service default/web"),
            ]
            assert rec.synced_calls == 1
            selectors = {r.query.get("labelSelector") for r in api.requests if r.resource != "failed"}
            assert selectors == {f"!{LABEL_SERVICE_PROXY_NAME},!{LABEL_HEADLESS}"}


async def test_watch_events_reach_the_emitter_in_order() -> None:
    """ADDED, MODIFIED and DELETED on the server become ADDED, UPDATED and DELETED events."""
    async with FakeApiServer() as api, running_source(api) as (_, rec):
        await api.wait_watching(2)
        api.apply(service("db", "10.96.0.20"))
        api.apply(service("db", "10.96.0.20", ports=(5432,)))
        api.delete("Service", "db")
        await rec.wait_for(lambda: rec.seen(EventType.DELETED, "db"))
        assert [e.type for e in rec.events if e.obj.name == "db"] == [
            EventType.ADDED,
            EventType.UPDATED,
            EventType.DELETED,
        ]


async def test_watches_ask_for_bookmarks_timeouts_and_the_list_version() -> None:
    """Watches carry allowWatchBookmarks, a server-side timeoutSeconds and the list's resourceVersion."""
    async with FakeApiServer() as api:
        api.apply(service("web", "10.96.0.10"))
        list_rv = str(api.rv)
        async with running_source(api):
            await api.wait_watching(2)
            watches = [r.query for r in api.requests if r.watch]
            assert len(watches) == 2
            for query in watches:
                assert query["allowWatchBookmarks"].lower() == "true"
                assert query["resourceVersion"] == list_rv
                assert 1 <= int(query["timeoutSeconds"]) <= 2


async def test_bookmarks_move_the_version_and_keep_a_quiet_watch_alive() -> None:
    """A quiet watch that gets bookmarks is never cut, and its resource version follows them."""
    options = KubeSourceOptions(watch_timeout_s=5.0, stall_grace_s=0.3, backoff=FAST.backoff)
    async with FakeApiServer(bookmark_interval_s=0.1) as api, running_source(api, options) as (source, _):
        await api.wait_watching(2)
        api.apply(service("web", "10.96.0.10"))  # moves the Service version only
        await asyncio.sleep(0.8)  # longer than the grace, shorter than the server timeout
        slices = status_of(source, "EndpointSlice")
        assert slices["resource_version"] == str(api.rv)
        assert slices["stalls"] == 0 and slices["watches"] == 1


async def test_expired_version_relists_and_deletes_what_vanished() -> None:
    """After a 410, the relist deletes objects removed while the watch was down and adds new ones."""
    async with FakeApiServer() as api:
        api.apply(service("gone", "10.96.0.30"))
        async with running_source(api) as (source, rec):
            await api.wait_watching(2)
            api.fail(503)
            api.drop_watches()
            api.delete("Service", "gone")
            api.apply(service("new", "10.96.0.31"))
            api.expire()
            api.recover()
            await rec.wait_for(
                lambda: rec.seen(EventType.DELETED, "gone") and rec.seen(EventType.ADDED, "new")
            )
            assert status_of(source, "Service")["lists"] >= 2
            assert status_of(source, "Service")["expired"] >= 1


async def test_expired_as_http_410_also_relists() -> None:
    """A watch answered with HTTP 410 (not an ERROR event) relists too."""
    async with FakeApiServer(expired_as_http=True) as api:
        api.apply(service("gone", "10.96.0.30"))
        async with running_source(api) as (source, rec):
            await api.wait_watching(2)
            api.fail(503)
            api.drop_watches()
            api.delete("Service", "gone")
            api.expire(notify=False)
            api.recover()
            await rec.wait_for(lambda: rec.seen(EventType.DELETED, "gone"))
            assert status_of(source, "Service")["expired"] >= 1


async def test_open_watch_receiving_a_410_error_event_relists() -> None:
    """An ERROR event with a 410 Status on an open watch makes the reflector list again."""
    async with FakeApiServer() as api, running_source(api) as (source, rec):
        await api.wait_watching(2)
        api.expire()
        await rec.wait_for(
            lambda: (
                status_of(source, "Service")["lists"] == 2
                and status_of(source, "EndpointSlice")["lists"] == 2
            )
        )


async def test_dropped_stream_rewatches_from_the_last_version_without_relisting() -> None:
    """A watch cut mid-stream is resumed from its last resource version; nothing is listed again."""
    async with FakeApiServer() as api, running_source(api) as (source, rec):
        await api.wait_watching(2)
        api.apply(service("a", "10.96.0.40"))
        await rec.wait_for(lambda: rec.seen(EventType.ADDED, "a"))
        seen_rv = str(api.rv)
        api.drop_watches()
        api.apply(service("b", "10.96.0.41"))
        await rec.wait_for(lambda: rec.seen(EventType.ADDED, "b"))
        service_watches = [r.query for r in api.requests if r.watch and r.resource == "services"]
        assert service_watches[-1]["resourceVersion"] == seen_rv
        assert status_of(source, "Service")["lists"] == 1


async def test_stalled_stream_is_detected_and_restarted() -> None:
    """A watch silent without closing is cut after its timeout plus grace, and watching resumes."""
    async with FakeApiServer() as api, running_source(api) as (source, rec):
        await api.wait_watching(2)
        api.stall()
        await rec.wait_for(lambda: status_of(source, "Service")["stalls"] >= 1, timeout_s=6)
        api.unstall()
        api.apply(service("after", "10.96.0.50"))
        await rec.wait_for(lambda: rec.seen(EventType.ADDED, "after"))
        assert status_of(source, "Service")["lists"] == 1


async def test_500_storm_backs_off_and_recovers() -> None:
    """Consecutive 500s are retried with growing delays, then the source syncs."""
    async with FakeApiServer() as api:
        api.apply(service("web", "10.96.0.10"))
        api.fail(500, count=6)
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with running_source(api) as (source, rec):
            elapsed = loop.time() - start
            failures = sum(s.failures for s in source.status())
            assert failures == 6
            # six retries spread over two reflectors: 0.05 + 0.1 + 0.2 s at least for one of them
            assert elapsed >= 0.3
            assert rec.seen(EventType.ADDED, "web")


async def test_malformed_events_are_skipped_and_the_stream_continues() -> None:
    """Unparseable lines, unknown event types and invalid objects are skipped; later events arrive."""
    async with FakeApiServer() as api, running_source(api) as (source, rec):
        await api.wait_watching(2)
        api.inject("services", b"{not json")
        api.inject("services", b'{"type": "EXPLODED", "object": {"metadata": {"name": "x"}}}')
        bad = service("bad", "10.96.0.60")
        bad["spec"]["ports"] = [{"port": "eighty"}]
        bad["spec"]["clusterIP"] = "not-an-ip"
        bad["spec"]["clusterIPs"] = ["not-an-ip"]
        api.apply(bad)
        api.apply(service("good", "10.96.0.61"))
        await rec.wait_for(lambda: rec.seen(EventType.ADDED, "good"))
        assert status_of(source, "Service")["malformed"] >= 3
        assert status_of(source, "Service")["watches"] == 1


async def test_object_leaving_the_selector_is_deleted() -> None:
    """A Service that gets another proxy's label is deleted, as the watch cache reports it."""
    async with FakeApiServer() as api:
        api.apply(service("web", "10.96.0.10"))
        async with running_source(api) as (_, rec):
            await api.wait_watching(2)
            api.apply(service("web", "10.96.0.10", labels={LABEL_SERVICE_PROXY_NAME: "other"}))
            await rec.wait_for(lambda: rec.seen(EventType.DELETED, "web"))


async def test_unreachable_server_is_retried_until_it_appears() -> None:
    """Connection refused is a failure retried with backoff, and the source syncs once the server is up."""
    api = FakeApiServer()
    await api.start()
    port = api.port
    await api.close()
    restarted = FakeApiServer()
    try:
        async with asyncio.TaskGroup() as tg:

            async def start_later() -> None:
                await asyncio.sleep(0.3)
                await restarted.start(port)
                restarted.apply(service("web", "10.96.0.10"))

            tg.create_task(start_later())
            async with running_source(api) as (source, rec):
                assert sum(s.failures for s in source.status()) >= 1
                assert rec.synced_calls == 1
    finally:
        await restarted.close()
