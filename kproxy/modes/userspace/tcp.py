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
1. The listener accepts (:mod:`kproxy.modes.userspace._accept`: a back-off when descriptors run
   out). A client accepted just as the last endpoint left, or over a connection cap
   (:mod:`kproxy.modes.userspace.limits`), is reset at once (SO_LINGER 0, then close) so it never
   hangs. Otherwise a task takes the client and dials, so a slow dial never stalls other
   accepts (the legacy proxier dialled on the accept goroutine; see its TODO in ``ProxyLoop``).
2. The dial asks the balancer for an endpoint and connects a plain socket with the staged
   timeouts of ``TryConnectEndpoints`` (0.25, 0.5, 1, 2 s); each failure tries the next
   endpoint, ignoring ClientIP affinity after the first (``sessionAffinityReset``). A dial given
   up on is closed there and then: no transport or protocol exists until connect() has succeeded
   within its deadline (with ``create_connection`` under a timeout, uvloop delivered a late
   connection's bytes to the protocol after the TimeoutError, so one client received two
   backends). Neither side relays a byte before the two are linked: what arrives earlier is
   held and the side stops reading, so retries only ever happen before any byte is relayed.
   When every attempt fails, or there is no endpoint, the client is reset. Running out of
   descriptors or local ports resets the client too, is logged once
   (:class:`~kproxy.modes.userspace.limits.Episode`) and is never counted as the endpoint's
   dial failure.
3. Once connected the two sides are linked and both resume reading. Each side writes what
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
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import structlog

from kproxy.errors import NoEndpointsError
from kproxy.model.names import join_host_port
from kproxy.model.snapshot import Endpoint
from kproxy.modes.userspace._accept import AcceptLoop
from kproxy.modes.userspace._relay import (
    WRITE_HIGH_WATER_BYTES,
    WRITE_LOW_WATER_BYTES,
    ConnectionRegistry,
    Relay,
    Side,
    TcpConnectionInfo,
    reset_socket,
    reset_transport,
)
from kproxy.modes.userspace._tasks import TaskOwner
from kproxy.modes.userspace.addresses import LISTEN_BACKLOG, split_host_port
from kproxy.modes.userspace.balancer import RoundRobinBalancer
from kproxy.modes.userspace.limits import Budget, ConnectionLimits, out_of_resources

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


@dataclass(slots=True)
class TcpStats:
    """Counters of one TCP listener (mutable, cumulative since it opened).

    Attributes:
        accepted: connections accepted.
        relayed: connections that reached an endpoint.
        refused: connections reset because no endpoint was left or every dial failed.
        dial_failures: single dial attempts that failed (refused or timed out by the endpoint).
        over_limit: connections reset because a connection cap was reached.
        out_of_resources: connections reset because the process ran out of descriptors or
            local ports while dialling (never counted in ``dial_failures``).
        bytes_to_endpoint, bytes_to_client: payload bytes of finished connections, per direction.
    """

    accepted: int = 0
    relayed: int = 0
    refused: int = 0
    dial_failures: int = 0
    over_limit: int = 0
    out_of_resources: int = 0
    bytes_to_endpoint: int = 0
    bytes_to_client: int = 0


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


def _describe(exc: BaseException, timeout_s: float) -> str:
    """Why a dial failed, for the log: ``timed out after 0.25 s`` or the OS's reason."""
    if isinstance(exc, TimeoutError) and exc.errno is None:  # asyncio.timeout's, not ETIMEDOUT
        return f"timed out after {timeout_s:g} s"
    if isinstance(exc, OSError) and exc.errno:  # asyncio's strerror is "Connect call failed (...)"
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__


