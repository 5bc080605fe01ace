"""End-to-end tests of the userspace TCP dial: a dial given up on is closed and never relayed.

The held dial is real: the endpoint listens with ``listen(0)`` and a filler connection fills its
accept queue, so Linux drops the proxy's SYN (``tcp_conn_request``: a full accept queue drops
the SYN) and the proxy's connect() hangs until TCP retransmits the SYN about 1 s later. Freeing
the queue lets that retransmitted SYN complete, so a dial the proxy failed to close would
connect and its bytes would reach the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from kproxy.model import Endpoint, IPFamily
from kproxy.modes.userspace import TcpStats, UserspaceProxy
from tests.e2e.backends import TcpBackend, closed_port, service_port, snapshot, split, start_tcp_backend

pytestmark = pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture")


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Run every test on the stdlib loop and on uvloop (what `kproxy run` uses)."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.EventLoopPolicy()  # type: ignore[no-any-return]
    return asyncio.DefaultEventLoopPolicy()


class HeldEndpoint:
    """An endpoint whose accept queue is full, so a SYN to it is dropped until :meth:`release`.

    Once released, a thread accepts every connection and greets it with ``<ip:port>\\n`` (as the
    user's pods did), recording the peer of each connection but the filler's.
    """

    def __init__(self, ip: str) -> None:
        self.listener = socket.socket()
        self.listener.bind((ip, 0))
        self.listener.listen(0)
        self.address = self.listener.getsockname()
        self.identity = f"{self.address[0]}:{self.address[1]}"
        self.filler = socket.create_connection(self.address, timeout=2)
        self.accepted: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="held-endpoint", daemon=True)
        self._open: list[socket.socket] = []

    def release(self, after_s: float = 0.0) -> None:
        """Start accepting (first the filler, freeing the queue) ``after_s`` seconds from now."""
        self._after_s = after_s
        self._thread.start()

    def _serve(self) -> None:
        time.sleep(self._after_s)
        filler_peer = self.filler.getsockname()
        deadline = time.monotonic() + 10.0  # bounded: the tests stop it well before
        while not self._stop.is_set() and time.monotonic() < deadline:
            ready, _, _ = select.select([self.listener], [], [], 0.05)
            if not ready:
                continue
            conn, peer = self.listener.accept()
            self._open.append(conn)
            if peer[:2] != filler_peer[:2]:
                self.accepted.append(peer)
                with contextlib.suppress(OSError):
                    conn.sendall(f"{self.identity}\n".encode())

    def close(self) -> None:
        """Stop the thread and close every socket."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for sock in (*self._open, self.filler, self.listener):
            sock.close()


@contextlib.contextmanager
def held_endpoint(ip: str) -> Iterator[HeldEndpoint]:
    """A :class:`HeldEndpoint` on ``ip``, closed at the end."""
    held = HeldEndpoint(ip)
    try:
        yield held
    finally:
        held.close()


async def _exchange(host: str, port: int, line: str, timeout_s: float = 10.0) -> bytes:
    """Connect, send ``line``, half-close, and return every byte received until EOF."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            writer.write_eof()
            return await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


def _tcp_stats(proxy: UserspaceProxy, service: str = "default/web") -> TcpStats:
    stats = proxy.stats()[(service, "TCP", IPFamily.IPv4)]
    assert isinstance(stats, TcpStats)
    return stats


async def test_a_dial_given_up_on_is_closed_and_never_relayed() -> None:
    """A dial held past its timeout and released later never connects: the client gets one backend's bytes."""
    good = await start_tcp_backend("127.12.0.2")
    with held_endpoint("127.12.0.1") as held:
        async with UserspaceProxy(dial_timeouts_s=(0.3, 5.0)) as proxy:
            await proxy.apply(snapshot(service_port("web", "10.96.0.10", 80, [
                service_endpoint(held.address), good.endpoint()])))
            host, port = split(proxy.listen_address("default/web") or "")
            held.release(after_s=0.4)  # after the proxy gave up, before the SYN is retransmitted
            got = await _exchange(host, port, "ping")
            await asyncio.sleep(1.5)  # the retransmitted SYN (about 1 s after the first) comes and goes
            stats = _tcp_stats(proxy)
        assert held.accepted == []
    await good.aclose()
    assert got == f"{good.identity}\nping\n".encode()
    assert (stats.dial_failures, stats.relayed) == (1, 1)


async def test_a_dial_completing_while_the_loop_stalls_past_its_timeout_is_never_relayed() -> None:
    """A dial whose handshake and greeting arrive while the loop is stalled past the timeout is dropped."""
    good = await start_tcp_backend("127.12.1.2")
    with held_endpoint("127.12.1.1") as held:
        async with UserspaceProxy(dial_timeouts_s=(1.2, 5.0)) as proxy:
            await proxy.apply(snapshot(service_port("web", "10.96.0.10", 80, [
                service_endpoint(held.address), good.endpoint()])))
            host, port = split(proxy.listen_address("default/web") or "")
            held.release(after_s=0.5)
            loop = asyncio.get_running_loop()
            # From 0.9 s to 1.8 s the loop is blocked: the SYN retransmitted at about 1 s completes
            # and the endpoint greets, all before the proxy sees its 1.2 s deadline pass.
            loop.call_later(0.9, time.sleep, 0.9)
            got = await _exchange(host, port, "ping")
            stats = _tcp_stats(proxy)
        assert len(held.accepted) <= 1  # the kernel may complete it; the proxy must not relay it
    await good.aclose()
    assert got == f"{good.identity}\nping\n".encode()
    assert (stats.dial_failures, stats.relayed) == (1, 1)


def service_endpoint(address: tuple[str, int]) -> Endpoint:
    """The model Endpoint for ``(ip, port)``."""
    return Endpoint(ip=address[0], port=int(address[1]))


async def test_a_failed_dial_logs_one_line_with_what_failed_why_and_the_retry() -> None:
    """A refused and a timed-out dial each log one line: endpoint, attempt n/m, reason, what happens next."""
    good = await start_tcp_backend("127.12.2.3")
    dead = Endpoint(ip="127.12.2.1", port=closed_port("127.12.2.1"))
    with held_endpoint("127.12.2.2") as held, capture_logs() as logs:
        async with UserspaceProxy(dial_timeouts_s=(0.2, 0.2, 5.0)) as proxy:
            await proxy.apply(snapshot(service_port("web", "10.96.0.10", 80, [
                dead, service_endpoint(held.address), good.endpoint()])))
            got = await _exchange(*split(proxy.listen_address("default/web") or ""), "ping")
    await good.aclose()
    assert got == f"{good.identity}\nping\n".encode()
    dials = [e for e in logs if e["event"] == "dial failed"]
    assert [(e["endpoint"], e["attempt"], e["error"], e["retry"]) for e in dials] == [
        (dead.address, "1/3", "Connection refused", "now, on the next endpoint"),
        (held.identity, "2/3", "timed out after 0.2 s", "now, on the next endpoint"),
    ]
    assert all("exc_info" not in e and e["log_level"] == "warning" for e in dials)


class PodsThread:
    """Greeting pods (``<ip:port>\\n``, then echo) served by their own event loop in a thread, so
    a pod greets as soon as the kernel completes a handshake, whatever the proxy's loop is doing."""

    def __init__(self, groups: list[list[str]]) -> None:
        self._groups = groups
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pods", daemon=True)
        self._backends: list[list[TcpBackend]] = []

    def start(self) -> list[list[TcpBackend]]:
        """Start the pods; returns them grouped as given."""
        self._thread.start()

        async def start_all() -> list[list[TcpBackend]]:
            return [[await start_tcp_backend(ip) for ip in group] for group in self._groups]

        self._backends = asyncio.run_coroutine_threadsafe(start_all(), self._loop).result(timeout=30)
        return self._backends

    def stop(self) -> None:
        """Close every pod, stop the loop and join the thread."""
        async def close_all() -> None:
            for group in self._backends:
                for backend in group:
                    await backend.aclose()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


class _BusyLoop:
    """Makes every loop iteration last at least ``step_s`` seconds, as a loop busy with thousands of
    connections does, so a dial deadline often expires between a dial's completion and its task's wakeup."""

    def __init__(self, loop: asyncio.AbstractEventLoop, step_s: float) -> None:
        self._loop, self._step_s, self._on = loop, step_s, True
        loop.call_soon(self._tick)

    def _tick(self) -> None:
        if self._on:
            time.sleep(self._step_s)
            self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._on = False


async def test_many_services_with_short_dial_timeouts_never_mix_two_backends_in_one_connection() -> None:
    """40 Services of two greeting pods, 800 concurrent connections, dials often timing out: one backend."""
    services, pods, per_service = 40, 2, 20
    need = 5 * services * per_service + 500
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    pods_thread = PodsThread([[f"127.13.{s}.{p + 1}" for p in range(pods)] for s in range(services)])
    backends = pods_thread.start()
    identities = {b.identity for group in backends for b in group}
    try:
        answers, failures = await _many_connections(backends, services * per_service)
    finally:
        pods_thread.stop()
    mixed = []
    for i, answer in enumerate(answers):
        lines = answer.decode().splitlines()
        if not (len(lines) == 2 and lines[0] in identities and lines[1] == f"ping {i}"):
            mixed.append(lines)
    assert mixed == [], f"{len(mixed)} connections got bytes from more than one backend, e.g. {mixed[:3]}"
    assert failures > 0, "no dial timed out: the retry path was not exercised"


async def _many_connections(backends: list[list[TcpBackend]], n: int) -> tuple[list[bytes], int]:
    services = len(backends)
    # A first attempt of 2 ms often times out while the loopback handshake is under way (the
    # user's retries came from 0.25 s under 4,000 connections); the retry has 10 s.
    async with UserspaceProxy(dial_timeouts_s=(0.004, 10.0)) as proxy:
        await proxy.apply(snapshot(*(
            service_port(f"web{s}", f"10.96.1.{s + 1}", 80, [b.endpoint() for b in group])
            for s, group in enumerate(backends))))
        targets = [split(proxy.listen_address(f"default/web{s}") or "") for s in range(services)]
        busy = _BusyLoop(asyncio.get_running_loop(), 0.003)
        async with asyncio.timeout(90):
            answers = await asyncio.gather(*(
                _exchange(*targets[i % services], f"ping {i}", timeout_s=60)
                for i in range(n)))
        busy.stop()
        failures = sum(_tcp_stats(proxy, f"default/web{s}").dial_failures for s in range(services))
    return answers, failures


async def test_shutdown_during_a_held_dial_resets_the_client_and_leaves_nothing_open() -> None:
    """aclose() during a dial held in SYN: client reset, nothing stays open, the endpoint never connects."""
    with held_endpoint("127.12.3.1") as held:
        proxy = UserspaceProxy(dial_timeouts_s=(5.0,))
        await proxy.apply(snapshot(service_port("web", "10.96.0.10", 80, [service_endpoint(held.address)])))
        reader, writer = await asyncio.open_connection(*split(proxy.listen_address("default/web") or ""))
        writer.write(b"ping\n")
        await asyncio.sleep(0.3)  # the dial is under way, its SYN dropped by the full queue
        assert [c.endpoint for c in proxy.connections()] == [None]
        await proxy.aclose(0.0)
        held.release()
        async with asyncio.timeout(5):
            with pytest.raises(ConnectionResetError):
                await reader.read()
        writer.close()
        await asyncio.sleep(1.5)  # a retransmitted SYN of a leaked dial would be accepted now
        assert proxy.connections() == [] and held.accepted == []
