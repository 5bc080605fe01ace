"""End-to-end tests of the userspace TCP relay over real loopback sockets."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import resource
import socket
from collections import Counter

import pytest

from kproxy.model import Endpoint, IPFamily
from kproxy.modes.userspace import UserspaceProxy
from kproxy.modes.userspace.tcp import WRITE_HIGH_WATER_BYTES
from tests.e2e.backends import (
    FakeClock,
    TcpBackend,
    closed_port,
    hash_upload,
    identify,
    read_line,
    record_end,
    reset,
    reset_after_line,
    service_port,
    shut_first,
    snapshot,
    source,
    split,
    start_tcp_backend,
)

CLUSTER_IP = "10.96.0.10"

# Moving to the pytest_asyncio_loop_factories hook needs a conftest change (tests/conftest.py).
pytestmark = pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture")


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Run every test on the stdlib loop and on uvloop (what `kproxy run` uses)."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.EventLoopPolicy()  # type: ignore[no-any-return]
    return asyncio.DefaultEventLoopPolicy()


async def _backends(n: int, base: str = "127.10.0", **kw: object) -> list[TcpBackend]:
    return [await start_tcp_backend(f"{base}.{i + 1}", **kw) for i in range(n)]  # type: ignore[arg-type]


async def _close(*backends: TcpBackend) -> None:
    for b in backends:
        await b.aclose()


async def _served(proxy: UserspaceProxy, service: str = "default/web") -> tuple[str, int]:
    listen = proxy.listen_address(service)
    assert listen is not None, proxy.address_table()
    return split(listen)


async def test_round_robin_spreads_over_three_endpoints() -> None:
    """Nine connections to a Service with three endpoints reach each endpoint three times, in turn."""
    backs = await _backends(3)
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [b.endpoint() for b in backs])))
        host, port = await _served(proxy)
        seen = [await identify(host, port) for _ in range(9)]
    await _close(*backs)
    assert Counter(seen) == {b.identity: 3 for b in backs}
    assert seen[:3] == sorted({b.identity for b in backs}) and seen[3:6] == seen[:3]


async def test_client_ip_affinity_holds_then_expires() -> None:
    """With ClientIP affinity a client keeps its endpoint until the timeout passes on the injected clock."""
    backs = await _backends(3)
    clock = FakeClock()
    async with UserspaceProxy(clock=clock) as proxy:
        info = service_port("web", CLUSTER_IP, 80, [b.endpoint() for b in backs], affinity_s=10)
        await proxy.apply(snapshot(info))
        host, port = await _served(proxy)
        first = await identify(host, port)
        for _ in range(4):
            clock.advance(9.0)  # each hit refreshes last_used, so 9 s gaps never expire it
            assert await identify(host, port) == first
        clock.advance(10.0)
        after = await identify(host, port)
    await _close(*backs)
    assert after != first


async def test_dead_endpoint_is_skipped() -> None:
    """A dial refused by a dead endpoint moves on to the next endpoint, so every client is served."""
    live = await start_tcp_backend("127.10.1.2")
    dead_port = closed_port("127.10.1.1")
    async with UserspaceProxy() as proxy:
        eps = [Endpoint(ip="127.10.1.1", port=dead_port), live.endpoint()]
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, eps)))
        host, port = await _served(proxy)
        seen = [await identify(host, port) for _ in range(4)]
        stats = proxy.stats()[("default/web", "TCP", IPFamily.IPv4)]
    await live.aclose()
    assert seen == [live.identity] * 4
    # Sorted order puts the dead endpoint first, so each connection fails once, then moves on.
    assert stats.dial_failures == 4 and stats.relayed == 4 and stats.refused == 0


async def test_endpoint_removal_keeps_open_connection() -> None:
    """Removing an endpoint keeps its open connection working while new connections go elsewhere."""
    a, b = await _backends(2, base="127.10.2")
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [a.endpoint()])))
        host, port = await _served(proxy)
        reader, writer = await asyncio.open_connection(host, port)
        assert await read_line(reader) == a.identity
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [b.endpoint()]), revision=2))
        assert await _served(proxy) == (host, port)  # same listener, balancer updated in place
        writer.write(b"still here\n")
        assert await read_line(reader) == "still here"
        assert [await identify(host, port) for _ in range(3)] == [b.identity] * 3
        writer.close()
    await _close(a, b)


async def test_service_removal_closes_listener_but_not_connections() -> None:
    """Removing a Service closes its listener (new connects refused) while open connections keep working."""
    (a,) = await _backends(1, base="127.10.3")
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [a.endpoint()])))
        host, port = await _served(proxy)
        reader, writer = await asyncio.open_connection(host, port)
        assert await read_line(reader) == a.identity
        await proxy.apply(snapshot(revision=2))
        assert proxy.address_table() == []
        with pytest.raises(ConnectionRefusedError):
            await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        writer.write(b"ping\n")
        assert await read_line(reader) == "ping"
        writer.close()
    await a.aclose()


async def test_half_close_from_client() -> None:
    """A client's EOF reaches the endpoint, and the endpoint's answer still reaches the client."""
    (a,) = await _backends(1, base="127.10.4", handler=hash_upload)
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [a.endpoint()])))
        reader, writer = await asyncio.open_connection(*await _served(proxy))
        writer.write(b"hello")
        writer.write_eof()
        assert await read_line(reader) == a.identity
        assert await read_line(reader) == f"{hashlib.sha256(b'hello').hexdigest()} 5"
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()
    await a.aclose()


async def test_half_close_from_endpoint() -> None:
    """An endpoint's EOF reaches the client, and the client can still send to the endpoint after it."""
    (a,) = await _backends(1, base="127.10.5", handler=shut_first)
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [a.endpoint()])))
        reader, writer = await asyncio.open_connection(*await _served(proxy))
        async with asyncio.timeout(5):
            assert await reader.read() == f"{a.identity}\nbye".encode()  # EOF arrived
        writer.write(b"after your eof")
        writer.write_eof()
        async with asyncio.timeout(5):
            while not a.received:
                await asyncio.sleep(0.01)
        writer.close()
    await a.aclose()
    assert a.received == [b"after your eof"]


