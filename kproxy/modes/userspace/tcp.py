"""The TCP relay: one listener per service port, two linked asyncio Protocols per connection.

Theory of operation (kube-proxy's userspace ``proxysocket.go``, with its known faults fixed):

0. The listener owns two sockets on its ``ip:port``: a *holder*, bound (SO_REUSEADDR) and never
   listening, that keeps the port reserved for the Service for the listener's whole life; and,
   only while the balancer has endpoints, a *listening* socket bound to the same ``ip:port``
   (Linux lets a SO_REUSEADDR socket bind and listen beside a bound, non-listening one). With no
   endpoints nothing listens, so a SYN gets a RST and the client's connect() fails with
   ECONNREFUSED at once, as kube-proxy's REJECT rule for a Service without endpoints does. The
   listening socket is opened and closed as endpoints come and go; connections already accepted
   are not affected, and a failure to listen is logged and retried on the next endpoint update.
1. The listener accepts. A client accepted just as the last endpoint left is reset at once
   (SO_LINGER 0, then close) so it never hangs. Otherwise the client transport stops reading and
   a dial task starts, so a slow dial never stalls other accepts (the legacy proxier dialled on
   the accept goroutine; see its TODO in ``ProxyLoop``).
2. The dial asks the balancer for an endpoint and connects with the staged timeouts of
   ``TryConnectEndpoints`` (0.25, 0.5, 1, 2 s); each failure tries the next endpoint, ignoring
   ClientIP affinity after the first (``sessionAffinityReset``). When every attempt fails, or
   there is no endpoint, the client is reset.
3. Once connected the two sides are linked and the client resumes reading. Each side writes what
   it reads into the other's transport. Flow control is linked: when a side's transport calls
   ``pause_writing`` the *other* side stops reading until ``resume_writing``, so a slow reader
   bounds what the proxy holds per direction to the write high-water mark plus one read.
4. Half-close is propagated: EOF from one peer becomes ``write_eof`` to the other and the
   reverse direction stays open (``eof_received`` returns True). When both directions have seen
   EOF, or either side is lost, both transports close. A side lost with an error (a reset, a
   timeout) resets the other (SO_LINGER 0, then abort), so the peer sees a RST and not an orderly
   FIN that would pass for a complete response; so do the aborts at the end of the drain timeout.
   kube-proxy closed fully on the first EOF (PR #18524) because its half-open sockets leaked;
   here a relay always ends when either socket ends, and :meth:`UserspaceProxy.aclose` aborts
   what outlives the drain timeout.

An endpoint removed from the balancer keeps its open connections; a closed listener keeps its
open connections too (``Close()`` in proxysocket.go: "existing connections are left untouched").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import structlog

from kproxy.errors import NoEndpointsError
from kproxy.model.names import join_host_port
from kproxy.model.snapshot import Endpoint
from kproxy.modes.userspace._tasks import TaskOwner
from kproxy.modes.userspace.addresses import LISTEN_BACKLOG, split_host_port
from kproxy.modes.userspace.balancer import RoundRobinBalancer

__all__ = [
    "DEFAULT_DIAL_TIMEOUTS_S",
    "WRITE_HIGH_WATER_BYTES",
    "WRITE_LOW_WATER_BYTES",
    "ConnectionRegistry",
    "TcpConnectionInfo",
    "TcpListener",
    "TcpStats",
]

_log = structlog.get_logger("kproxy.modes.userspace")

#: kube-proxy's ``EndpointDialTimeouts``: at most 4 attempts, 3.75 s in all.
DEFAULT_DIAL_TIMEOUTS_S: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
#: Per direction, a transport holding more than this pauses reading on the other side. asyncio's
#: default is 64 KiB; 256 KiB matches one read of asyncio's and uvloop's socket transports and
#: keeps bulk transfers streaming. The bound per direction is this plus one 256 KiB read.
WRITE_HIGH_WATER_BYTES = 256 * 1024
#: Reading resumes once the backlog drains below this (asyncio's default low mark is high/4).
WRITE_LOW_WATER_BYTES = 64 * 1024
_LINGER_RESET = struct.pack("ii", 1, 0)


@dataclass(slots=True)
class TcpStats:
    """Counters of one TCP listener (mutable, cumulative since it opened).

    Attributes:
        accepted: connections accepted.
        relayed: connections that reached an endpoint.
        refused: connections reset because no endpoint was left or every dial failed.
        dial_failures: single dial attempts that failed (refused or timed out).
        bytes_to_endpoint, bytes_to_client: payload bytes of finished connections, per direction.
    """

    accepted: int = 0
    relayed: int = 0
    refused: int = 0
    dial_failures: int = 0
    bytes_to_endpoint: int = 0
    bytes_to_client: int = 0


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


def _listening_socket(family: int, address: tuple[str, int]) -> socket.socket:
    """A TCP socket bound (SO_REUSEADDR) to ``address`` beside the listener's holder socket."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def _set_nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):  # the peer may already be gone; nothing to tune then
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _reset(transport: asyncio.BaseTransport) -> None:
    """Close ``transport`` so the peer sees a reset (RST), not a hang or an orderly EOF."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    transport.abort()  # type: ignore[attr-defined]


class _Side(asyncio.Protocol):
    """One socket of a relay; writes what it reads into its peer's transport."""

    __slots__ = ("bytes_in", "closed", "early", "peer", "read_eof", "relay", "transport")

    def __init__(self, relay: _Relay) -> None:
        self.relay = relay
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.read_eof = False
        self.closed = False
        self.bytes_in = 0
        self.early: list[bytes] = []  # read before the peer was linked (uvloop reads at once)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
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
                _reset(peer.transport)
        self.relay.side_lost()