async def _connect(ip: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP socket connected to ``ip:port`` within ``timeout_s`` seconds; closed on any failure.

    Raises:
        OSError: socket() or connect() failed (EMFILE, ECONNREFUSED, ...).
        TimeoutError: connect() did not complete in time (the socket is closed, so the
            handshake can never complete later).
    """
    sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        async with asyncio.timeout(timeout_s):
            await asyncio.get_running_loop().sock_connect(sock, (ip, port))
    except BaseException:
        sock.close()
        raise
    return sock


class TcpListener:
    """Accepts TCP connections for one service port and relays each to an endpoint.

    The legacy ``ProxyLoop``/``TryConnectEndpoints``/``ProxyTCP`` of kube-proxy's userspace
    ``proxysocket.go``, with dials off the accept path and half-close plus backpressure kept.

    Args:
        name: the ServicePortName text, for logs and :class:`TcpConnectionInfo`.
        balancer: chooses endpoints; shared with nothing else.
        clock: float seconds (monotonic) for the balancer's affinity.
        dial_timeouts_s: one timeout per attempt, in seconds.
        registry: where open connections are tracked for draining (and counted for the total cap).
        tasks: the owner of the connection tasks.
        budget: the proxy's connection caps and logged episodes (default: sized from
            RLIMIT_NOFILE, see :class:`~kproxy.modes.userspace.limits.ConnectionLimits`).
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
        budget: Budget | None = None,
    ) -> None:
        self.name = name
        self.balancer = balancer
        self.stats = TcpStats()
        self._clock = clock
        self._dial_timeouts_s = tuple(dial_timeouts_s)
        self._registry = registry
        self._tasks = tasks
        self._budget = budget or Budget(ConnectionLimits.from_nofile(), _log)
        self._open = 0
        self._targets: dict[str, tuple[str, int]] = {}
        self._holder: socket.socket | None = None
        self._address: tuple[str, int] | None = None
        self._acceptor: AcceptLoop | None = None

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
        return self._acceptor is not None

    @property
    def open_connections(self) -> int:
        """Connections of this port open now (dialling or relayed), counted against its cap."""
        return self._open

    async def set_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """Replace the endpoint set, then listen if there are endpoints and stop if there are none.

        Open connections, also to endpoints that left, stay open. A failure to listen is logged
        and retried on the next call.
        """
        self._targets = {ep.address: (ep.ip, ep.port) for ep in endpoints}
        self.balancer.update(self._targets)
        self._sync_listening()

    async def start(self, sock: socket.socket) -> None:
        """Hold the port of ``sock`` (bound, not listening; the listener owns it now) and listen
        on it while the balancer has endpoints."""
        host, port = sock.getsockname()[:2]
        self._holder = sock
        self._address = (str(host), int(port))
        self._sync_listening()

    def close(self) -> None:
        """Stop accepting and release the port; connections already open are left untouched."""
        self._holder, holder = None, self._holder
        self._stop_listening()
        if holder is not None:
            holder.close()

    def _sync_listening(self) -> None:
        if self._holder is None or self._address is None:
            return  # not started, or closed
        if not self.balancer.endpoints:
            self._stop_listening()
            return
        if self._acceptor is not None:
            return
        try:
            sock = _listening_socket(self._holder.family, self._address)
            try:
                sock.listen(LISTEN_BACKLOG)
                self._acceptor = AcceptLoop(sock, self._on_accept, out_of_fds=self._budget.out_of_fds,
                                            name=self.name)
            except BaseException:
                sock.close()
                raise
        except OSError as exc:
            _log.error("cannot listen", service=self.name, listen=join_host_port(*self._address),
                       error=exc.strerror or str(exc), retry="at the next endpoint change or periodic sync")

    def _stop_listening(self) -> None:
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.close()  # the kernel resets connections still in the accept queue

    # -- data path -----------------------------------------------------------------------

    def _on_accept(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        self.stats.accepted += 1
        if not self.balancer.endpoints:
            self.stats.refused += 1
            reset_socket(conn)
            return
        limits = self._budget.limits
        if self._open >= limits.max_connections_per_service or len(self._registry) >= limits.max_connections:
            self.stats.over_limit += 1
            self._budget.tcp_full.hit(service=self.name, open_on_port=self._open,
                                      open_in_total=len(self._registry),
                                      max_connections_per_service=limits.max_connections_per_service,
                                      max_connections=limits.max_connections)
            reset_socket(conn)
            return
        self._budget.tcp_full.clear()
        relay = Relay(self)
        relay.client_addr = join_host_port(str(peer[0]), int(peer[1]))
        self._registry.add(relay)
        self._open += 1
        try:
            self._tasks.spawn(self._serve(relay, conn, str(peer[0])), name=f"tcp {self.name}")
        except RuntimeError:  # shutting down
            self._forget(relay)
            reset_socket(conn)

    def _forget(self, relay: Relay) -> None:
        if self._registry.discard(relay):
            self._open -= 1

    async def _serve(self, relay: Relay, conn: socket.socket, client_ip: str) -> None:
        """Wrap the accepted ``conn`` in a transport, then dial and link (or reset the client)."""
        try:
            try:
                await asyncio.get_running_loop().connect_accepted_socket(lambda: relay.client, sock=conn)
            except OSError:
                conn.close()
                self._forget(relay)
                return
            if not await self._dial(relay, client_ip):
                self.stats.refused += 1
                client = relay.client
                if not client.closed and client.transport is not None:
                    reset_transport(client.transport)
                self._forget(relay)
        except BaseException:
            relay.abort()
            self._forget(relay)
            raise

    async def _dial(self, relay: Relay, client_ip: str) -> bool:
        """Try endpoints until one connects, then link it; False when the client must be reset."""
        client = relay.client
        attempts = len(self._dial_timeouts_s)
        for attempt, timeout_s in enumerate(self._dial_timeouts_s):
            if client.closed:
                return True  # nothing left to reset; relay_done has accounted for it
            try:
                endpoint = self.balancer.next_endpoint(client_ip, self._clock(), attempt > 0)
            except NoEndpointsError:
                return False
            ip, port = self._targets.get(endpoint) or split_host_port(endpoint)
            try:
                sock = await _connect(ip, port, timeout_s)
            except (OSError, TimeoutError) as exc:
                if out_of_resources(exc, dial=True):
                    self.stats.out_of_resources += 1
                    if self._acceptor is not None and isinstance(exc, OSError):
                        self._acceptor.back_off(exc, failed="dial (this client is reset)")
                    else:
                        self._budget.out_of_fds.hit(failed="dial", service=self.name,
                                                    error=_describe(exc, timeout_s),
                                                    retry="none: the client is reset; new clients dial again")
                    return False
                self.stats.dial_failures += 1
                last = attempt + 1 == attempts
                _log.warning("dial failed", service=self.name, endpoint=endpoint,
                             attempt=f"{attempt + 1}/{attempts}", error=_describe(exc, timeout_s),
                             retry="none left: the client is reset" if last else "now, on the next endpoint")
                continue
            self._budget.out_of_fds.clear()
            if await self._attach(relay, sock, endpoint):
                return True
        return False

    async def _attach(self, relay: Relay, sock: socket.socket, endpoint: str) -> bool:
        """Wrap the connected ``sock`` in a transport and link it; False when that failed."""
        upstream = Side(relay)
        try:
            await asyncio.get_running_loop().create_connection(lambda: upstream, sock=sock)
        except OSError as exc:
            sock.close()
            self.stats.dial_failures += 1
            _log.warning("dial failed", service=self.name, endpoint=endpoint, error=_describe(exc, 0.0),
                         retry="now, on the next endpoint")
            return False
        except BaseException:
            upstream.abandoned = True
            if upstream.transport is not None:
                reset_transport(upstream.transport)
            sock.close()
            raise
        self._link(relay, upstream, endpoint)
        return True

    def _link(self, relay: Relay, upstream: Side, endpoint: str) -> None:
        client = relay.client
        assert upstream.transport is not None and client.transport is not None
        if client.closed:
            upstream.transport.close()
            self._forget(relay)
            return
        relay.upstream = upstream
        relay.endpoint = endpoint
        client.peer = upstream
        upstream.peer = client
        self.balancer.acquire(endpoint)
        self.stats.relayed += 1
        for side in (client, upstream):
            assert side.peer is not None and side.peer.transport is not None
            for data in side.early:
                side.peer.transport.write(data)
            side.early.clear()
        if upstream.closed:  # the endpoint spoke and left before the link: pass on what it said
            client.transport.close()
            return
        if client.read_eof and upstream.read_eof:
            upstream.transport.close()
            client.transport.close()
            return
        for side in (client, upstream):
            assert side.transport is not None and side.peer is not None and side.peer.transport is not None
            if side.read_eof:
                side.peer.transport.write_eof()
            else:
                side.transport.resume_reading()

    def relay_done(self, relay: Relay) -> None:
        """Account for a relay whose sockets are both closed."""
        if relay.endpoint is not None:
            self.balancer.release(relay.endpoint)
            self.stats.bytes_to_endpoint += relay.client.bytes_in
            if relay.upstream is not None:
                self.stats.bytes_to_client += relay.upstream.bytes_in
            relay.endpoint = None
        self._forget(relay)