async def test_64_mib_transfer_both_ways_keeps_sha256() -> None:
    """64 MiB up and 64 MiB down through the proxy arrive intact (same SHA-256)."""
    size = 64 << 20
    up = await start_tcp_backend("127.10.6.1", handler=hash_upload)
    payload = os.urandom(1 << 20)
    down = await start_tcp_backend("127.10.6.2", handler=source(size, payload), greet=False)
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("up", CLUSTER_IP, 80, [up.endpoint()]),
                                   service_port("down", "10.96.0.11", 80, [down.endpoint()])))
        async with asyncio.timeout(60):
            reader, writer = await asyncio.open_connection(*await _served(proxy, "default/up"))
            expected = hashlib.sha256()
            for _ in range(64):
                writer.write(payload)
                expected.update(payload)
                await writer.drain()
            writer.write_eof()
            assert await read_line(reader) == up.identity
            assert await read_line(reader) == f"{expected.hexdigest()} {size}"
            writer.close()

            reader, writer = await asyncio.open_connection(*await _served(proxy, "default/down"))
            got = hashlib.sha256()
            total = 0
            while data := await reader.read(1 << 20):
                got.update(data)
                total += len(data)
            writer.close()
    await _close(up, down)
    assert total == size
    assert got.hexdigest() == hashlib.sha256(payload * 64).hexdigest()


async def test_thousand_concurrent_connections() -> None:
    """1000 connections open at once are all relayed and echoed correctly."""
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 4 * n + 200
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    backs = await _backends(2, base="127.10.7")
    # One long dial timeout: on a loaded machine 0.25 s can pass before a loopback dial completes,
    # and the retry on the other endpoint would unbalance the split asserted below.
    async with UserspaceProxy(dial_timeouts_s=(10.0,)) as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [b.endpoint() for b in backs])))
        host, port = await _served(proxy)
        conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            async with asyncio.timeout(60):
                for _ in range(n):
                    conns.append(await asyncio.open_connection(host, port))
                greetings = await asyncio.gather(*(read_line(r, 30) for r, _ in conns))
                assert len(proxy.connections()) == n
                for i, (_, w) in enumerate(conns):
                    w.write(f"msg {i}\n".encode())
                answers = await asyncio.gather(*(read_line(r, 30) for r, _ in conns))
        finally:
            for _, w in conns:
                w.close()
    await _close(*backs)
    assert Counter(greetings) == {b.identity: n // 2 for b in backs}
    assert answers == [f"msg {i}" for i in range(n)]


async def test_no_endpoints_refuses_connect() -> None:
    """A Service with no endpoints refuses connect() (ECONNREFUSED), as kube-proxy's REJECT rule does."""
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [])))
        host, port = await _served(proxy)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        balancer = proxy.balancer("default/web")
        assert balancer is not None and balancer.endpoints == ()


async def test_port_stays_held_while_no_endpoints() -> None:
    """While a Service has no endpoints its TCP port stays reserved: another socket cannot bind it."""
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [])))
        host, port = await _served(proxy)
        with socket.socket() as other, pytest.raises(OSError) as caught:
            other.bind((host, port))
    assert caught.value.errno == errno.EADDRINUSE


