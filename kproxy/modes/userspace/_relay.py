"""The two linked Protocols of one relayed TCP connection, and the registry shutdown drains.

See :mod:`kproxy.modes.userspace.tcp` for the theory of operation; this module holds its data
path: a :class:`Side` per socket that writes what it reads into its peer's transport once the two
are linked (and holds it until then), linked flow control, half-close, and resets.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass
from typing import Protocol, cast

__all__ = [
    "WRITE_HIGH_WATER_BYTES",
    "WRITE_LOW_WATER_BYTES",
    "ConnectionRegistry",
    "Relay",
    "Side",
    "TcpConnectionInfo",
    "reset_socket",
    "reset_transport",
]

#: Per direction, a transport holding more than this pauses reading on the other side. asyncio's
#: default is 64 KiB; 256 KiB matches one read of asyncio's and uvloop's socket transports and
#: keeps bulk transfers streaming. The bound per direction is this plus one 256 KiB read.
WRITE_HIGH_WATER_BYTES = 256 * 1024
#: Reading resumes once the backlog drains below this (asyncio's default low mark is high/4).
WRITE_LOW_WATER_BYTES = 64 * 1024
_LINGER_RESET = struct.pack("ii", 1, 0)


class RelayOwner(Protocol):
    """What a relay reports to: its listener."""

    name: str

    def relay_done(self, relay: Relay) -> None:
        """Account for a relay whose sockets are both closed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpConnectionInfo:
    """One open relayed connection, as seen at the moment of the call.

    Attributes:
        service: the ServicePortName text (``ns/name:port``).
        client: the client's ``ip:port``.
        endpoint: the endpoint's ``ip:port``, or None while dialling.
        bytes_to_endpoint, bytes_to_client: payload bytes relayed so far, per direction.
        buffered_to_endpoint, buffered_to_client: bytes queued in the proxy's write buffers.
    """

    service: str
    client: str
    endpoint: str | None
    bytes_to_endpoint: int
    bytes_to_client: int
    buffered_to_endpoint: int
    buffered_to_client: int


def _set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # the peer may already be gone; nothing to tune then
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def reset_socket(sock: socket.socket) -> None:
    """Close an accepted ``sock`` with a reset (RST)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    sock.close()


def reset_transport(transport: asyncio.BaseTransport) -> None:
    """Close ``transport`` so the peer sees a reset (RST), not a hang or an orderly EOF."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    transport.abort()  # type: ignore[attr-defined]


class Side(asyncio.Protocol):
    """One socket of a relay; once linked, writes what it reads into its peer's transport."""

    __slots__ = ("abandoned", "bytes_in", "closed", "early", "peer", "read_eof", "relay", "transport")

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.peer: Side | None = None
        self.read_eof = False
        self.closed = False
        self.abandoned = False  # its dial was given up on: a late transport is reset, never used
        self.bytes_in = 0
        self.early: list[bytes] = []  # read before the sides were linked; held, never relayed early

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        if self.abandoned:
            reset_transport(t)
            return
        t.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES, low=WRITE_LOW_WATER_BYTES)
        _set_nodelay(transport)

    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.write(data)
        elif self.transport is not None:
            self.early.append(data)
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.read_eof = True
        peer = self.peer
        if peer is None or peer.transport is None:
            return True  # not linked yet: _link forwards the EOF
        if peer.read_eof:
            # Both directions are finished: close both (close() flushes what is queued).
            peer.transport.close()
            return False
        if peer.transport.can_write_eof():
            peer.transport.write_eof()
        return True  # keep the reverse direction open

    def pause_writing(self) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None:
            peer.transport.pause_reading()

    def resume_writing(self) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not peer.read_eof:
            peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        peer = self.peer
        relay = self.relay
        if (peer is not None and peer.transport is not None and not peer.closed
                and (relay.upstream is self or relay.client is self)):
            if exc is None:
                peer.transport.close()
            else:
                reset_transport(peer.transport)
        self.relay.side_lost()


class Relay:
    """A client connection and, once dialled and linked, its endpoint connection."""

    __slots__ = ("client", "client_addr", "endpoint", "listener", "upstream")

    def __init__(self, listener: RelayOwner) -> None:
        self.listener = listener
        self.client: Side = Side(self)
        self.upstream: Side | None = None
        self.endpoint: str | None = None
        self.client_addr = ""

    def side_lost(self) -> None:
        if self.client.closed and (self.upstream is None or self.upstream.closed):
            self.listener.relay_done(self)

    def info(self) -> TcpConnectionInfo:
        up = self.upstream
        return TcpConnectionInfo(
            service=self.listener.name, client=self.client_addr, endpoint=self.endpoint,
            bytes_to_endpoint=self.client.bytes_in,
            bytes_to_client=up.bytes_in if up is not None else 0,
            buffered_to_endpoint=(up.transport.get_write_buffer_size()
                                  if up is not None and up.transport is not None else 0),
            buffered_to_client=(self.client.transport.get_write_buffer_size()
                                if self.client.transport is not None else 0),
        )

    def abort(self) -> None:
        """Reset both sockets (the peers see a RST)."""
        for side in (self.client, self.upstream):
            if side is not None and side.transport is not None and not side.closed:
                reset_transport(side.transport)


class ConnectionRegistry:
    """Every open TCP relay of one proxy, across listeners, so that shutdown can drain them."""

    __slots__ = ("_empty", "_relays")

    def __init__(self) -> None:
        self._relays: set[Relay] = set()
        self._empty = asyncio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._relays)

    def add(self, relay: Relay) -> None:
        """Track an accepted connection."""
        self._relays.add(relay)
        self._empty.clear()

    def discard(self, relay: Relay) -> bool:
        """Forget a finished connection; True when it was tracked (so each is forgotten once)."""
        if relay not in self._relays:
            return False
        self._relays.discard(relay)
        if not self._relays:
            self._empty.set()
        return True

    def infos(self) -> list[TcpConnectionInfo]:
        """A :class:`TcpConnectionInfo` per open connection."""
        return [r.info() for r in self._relays]

    async def wait_empty(self) -> None:
        """Return once no connection is open."""
        await self._empty.wait()

    def abort_all(self) -> None:
        """Reset every open connection (both sockets; the peers see a RST)."""
        for relay in list(self._relays):
            relay.abort()


