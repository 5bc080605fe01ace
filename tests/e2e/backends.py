"""Backends and snapshot helpers for the userspace proxy's end-to-end tests.

Every backend runs in the test's own event loop on a loopback address the test picks (port 0
unless given) and knows its identity, ``ip:port``:

* :func:`start_tcp_backend` greets each connection with ``<identity>\\n``, then runs a handler
  (by default: echo until EOF, then close; :func:`reset_after_line` resets the connection,
  :func:`record_end` records how the client's side ended);
* :func:`start_udp_backend` answers every datagram with ``<identity>|<datagram>``.

:func:`service_port` and :func:`snapshot` build model values directly, for tests that do not need
the full parse-and-categorise path.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

from kproxy.model import (
    Endpoint,
    IPFamily,
    NodeConfig,
    Protocol,
    ServicePortInfo,
    ServicePortName,
    Snapshot,
)

Handler = Callable[["TcpBackend", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class FakeClock:
    """A clock the test moves by hand: call it for the time in seconds."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        self.now_s += seconds


@dataclass
class TcpBackend:
    """A running TCP backend; ``received`` collects what handlers record, ``sent`` counts bytes."""

    ip: str
    port: int
    server: asyncio.Server | None = None
    received: list[bytes] = field(default_factory=list)
    sent: int = 0
    connections: int = 0

    @property
    def identity(self) -> str:
        """``ip:port`` of this backend."""
        return f"{self.ip}:{self.port}"

    def endpoint(self) -> Endpoint:
        """This backend as a model Endpoint."""
        return Endpoint(ip=self.ip, port=self.port)

    async def aclose(self) -> None:
        """Stop accepting (open connections end when their handlers do)."""
        if self.server is not None:
            self.server.close()
            self.server = None


async def echo(backend: TcpBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo every byte until EOF, then close."""
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()


async def hash_upload(
    backend: TcpBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Read until EOF, then answer with the SHA-256 hex digest and the byte count."""
    digest = hashlib.sha256()
    total = 0
    while data := await reader.read(1 << 20):
        digest.update(data)
        total += len(data)
    writer.write(f"{digest.hexdigest()} {total}\n".encode())
    await writer.drain()


def source(total_bytes: int, chunk: bytes = b"x" * 65536) -> Handler:
    """A handler that sends ``total_bytes`` (repeated ``chunk``) with backpressure, then closes."""

    async def run(backend: TcpBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        left = total_bytes
        while left > 0:
            piece = chunk[: min(left, len(chunk))]
            writer.write(piece)
            await writer.drain()
            left -= len(piece)
            backend.sent += len(piece)

    return run


async def shut_first(backend: TcpBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Half-close first (send ``bye`` and EOF), then record everything the client still sends."""
    writer.write(b"bye")
    writer.write_eof()
    backend.received.append(await reader.read())


def reset(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s connection with a RST (SO_LINGER 0, then abort)."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def reset_after_line(
    backend: TcpBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Read one line, then reset the connection (a crashing server)."""
    await reader.readline()
    reset(writer)


async def record_end(backend: TcpBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read until the connection ends; record ``b"eof"`` for an orderly end, ``b"reset"`` for a RST."""
    try:
        while await reader.read(65536):
            pass
    except ConnectionResetError:
        backend.received.append(b"reset")
        return
    backend.received.append(b"eof")


async def start_tcp_backend(
    ip: str, *, port: int = 0, handler: Handler = echo, greet: bool = True
) -> TcpBackend:
    """Start a TCP backend on ``ip:port`` that greets with its identity and runs ``handler``."""
    backend = TcpBackend(ip=ip, port=port)

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend.connections += 1
        try:
            if greet:
                writer.write(f"{backend.identity}\n".encode())
            await handler(backend, reader, writer)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    backend.server = await asyncio.start_server(on_client, ip, port, backlog=4096, reuse_address=True)
    backend.port = backend.server.sockets[0].getsockname()[1]
    return backend


class _UdpIdentity(asyncio.DatagramProtocol):
    def __init__(self, backend: UdpBackend) -> None:
        self.backend = backend
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.backend.peers.add(addr)
        assert self.transport is not None
        self.transport.sendto(self.backend.identity.encode() + b"|" + data, addr)


@dataclass
class UdpBackend:
    """A running UDP backend; ``peers`` are the source addresses it saw (the proxy's sessions)."""

    ip: str
    port: int
    transport: asyncio.DatagramTransport | None = None
    peers: set[tuple[str, int]] = field(default_factory=set)

    @property
    def identity(self) -> str:
        """``ip:port`` of this backend."""
        return f"{self.ip}:{self.port}"

    def endpoint(self) -> Endpoint:
        """This backend as a model Endpoint."""
        return Endpoint(ip=self.ip, port=self.port)

    def close(self) -> None:
        """Close the socket."""
        if self.transport is not None:
            self.transport.close()


async def start_udp_backend(ip: str, *, port: int = 0) -> UdpBackend:
    """Start a UDP backend on ``ip:port`` that answers ``<identity>|<datagram>``."""
    backend = UdpBackend(ip=ip, port=port)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: _UdpIdentity(backend), local_addr=(ip, port))
    backend.transport = transport
    backend.port = transport.get_extra_info("sockname")[1]
    return backend


def closed_port(ip: str) -> int:
    """A port on ``ip`` that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def service_port(
    name: str,
    cluster_ip: str,
    port: int,
    endpoints: Sequence[Endpoint],
    *,
    protocol: Protocol = Protocol.TCP,
    affinity_s: int | None = None,
    namespace: str = "default",
    port_name: str = "",
) -> ServicePortInfo:
    """A ServicePortInfo whose cluster endpoints are ``endpoints`` (all ready)."""
    eps = tuple(sorted(endpoints, key=lambda e: e.address))
    family = IPFamily.IPv6 if ":" in cluster_ip else IPFamily.IPv4
    return ServicePortInfo(
        name=ServicePortName(namespace=namespace, name=name, port=port_name, protocol=protocol),
        family=family, cluster_ip=cluster_ip, port=port, protocol=protocol, target_port=port,
        session_affinity_timeout_s=affinity_s, endpoints=eps, cluster_endpoints=eps,
        all_reachable_endpoints=eps, has_any_endpoints=bool(eps),
    )


def snapshot(*ports: ServicePortInfo, revision: int = 1) -> Snapshot:
    """A Snapshot holding exactly ``ports``."""
    return Snapshot(
        revision=revision, node=NodeConfig(),
        ports=MappingProxyType({(p.family, p.name): p for p in ports}),
        changed=frozenset(p.name for p in ports),
    )


async def read_line(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> str:
    """One line (without the newline), failing after ``timeout_s`` seconds."""
    async with asyncio.timeout(timeout_s):
        return (await reader.readline()).decode().rstrip("\n")


async def identify(host: str, port: int, timeout_s: float = 5.0) -> str:
    """Connect to ``host:port``, read the greeting (the backend's identity) and close."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            return await read_line(reader, timeout_s)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


def split(listen: str) -> tuple[str, int]:
    """``ip:port`` or ``[ip]:port`` into ``(ip, port)``."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)