async def test_listening_follows_endpoints_on_the_same_address() -> None:
    """Losing every endpoint stops listening and getting one back listens again on the same ip:port."""
    (a,) = await _backends(1, base="127.10.9")
    info = service_port("web", CLUSTER_IP, 80, [a.endpoint()])
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(info))
        host, port = await _served(proxy)
        assert await identify(host, port) == a.identity
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, []), revision=2))
        assert await _served(proxy) == (host, port)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        await proxy.apply(snapshot(info, revision=3))
        assert await _served(proxy) == (host, port)
        assert await identify(host, port) == a.identity
    await a.aclose()


async def test_open_connection_survives_losing_every_endpoint() -> None:
    """A connection open when the last endpoint leaves keeps working after the listener stops."""
    (a,) = await _backends(1, base="127.10.10")
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [a.endpoint()])))
        reader, writer = await asyncio.open_connection(*await _served(proxy))
        assert await read_line(reader) == a.identity
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, []), revision=2))
        writer.write(b"still here\n")
        assert await read_line(reader) == "still here"
        writer.close()
    await a.aclose()


async def test_round_robin_survives_a_flapping_endpoint() -> None:
    """With a fourth endpoint flapping before every request, twelve requests spread over all endpoints."""
    backs = await _backends(4, base="127.10.11")
    steady = [b.endpoint() for b in backs[:3]]
    async with UserspaceProxy() as proxy:
        seen = []
        for i in range(12):
            eps = [*steady, backs[3].endpoint()] if i % 2 else steady
            await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, eps), revision=i + 1))
            seen.append(await identify(*await _served(proxy)))
    await _close(*backs)
    assert Counter(seen) == {b.identity: 3 for b in backs}, seen


async def test_endpoint_reset_reaches_client_as_reset() -> None:
    """An endpoint that resets its connection makes the proxy reset the client's, not close it cleanly."""
    (a,) = await _backends(1, base="127.10.12", handler=reset_after_line)
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [a.endpoint()])))
        reader, writer = await asyncio.open_connection(*await _served(proxy))
        assert await read_line(reader) == a.identity
        writer.write(b"crash now\n")
        async with asyncio.timeout(5):
            with pytest.raises(ConnectionResetError):
                await reader.read()
        writer.close()
    await a.aclose()


async def test_client_reset_reaches_endpoint_as_reset() -> None:
    """A client that resets its connection makes the proxy reset the endpoint's, not close it cleanly."""
    (a,) = await _backends(1, base="127.10.13", handler=record_end)
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [a.endpoint()])))
        reader, writer = await asyncio.open_connection(*await _served(proxy))
        assert await read_line(reader) == a.identity
        reset(writer)
        async with asyncio.timeout(5):
            while not a.received:
                await asyncio.sleep(0.01)
    await a.aclose()
    assert a.received == [b"reset"]


async def test_slow_reader_bounds_proxy_buffers() -> None:
    """A client that stops reading stops the endpoint's sending too; the proxy's buffers stay bounded."""
    total = 64 << 20
    (a,) = await _backends(1, base="127.10.8", handler=source(total), greet=False)
    bound = WRITE_HIGH_WATER_BYTES + 256 * 1024  # high-water mark plus one read
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [a.endpoint()])))
        reader, writer = await asyncio.open_connection(*await _served(proxy), limit=1 << 16)
        peak = 0
        for _ in range(40):  # 1 s without reading
            await asyncio.sleep(0.025)
            for conn in proxy.connections():
                peak = max(peak, conn.buffered_to_client, conn.buffered_to_endpoint)
        assert 0 < a.sent < total // 2, a.sent  # the backend was throttled too
        assert peak <= bound, peak
        received = 0
        async with asyncio.timeout(60):
            while data := await reader.read(1 << 20):
                received += len(data)
        writer.close()
    await a.aclose()
    assert received == total


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
async def test_cancelled_apply_while_reopening_the_listener_is_repaired_by_the_next(steps: int) -> None:
    """An apply cancelled while it opens the listening socket leaves the next apply able to serve."""
    (a,) = await _backends(1, base="127.10.14")
    info = service_port("web", CLUSTER_IP, 80, [a.endpoint()])
    async with UserspaceProxy() as proxy:
        await proxy.apply(snapshot(service_port("web", CLUSTER_IP, 80, [])))
        async with asyncio.TaskGroup() as tg:  # a cancelled child does not fail the group
            task = tg.create_task(proxy.apply(snapshot(info, revision=2)))
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
        await proxy.apply(snapshot(info, revision=3))
        assert await identify(*await _served(proxy)) == a.identity
    await a.aclose()
