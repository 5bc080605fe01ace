"""kproxy's own port-forward client against the harness API server: both transports, the SPDY
fallback, one upgrade for many connections, per-connection errors, backpressure, pod loss."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kproxy.cluster import ClusterServer
from kproxy.errors import PortForwardError
from kproxy.portforward.client import port_forward
from kproxy.portforward.http import ApiEndpoint, load_kubeconfig
from tests.e2e.portforward_support import (
    CHUNK,
    Pods,
    loopback_pods,
    pattern,
    pod_manifest,
    roundtrip,
    service_manifest,
)


@pytest.fixture
async def pods() -> AsyncIterator[Pods]:
    async with loopback_pods() as running:
        yield running


async def _cluster(pods: Pods, tmp_path: Path, **kw: bool) -> tuple[ClusterServer, ApiEndpoint]:
    server = ClusterServer(**kw)
    server.apply(pod_manifest("web-0", pods), service_manifest(pods))
    await server.start()
    return server, load_kubeconfig(server.write_kubeconfig(tmp_path / "kubeconfig"))


@pytest.mark.parametrize(("tunnel", "transport"), [(True, "websocket"), (False, "spdy")])
async def test_client_carries_32_mib_each_way(pods: Pods, tmp_path: Path, tunnel: bool,
                                              transport: str) -> None:
    """32 MiB through kproxy's forward comes back intact over the tunnel and over SPDY."""
    server, endpoint = await _cluster(pods, tmp_path)
    try:
        async with port_forward(endpoint, "pod/web-0", [f":{pods.echo}"], namespace="demo",
                                tunnel=tunnel) as fwd:
            assert fwd.transport == transport
            payload = os.urandom(32 << 20)
            back = await roundtrip(fwd.ports[0].local, payload, timeout_s=120)
            assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()
        assert server.upgrades == [("demo/web-0", transport)]
    finally:
        await server.aclose()


async def test_client_falls_back_to_spdy_when_the_server_has_no_tunnel(pods: Pods, tmp_path: Path) -> None:
    """Against a server that speaks only SPDY the client's tunnel upgrade fails and SPDY is used."""
    server, endpoint = await _cluster(pods, tmp_path, tunnel=False)
    try:
        async with port_forward(endpoint, "svc/web", [":81"], namespace="demo") as fwd:
            assert fwd.transport == "spdy"
            payload = os.urandom(1 << 20)
            answer = await roundtrip(fwd.ports[0].local, payload)
            assert answer.decode() == hashlib.sha256(payload).hexdigest()
        assert server.upgrades == [("demo/web-0", "spdy")]
    finally:
        await server.aclose()


async def test_fifty_connections_share_one_upgraded_connection(pods: Pods, tmp_path: Path) -> None:
    """Fifty concurrent local connections are carried by a single upgrade, each intact."""
    server, endpoint = await _cluster(pods, tmp_path)
    try:
        async with port_forward(endpoint, "svc/web", [":80"], namespace="demo") as fwd:
            assert fwd.ports[0].local != 80 and fwd.ports[0].remote == pods.echo
            payloads = [os.urandom(100_000 + i) for i in range(50)]
            assert await asyncio.gather(*(roundtrip(fwd.ports[0].local, p) for p in payloads)) == payloads
        assert len(server.upgrades) == 1
    finally:
        await server.aclose()


async def test_refused_port_fails_only_its_own_connection(pods: Pods, tmp_path: Path) -> None:
    """A refused pod port ends that connection with kubelet's text; the forward keeps serving
    (client-go would close the whole connection here)."""
    server, endpoint = await _cluster(pods, tmp_path)
    errors: list[str] = []
    try:
        async with port_forward(endpoint, "pod/web-0", [f":{pods.echo}", f":{pods.refused}"],
                                namespace="demo", on_error=lambda _l, _r, msg: errors.append(msg)) as fwd:
            echo, refused = fwd.ports[0].local, fwd.ports[1].local
            slow = asyncio.ensure_future(roundtrip(echo, os.urandom(4 << 20)))
            assert await roundtrip(refused, b"x") == b""
            assert len(await slow) == 4 << 20
            assert await roundtrip(echo, b"after") == b"after"
            assert not fwd.lost.is_set()
        assert len(errors) == 1
        assert f"error forwarding port {pods.refused} to pod web-0" in errors[0]
        assert "connection refused" in errors[0]
    finally:
        await server.aclose()


async def test_deleted_pod_ends_the_forward_with_lost_connection(pods: Pods, tmp_path: Path) -> None:
    """Deleting the pod closes the upgraded connection: wait() raises 'lost connection to pod'."""
    server, endpoint = await _cluster(pods, tmp_path)
    try:
        async with port_forward(endpoint, "pod/web-0", [f":{pods.echo}"], namespace="demo") as fwd:
            assert await roundtrip(fwd.ports[0].local, b"hi") == b"hi"
            server.delete("Pod", "demo", "web-0")
            with pytest.raises(PortForwardError, match="lost connection to pod"):
                await asyncio.wait_for(fwd.wait(), 10)
    finally:
        await server.aclose()


async def test_slow_reader_stalls_only_its_own_stream(tmp_path: Path) -> None:
    """A connection nobody reads stops its pod's sender (window and TCP backpressure) while a
    second connection over the same upgrade receives everything; the first is intact after."""
    size = 48 << 20
    sent: list[int] = []

    async def push(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        slot = len(sent)
        sent.append(0)
        block = pattern(CHUNK)
        try:
            while sent[slot] < size:
                writer.write(block)
                await writer.drain()
                sent[slot] += CHUNK
            writer.write_eof()
            await reader.read()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    pusher = await asyncio.start_server(push, "127.0.0.1", 0)
    port = pusher.sockets[0].getsockname()[1]
    server = ClusterServer()
    server.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big", "namespace": "demo"},
                  "spec": {"containers": [{"name": "app"}]}, "status": {"podIP": "127.0.0.1"}})
    await server.start()
    endpoint = load_kubeconfig(server.write_kubeconfig(tmp_path / "kc"))
    try:
        async with port_forward(endpoint, "pod/big", [f":{port}"], namespace="demo") as fwd:
            local = fwd.ports[0].local
            slow_r, slow_w = await asyncio.open_connection("127.0.0.1", local)
            for _ in range(100):
                if sent:
                    break
                await asyncio.sleep(0.02)
            fast = await roundtrip(local, b"", timeout_s=60)
            assert len(fast) == size and fast[:CHUNK] == pattern(CHUNK)
            assert sent[0] < size // 2, f"the unread stream was not held back: {sent[0]} bytes sent"
            got = 0
            while data := await slow_r.read(CHUNK):
                got += len(data)
            assert got == size
            slow_w.close()
    finally:
        await server.aclose()
        pusher.close()
