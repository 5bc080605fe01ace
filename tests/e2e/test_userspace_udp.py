"""End-to-end tests of the userspace UDP relay over real loopback sockets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

import pytest

from kproxy.model import Protocol
from kproxy.modes.userspace import UserspaceProxy
from tests.e2e.backends import UdpBackend, service_port, snapshot, split, start_udp_backend

CLUSTER_IP = "10.96.0.53"

# Moving to the pytest_asyncio_loop_factories hook needs a conftest change (tests/conftest.py).
pytestmark = pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture")


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Run every test on the stdlib loop and on uvloop (what `kproxy run` uses)."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.EventLoopPolicy()  # type: ignore[no-any-return]
    return asyncio.DefaultEventLoopPolicy()


class _Client(asyncio.DatagramProtocol):
    """An unconnected UDP client that records ``(data, source address)`` of every reply."""

    def __init__(self) -> None:
        self.replies: asyncio.Queue[tuple[bytes, tuple[str, int]]] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.replies.put_nowait((data, addr))


class _ConnectedClient(asyncio.DatagramProtocol):
    """A connected UDP client that records replies and the errors (ICMP) its socket reports."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[bytes | Exception] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.events.put_nowait(data)

    def error_received(self, exc: Exception) -> None:
        self.events.put_nowait(exc)


async def _connected(ip: str, dest: tuple[str, int]) -> tuple[asyncio.DatagramTransport, _ConnectedClient]:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(_ConnectedClient, local_addr=(ip, 0),
                                                           remote_addr=dest)
    return transport, proto


async def _client(ip: str) -> tuple[asyncio.DatagramTransport, _Client]:
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(_Client, local_addr=(ip, 0))
    return transport, proto


async def _ask(transport: asyncio.DatagramTransport, proto: _Client, dest: tuple[str, int],
               data: bytes) -> tuple[bytes, tuple[str, int]]:
    transport.sendto(data, dest)
    async with asyncio.timeout(5):
        return await proto.replies.get()


def _udp_service(backends: Sequence[UdpBackend], **kw: object) -> object:
    return snapshot(service_port("dns", CLUSTER_IP, 53, [b.endpoint() for b in backends],
                                 protocol=Protocol.UDP, **kw))  # type: ignore[arg-type]


async def test_udp_request_reply_from_several_clients() -> None:
    """Several clients get replies from the service address, each keeping its session's endpoint."""
    backs = [await start_udp_backend(f"127.20.0.{i}") for i in (1, 2)]
    async with UserspaceProxy() as proxy:
        await proxy.apply(_udp_service(backs))  # type: ignore[arg-type]
        listen = proxy.listen_address("default/dns", "UDP")
        assert listen is not None
        dest = split(listen)
        clients = [await _client(f"127.21.0.{i}") for i in range(1, 5)]
        owners = []
        for n, (transport, proto) in enumerate(clients):
            replies = [await _ask(transport, proto, dest, f"q{n}-{k}".encode()) for k in range(3)]
            assert all(src == dest for _, src in replies), replies
            idents = {data.split(b"|")[0] for data, _ in replies}
            assert len(idents) == 1  # one session, one endpoint
            assert [data.split(b"|")[1] for data, _ in replies] == [f"q{n}-{k}".encode() for k in range(3)]
            owners.append(idents.pop().decode())
        for transport, _ in clients:
            transport.close()
    for b in backs:
        b.close()
    assert owners == [backs[0].identity, backs[1].identity] * 2  # new sessions go round robin


async def test_udp_session_expires_after_idle_timeout() -> None:
    """A session idle for longer than the timeout is closed and the next datagram opens a new one."""
    backs = [await start_udp_backend(f"127.20.1.{i}") for i in (1, 2)]
    async with UserspaceProxy(udp_idle_timeout_s=0.2) as proxy:
        await proxy.apply(_udp_service(backs))  # type: ignore[arg-type]
        listen = proxy.listen_address("default/dns", "UDP")
        assert listen is not None
        transport, proto = await _client("127.21.1.1")
        first, _ = await _ask(transport, proto, split(listen), b"a")
        balancer = proxy.balancer("default/dns", "UDP")
        assert balancer is not None and balancer.active_connections() == 1
        async with asyncio.timeout(5):
            while balancer.active_connections():
                await asyncio.sleep(0.05)
        second, _ = await _ask(transport, proto, split(listen), b"b")
        transport.close()
    for b in backs:
        b.close()
    assert first.split(b"|")[0] != second.split(b"|")[0]


async def test_udp_large_datagram_is_not_truncated() -> None:
    """A 60000-byte datagram crosses the relay whole both ways (the legacy proxy cut at 4 KiB)."""
    back = await start_udp_backend("127.20.2.1")
    async with UserspaceProxy() as proxy:
        await proxy.apply(_udp_service([back]))  # type: ignore[arg-type]
        listen = proxy.listen_address("default/dns", "UDP")
        assert listen is not None
        transport, proto = await _client("127.21.2.1")
        payload = bytes(range(256)) * 234 + b"x" * 96
        data, _ = await _ask(transport, proto, split(listen), payload)
        transport.close()
    back.close()
    assert data == back.identity.encode() + b"|" + payload


