"""Health, metrics and health check node ports fetched over HTTP, checked against real sync state."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator

import aiohttp

from kproxy.daemon import UserspaceOptions, running_userspace_proxy
from kproxy.model import NodeConfig, Snapshot
from kproxy.observability import Observability, ObservabilityOptions
from kproxy.sources.kube import KubeSource, api_client_factory
from kproxy.sync import SyncEngine
from tests.e2e.backends import identify, start_tcp_backend
from tests.fakeapi import FakeApiServer, endpoint_slice, service
from tests.fakeapi.harness import FAST, wait_for

LOOPBACK_ANY_PORT = ObservabilityOptions(
    healthz_bind_address="127.0.0.1:0", metrics_bind_address="127.0.0.1:0"
)


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(5)) as resp:
        return resp.status, await resp.text()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Flaky:
    """A consumer that fails while ``failing`` is set."""

    def __init__(self) -> None:
        self.failing = False

    async def apply(self, snapshot: Snapshot) -> None:
        """Fail or accept ``snapshot``."""
        if self.failing:
            raise RuntimeError("injected apply failure")


@contextlib.asynccontextmanager
async def _observed_engine(
    api: FakeApiServer, consumer: _Flaky, *, timeout_s: float, sync_period_s: float
) -> AsyncIterator[tuple[SyncEngine, Observability]]:
    source = KubeSource(api_client_factory(master=api.url), options=FAST)
    obs = Observability(
        ObservabilityOptions(
            healthz_bind_address="127.0.0.1:0", metrics_bind_address="127.0.0.1:0", health_timeout_s=timeout_s
        ),
        sync_period_s=sync_period_s,
    )
    engine = SyncEngine(
        obs.instruments.source(source),
        NodeConfig(hostname="node-a"),
        [obs.instruments.consumer(consumer)],
        min_sync_period_s=0.0,
        sync_period_s=sync_period_s,
        retry_period_s=0.05,
    )
    obs.bind(engine, source=source)
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(obs.run()), tg.create_task(engine.run())]
        try:
            await obs.wait_started()
            async with asyncio.timeout(10):
                await engine.wait_synced(1)
            yield engine, obs
        finally:
            for task in tasks:
                task.cancel()


async def test_healthz_turns_503_while_syncs_fail_and_200_after_the_next_success() -> None:
    """/healthz is 200 when synced, 503 once a change waited too long with syncs failing, then 200."""
    consumer = _Flaky()
    async with (
        FakeApiServer() as api,
        _observed_engine(api, consumer, timeout_s=0.4, sync_period_s=30) as (_, obs),
    ):
        assert obs.healthz_address is not None
        url = "http://{}:{}".format(*obs.healthz_address)
        status, body = await _get(url + "/healthz")
        assert status == 200
        doc = json.loads(body)
        assert set(doc) == {"lastUpdated", "currentTime", "nodeEligible"} and doc["nodeEligible"] is True
        assert doc["lastUpdated"] == doc["currentTime"]
        consumer.failing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        for i in range(1000):  # changes keep arriving while every sync fails: the oldest one counts
            api.apply(service(f"web{i}", f"10.96.1.{i % 250}"))
            if (await _get(url + "/healthz"))[0] == 503:
                break
            assert loop.time() < deadline, "never turned unhealthy"
            await asyncio.sleep(0.05)
        assert (await _get(url + "/livez"))[0] == 503
        consumer.failing = False
        await wait_for(lambda: obs.health.is_healthy(), timeout_s=3)
        assert (await _get(url + "/healthz"))[0] == 200


async def test_metrics_report_syncs_changes_and_network_programming_latency() -> None:
    """/metrics exposes kube-proxy's sync, change and network programming metrics for real syncs."""
    consumer = _Flaky()
    async with (
        FakeApiServer() as api,
        _observed_engine(api, consumer, timeout_s=60, sync_period_s=30) as (eng, obs),
    ):
        assert obs.metrics_address is not None
        api.apply(service("web", "10.96.0.10"))
        changed_at = time.time()  # after the proxy started: earlier trigger times are ignored
        await asyncio.sleep(0.3)
        api.apply(endpoint_slice("web", ["10.0.0.1"], 8080, trigger_time=changed_at))
        before = eng.sync_count
        await wait_for(lambda: eng.sync_count > before and not eng.tracker.pending_count)
        await wait_for(lambda: obs.metrics.network_programming._sum.get() > 0)  # type: ignore[attr-defined]
        status, text = await _get("http://{}:{}/metrics".format(*obs.metrics_address))
        assert status == 200
        values = _samples(text)
        assert values["kubeproxy_sync_proxy_rules_duration_seconds_count"] >= 2
        assert values["kubeproxy_network_programming_duration_seconds_count"] == 1
        assert 0.3 <= values["kubeproxy_network_programming_duration_seconds_sum"] < 5
        assert values["kubeproxy_sync_proxy_rules_service_changes_total"] == 1
        assert values["kubeproxy_sync_proxy_rules_endpoint_changes_total"] == 1
        assert (
            abs(values['kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}'] - time.time())
            < 5
        )
        assert values['kproxy_source_lists_total{kind="Service"}'] == 1
        assert 'kproxy_source_last_activity_age_seconds{kind="EndpointSlice"}' in values
        status, mode = await _get("http://{}:{}/proxyMode".format(*obs.metrics_address))
        assert (status, mode) == (200, "userspace")


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def test_userspace_connections_are_counted_per_service() -> None:
    """A proxied connection shows in kproxy_userspace_connections_total for its Service."""
    backend = await start_tcp_backend("127.0.0.1")
    try:
        async with FakeApiServer() as api:
            api.apply(service("web", "10.96.0.10"))
            api.apply(endpoint_slice("web", ["127.0.0.1"], backend.port))
            source = KubeSource(api_client_factory(master=api.url), options=FAST)
            async with running_userspace_proxy(
                source, options=UserspaceOptions(bind_address="127.0.0.1"), observability=LOOPBACK_ANY_PORT
            ) as running:
                assert running.observability is not None and running.observability.metrics_address is not None
                host, port = running.listen_address("default/web")
                assert await identify(host, port) == backend.identity
                _, text = await _get("http://{}:{}/metrics".format(*running.observability.metrics_address))
                key = ('kproxy_userspace_connections_total'
                       '{ip_family="IPv4",protocol="TCP",service="default/web"}')
                assert _samples(text)[key] == 1
    finally:
        await backend.aclose()