class _Relay:
    """A client connection and, once dialled, its endpoint connection."""

    __slots__ = ("client", "client_addr", "endpoint", "listener", "upstream")

    def __init__(self, listener: TcpListener) -> None:
        self.listener = listener
        self.client: _Side = _ClientSide(self)
        self.upstream: _Side | None = None
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
                _reset(side.transport)


class ConnectionRegistry:
    """Every open TCP relay of one proxy, across listeners, so that shutdown can drain them."""

    __slots__ = ("_empty", "_relays")

    def __init__(self) -> None:
        self._relays: set[_Relay] = set()
        self._empty = asyncio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._relays)

    def add(self, relay: _Relay) -> None:
        """Track an accepted connection."""
        self._relays.add(relay)
        self._empty.clear()

    def discard(self, relay: _Relay) -> None:
        """Forget a finished connection."""
        self._relays.discard(relay)
        if not self._relays:
            self._empty.set()

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


class TcpListener:
    """Accepts TCP connections for one service port and relays each to an endpoint.

    The legacy ``ProxyLoop``/``TryConnectEndpoints``/``ProxyTCP`` of kube-proxy's userspace
    ``proxysocket.go``, with dials off the accept path and half-close plus backpressure kept.

    Args:
        name: the ServicePortName text, for logs and :class:`TcpConnectionInfo`.
        balancer: chooses endpoints; shared with nothing else.
        clock: float seconds (monotonic) for the balancer's affinity.
        dial_timeouts_s: one timeout per attempt, in seconds.
        registry: where open connections are tracked for draining.
        tasks: the owner of the dial tasks.
    """

    def __init__(
        self,
        *,
        name: str,
        balancer: RoundRobinBalancer,
        clock: Callable[[], float],
        dial_timeouts_s: Sequence[float] = DEFAULT_DIAL_TIMEOUTS_S,
        registry: ConnectionRegistry,
        tasks: TaskOwner,
    ) -> None:
        self.name = name
        self.balancer = balancer
        self.stats = TcpStats()
        self._clock = clock
        self._dial_timeouts_s = tuple(dial_timeouts_s)
        self._registry = registry
        self._tasks = tasks
        self._targets: dict[str, tuple[str, int]] = {}
        self._holder: socket.socket | None = None
        self._address: tuple[str, int] | None = None
        self._server: asyncio.AbstractServer | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The ``(ip, port)`` this listener holds.

        Raises:
            RuntimeError: :meth:`start` has not been called.
        """
        if self._address is None:
            raise RuntimeError(f"TcpListener {self.name}: address before start()")
        return self._address

    @property
    def listening(self) -> bool:
        """True while a listening socket accepts (the balancer has endpoints and listen worked)."""
        return self._server is not None

    async def set_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """Replace the endpoint set, then listen if there are endpoints and stop if there are none.

        Open connections, also to endpoints that left, stay open. A failure to listen is logged
        and retried on the next call.
        """
        self._targets = {ep.address: (ep.ip, ep.port) for ep in endpoints}
        self.balancer.update(self._targets)
        await self._sync_listening()

    async def start(self, sock: socket.socket) -> None:
        """Hold the port of ``sock`` (bound, not listening; the listener owns it now) and listen
        on it while the balancer has endpoints."""
        host, port = sock.getsockname()[:2]
        self._holder = sock
        self._address = (str(host), int(port))
        await self._sync_listening()

    def close(self) -> None:
        """Stop accepting and release the port; connections already open are left untouched."""
        self._holder, holder = None, self._holder
        self._stop_listening()
        if holder is not None:
            holder.close()

    async def _sync_listening(self) -> None:
        if self._holder is None or self._address is None:
            return  # not started, or closed
        if not self.balancer.endpoints:
            self._stop_listening()
            return
        try:
            if self._server is None:
                sock = _listening_socket(self._holder.family, self._address)
                loop = asyncio.get_running_loop()
                try:
                    # start_serving=False: no await between creating the server and recording it.
                    self._server = await loop.create_server(self._accept, sock=sock, backlog=LISTEN_BACKLOG,
                                                            start_serving=False)
                except BaseException:
                    sock.close()
                    raise
            if not self._server.is_serving():  # also after a cancelled earlier call
                await self._server.start_serving()
        except OSError as exc:
            self._stop_listening()
            _log.error("cannot listen", service=self.name, listen=join_host_port(*self._address),
                       error=str(exc) or type(exc).__name__)

    def _stop_listening(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()  # the kernel resets connections still in the accept queue

    # -- data path -----------------------------------------------------------------------

    def _accept(self) -> _Side:
        return _Relay(self).client

    def accepted(self, relay: _Relay, transport: asyncio.Transport) -> None:
        self.stats.accepted += 1
        peer: Any = transport.get_extra_info("peername")
        client_ip = str(peer[0]) if peer else ""
        relay.client_addr = join_host_port(client_ip, int(peer[1])) if peer else ""
        if not self.balancer.endpoints:
            self.stats.refused += 1
            _reset(transport)
            return
        self._registry.add(relay)
        transport.pause_reading()
        try:
            self._tasks.spawn(self._dial(relay, client_ip), name=f"dial {self.name}")
        except RuntimeError:  # shutting down
            self._registry.discard(relay)
            _reset(transport)

    async def _dial(self, relay: _Relay, client_ip: str) -> None:
        loop = asyncio.get_running_loop()
        client = relay.client
        try:
            for attempt, timeout_s in enumerate(self._dial_timeouts_s):
                if client.closed:
                    return
                try:
                    endpoint = self.balancer.next_endpoint(client_ip, self._clock(), attempt > 0)
                except NoEndpointsError:
                    break
                ip, port = self._targets.get(endpoint) or split_host_port(endpoint)
                upstream = _Side(relay)
                # The endpoint may speak first, before this task resumes from the dial: its
                # bytes go straight to the client transport (which is only paused for reading).
                upstream.peer = client
                try:
                    async with asyncio.timeout(timeout_s):
                        await loop.create_connection(lambda: upstream, ip, port)  # noqa: B023
                except (OSError, TimeoutError) as exc:
                    self.stats.dial_failures += 1
                    _log.warning("dial failed", service=self.name, endpoint=endpoint, attempt=attempt + 1,
                                 timeout_s=timeout_s, error=str(exc) or type(exc).__name__)
                    continue
                self._link(relay, upstream, endpoint)
                return
            self.stats.refused += 1
            if not client.closed and client.transport is not None:
                _reset(client.transport)
            self._registry.discard(relay)
        except BaseException:
            relay.abort()
            self._registry.discard(relay)
            raise

    def _link(self, relay: _Relay, upstream: _Side, endpoint: str) -> None:
        client = relay.client
        assert upstream.transport is not None and client.transport is not None
        if client.closed:
            upstream.transport.close()
            self._registry.discard(relay)
            return
        relay.upstream = upstream
        relay.endpoint = endpoint
        client.peer = upstream
        self.balancer.acquire(endpoint)
        self.stats.relayed += 1
        for data in client.early:
            upstream.transport.write(data)
        client.early.clear()
        if client.read_eof:
            if upstream.read_eof:
                upstream.transport.close()
                client.transport.close()
            else:
                upstream.transport.write_eof()
        else:
            client.transport.resume_reading()

    def relay_done(self, relay: _Relay) -> None:
        """Account for a relay whose sockets are both closed."""
        if relay.endpoint is not None:
            self.balancer.release(relay.endpoint)
            self.stats.bytes_to_endpoint += relay.client.bytes_in
            if relay.upstream is not None:
                self.stats.bytes_to_client += relay.upstream.bytes_in
            relay.endpoint = None
        self._registry.discard(relay)


class _ClientSide(_Side):
    """The accepted side of a relay: tells the listener it arrived."""

    __slots__ = ()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.relay.listener.accepted(self.relay, cast(asyncio.Transport, transport))