async def test_udp_without_endpoints_is_refused() -> None:
    """A datagram to a UDP Service with no endpoints is refused (ICMP port unreachable: ECONNREFUSED)."""
    async with UserspaceProxy() as proxy:
        await proxy.apply(_udp_service([]))  # type: ignore[arg-type]
        listen = proxy.listen_address("default/dns", "UDP")
        assert listen is not None
        transport, proto = await _connected("127.21.3.1", split(listen))
        transport.sendto(b"anyone?")
        async with asyncio.timeout(5):
            event = await proto.events.get()
        transport.close()
    assert isinstance(event, ConnectionRefusedError), event


async def test_udp_serves_again_on_the_same_address_when_endpoints_return() -> None:
    """A UDP Service that lost every endpoint is served again on the same ip:port once one returns."""
    back = await start_udp_backend("127.20.5.1")
    async with UserspaceProxy() as proxy:
        await proxy.apply(_udp_service([back]))  # type: ignore[arg-type]
        before = proxy.listen_address("default/dns", "UDP")
        await proxy.apply(_udp_service([]))  # type: ignore[arg-type]
        await proxy.apply(_udp_service([back]))  # type: ignore[arg-type]
        listen = proxy.listen_address("default/dns", "UDP")
        assert listen is not None and listen == before
        transport, proto = await _client("127.21.5.1")
        data, _ = await _ask(transport, proto, split(listen), b"back?")
        transport.close()
    back.close()
    assert data == back.identity.encode() + b"|back?"


async def test_udp_rebind_falls_back_when_the_port_was_taken() -> None:
    """A UDP port taken while the Service had no endpoints falls back to a free port, shown in the table."""
    back = await start_udp_backend("127.20.6.1")
    async with UserspaceProxy() as proxy:
        await proxy.apply(_udp_service([back]))  # type: ignore[arg-type]
        await proxy.apply(_udp_service([]))  # type: ignore[arg-type]
        before = proxy.listen_address("default/dns", "UDP")
        assert before is not None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as squatter:
            squatter.bind(split(before))
            await proxy.apply(_udp_service([back]))  # type: ignore[arg-type]
            listen = proxy.listen_address("default/dns", "UDP")
            assert listen is not None
            assert split(listen)[0] == split(before)[0] and listen != before
            assert [e.listen for e in proxy.address_table()] == [listen]
            transport, proto = await _client("127.21.6.1")
            data, _ = await _ask(transport, proto, split(listen), b"q")
            transport.close()
    back.close()
    assert data == back.identity.encode() + b"|q"


async def test_udp_session_moves_off_a_removed_endpoint() -> None:
    """A busy session whose endpoint is removed ends; the client's next datagram reaches a remaining one."""
    a, b = [await start_udp_backend(f"127.20.7.{i}") for i in (1, 2)]
    async with UserspaceProxy() as proxy:
        await proxy.apply(_udp_service([a, b]))  # type: ignore[arg-type]
        listen = proxy.listen_address("default/dns", "UDP")
        assert listen is not None
        transport, proto = await _client("127.21.7.1")
        first, _ = await _ask(transport, proto, split(listen), b"1")
        assert first.startswith(a.identity.encode())  # sorted order: a first
        await proxy.apply(_udp_service([b]))  # type: ignore[arg-type]
        balancer = proxy.balancer("default/dns", "UDP")
        assert balancer is not None and balancer.active_connections(a.identity) == 0
        second, _ = await _ask(transport, proto, split(listen), b"2")
        transport.close()
    a.close()
    b.close()
    assert second == b.identity.encode() + b"|2"


async def test_udp_removed_endpoint_gets_no_new_sessions() -> None:
    """After an endpoint is removed, new clients' sessions go to the remaining endpoint only."""
    a, b = [await start_udp_backend(f"127.20.4.{i}") for i in (1, 2)]
    async with UserspaceProxy() as proxy:
        await proxy.apply(_udp_service([a, b]))  # type: ignore[arg-type]
        await proxy.apply(_udp_service([b]))  # type: ignore[arg-type]
        listen = proxy.listen_address("default/dns", "UDP")
        assert listen is not None
        seen = set()
        for i in range(1, 4):
            transport, proto = await _client(f"127.21.4.{i}")
            data, _ = await _ask(transport, proto, split(listen), b"q")
            seen.add(data.split(b"|")[0].decode())
            transport.close()
    a.close()
    b.close()
    assert seen == {b.identity}


@pytest.mark.parametrize("steps", [0, 1, 2, 3])
async def test_cancelled_apply_while_rebinding_is_repaired_by_the_next(steps: int) -> None:
    """An apply cancelled while it re-binds the UDP socket leaves the next apply able to serve."""
    back = await start_udp_backend("127.20.8.1")
    async with UserspaceProxy() as proxy:
        await proxy.apply(_udp_service([back]))  # type: ignore[arg-type]
        await proxy.apply(_udp_service([]))  # type: ignore[arg-type]
        async with asyncio.TaskGroup() as tg:  # a cancelled child does not fail the group
            task = tg.create_task(proxy.apply(_udp_service([back])))  # type: ignore[arg-type]
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
        await proxy.apply(_udp_service([back]))  # type: ignore[arg-type]
        listen = proxy.listen_address("default/dns", "UDP")
        assert listen is not None
        transport, proto = await _client("127.21.8.1")
        data, _ = await _ask(transport, proto, split(listen), b"q")
        transport.close()
    back.close()
    assert data == back.identity.encode() + b"|q"