async def test_health_check_node_port_reports_local_endpoints() -> None:
    """An eTP Local LoadBalancer health check node port is 200 with local endpoints, 503 without."""
    port = _free_port()
    async with FakeApiServer() as api:
        lb = service(
            "lb", "10.96.0.70", type="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=port
        )
        lb["spec"]["ports"][0]["nodePort"] = 30080
        api.apply(lb)
        api.apply(endpoint_slice("lb", ["127.0.0.1"], 9, node_name="node-a"))
        source = KubeSource(api_client_factory(master=api.url), options=FAST)
        opts = UserspaceOptions(bind_address="127.0.0.1", min_sync_period_s=0.0)
        async with running_userspace_proxy(
            source, node=NodeConfig(hostname="node-a"), options=opts, observability=LOOPBACK_ANY_PORT
        ) as running:
            status, body = await _get(f"http://127.0.0.1:{port}/")
            assert status == 200
            assert json.loads(body) == {
                "service": {"namespace": "default", "name": "lb"},
                "localEndpoints": 1,
                "serviceProxyHealthy": True,
            }
            revision = running.engine.sync_count
            api.apply(endpoint_slice("lb", ["127.0.0.1"], 9, node_name="node-b"))
            await wait_for(
                lambda: running.engine.sync_count > revision and not running.engine.tracker.pending_count
            )
            status, body = await _get(f"http://127.0.0.1:{port}/")
            assert status == 503 and json.loads(body)["localEndpoints"] == 0
