"""The UDP relay: one service socket per service port, one connected socket per client flow.

Theory of operation (kube-proxy's userspace ``proxysocket.go`` ``udpProxySocket``, with the faults
its issues list fixed):

* The service socket is a ``DatagramProtocol``. A datagram from a client address with no session
  asks the balancer for an endpoint (ClientIP affinity applies) and opens a session: a UDP socket
  *connected* to that endpoint (the legacy ``ClientCache``).
* While the Service has no endpoints the service socket is closed, so the kernel answers a
  datagram with ICMP port unreachable (ECONNREFUSED on a connected client socket), as kube-proxy's
  REJECT rule does. When endpoints return the socket is bound again on the same ``ip:port``; if that
  port was taken meanwhile it falls back to a free port on the same address, logs it, and
  :attr:`UdpListener.address` (so the proxy's address table) shows the port in use. The port is
  not reserved while closed: a bound socket would receive the datagrams and no ICMP error would go
  out.
* Datagrams that arrive while the session socket is being set up wait in a short queue
  (:data:`SESSION_PENDING_MAX` datagrams, then dropped, as a full socket buffer would).
* Replies from the endpoint go back to the client *from the service socket*, so the client sees
  them come from the address it sent to.
* A session ends after ``idle_timeout_s`` without traffic either way. The timer runs on
  ``loop.call_later`` and is re-armed lazily (one timer per session, not one per datagram).
  kube-proxy's default was 250 ms (``--udp-timeout``), too short for DNS retries; the default
  here, 30 s, is conntrack's UDP timeout.
* Datagrams are read whole up to 64 KiB: asyncio's and uvloop's datagram transports read into
  buffers of at least 64 KiB, where the legacy proxy truncated at 4 KiB.
* An endpoint removed from the balancer gets no new sessions and its sessions are closed at once,
  as kube-proxy clears the conntrack entries of removed UDP endpoints
  (``pkg/proxy/conntrack/cleanup.go``): the client's next datagram opens a session on an endpoint
  that remains. Closing the listener ends every session (the legacy proxy broke them too).
* Sessions are capped per service port and in the whole proxy
  (:class:`~kproxy.modes.userspace.limits.ConnectionLimits`). A new flow over a cap closes the
  least recently active session first (this port's own when the port is full, else the proxy's
  oldest), so a flood from many client addresses holds a bounded number of descriptors and the
  flows still talking keep their sessions. Each listener keeps its sessions in activity order and
  the shared :class:`~kproxy.modes.userspace.limits.Budget` keeps all of them, so finding the
  oldest is O(1). A session that cannot open for lack of descriptors drops its datagrams and is
  logged once for the whole proxy, never as the endpoint's failure.
"""

from __future__ import annotations

import asyncio
import socket
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import structlog

from kproxy.errors import InvalidArgument, NoEndpointsError
from kproxy.model.names import Protocol, join_host_port
from kproxy.model.snapshot import Endpoint
from kproxy.modes.userspace._tasks import TaskOwner
from kproxy.modes.userspace.addresses import ListenPlan, bind_socket, split_host_port
from kproxy.modes.userspace.balancer import RoundRobinBalancer
from kproxy.modes.userspace.limits import Budget, ConnectionLimits, out_of_resources

__all__ = ["DEFAULT_UDP_IDLE_TIMEOUT_S", "SESSION_PENDING_MAX", "UdpListener", "UdpStats"]

_log = structlog.get_logger("kproxy.modes.userspace")

#: conntrack's ``nf_conntrack_udp_timeout``; kube-proxy's 250 ms broke DNS retries (kubernetes#15680).
DEFAULT_UDP_IDLE_TIMEOUT_S = 30.0
#: Datagrams held per session while its socket opens (a few RTTs of a chatty client).
SESSION_PENDING_MAX = 64

_Address = tuple[Any, ...]


@dataclass(slots=True)
class UdpStats:
    """Counters of one UDP listener (mutable, cumulative).

    Attributes:
        sessions_opened: client flows that got a session.
        evicted: sessions of this port closed early to make room under a session cap.
        peak_sessions: the most sessions this port had open at once.
        dropped: datagrams dropped (no endpoint, queue full, session failed to open).
        datagrams_to_endpoint, datagrams_to_client: datagrams relayed per direction.
        bytes_to_endpoint, bytes_to_client: payload bytes relayed per direction.
    """

    sessions_opened: int = 0
    evicted: int = 0
    peak_sessions: int = 0
    dropped: int = 0
    datagrams_to_endpoint: int = 0
    datagrams_to_client: int = 0
    bytes_to_endpoint: int = 0
    bytes_to_client: int = 0


class _ServiceSide(asyncio.DatagramProtocol):
    __slots__ = ("closed", "listener")

    def __init__(self, listener: UdpListener) -> None:
        self.listener = listener
        self.closed: asyncio.Future[None] = listener.loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        # asyncio closes the socket one loop iteration after transport.close(); a re-bind of the
        # same port waits for this.
        if not self.closed.done():
            self.closed.set_result(None)

    def datagram_received(self, data: bytes, addr: _Address) -> None:
        self.listener.from_client(data, addr)

    def error_received(self, exc: Exception) -> None:
        # ICMP errors for replies we sent to clients that went away: nothing to do.
        pass


class _Session(asyncio.DatagramProtocol):
    """One client flow: a socket connected to one endpoint."""

    __slots__ = ("client", "closed", "endpoint", "last_s", "listener", "pending", "timer", "transport")

    def __init__(self, listener: UdpListener, client: _Address, endpoint: str) -> None:
        self.listener = listener
        self.client = client
        self.endpoint = endpoint
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: list[bytes] | None = []
        self.timer: asyncio.TimerHandle | None = None
        self.last_s = 0.0
        self.closed = False

    def send(self, data: bytes, now_s: float) -> None:
        self.last_s = now_s
        self.listener.touch(self)
        stats = self.listener.stats
        if self.transport is not None:
            self.transport.sendto(data)
        elif self.pending is not None and len(self.pending) < SESSION_PENDING_MAX:
            self.pending.append(data)
        else:
            stats.dropped += 1
            return
        stats.datagrams_to_endpoint += 1
        stats.bytes_to_endpoint += len(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        out = self.transport = cast(asyncio.DatagramTransport, transport)  # uvloop's are not subclasses
        for data in self.pending or ():
            out.sendto(data)
        self.pending = None

    def datagram_received(self, data: bytes, addr: _Address) -> None:
        listener = self.listener
        self.last_s = listener.loop_time()
        if not self.closed:
            listener.touch(self)
        out = listener.transport
        if out is not None:
            out.sendto(data, self.client)
            listener.stats.datagrams_to_client += 1
            listener.stats.bytes_to_client += len(data)

    def error_received(self, exc: Exception) -> None:
        # ECONNREFUSED after an ICMP port unreachable from the endpoint: the client will retry;
        # the session stays, as a connected Go UDP socket did.
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def arm(self, loop: asyncio.AbstractEventLoop, delay_s: float) -> None:
        self.timer = loop.call_later(delay_s, self._check_idle)

    def _check_idle(self) -> None:
        listener = self.listener
        idle_s = listener.loop_time() - self.last_s
        if idle_s >= listener.idle_timeout_s:
            self.close()
        else:
            self.arm(listener.loop(), listener.idle_timeout_s - idle_s)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()
        self.listener.session_closed(self)


class UdpListener:
    """Relays UDP datagrams for one service port with per-client sessions.

    kube-proxy's userspace ``udpProxySocket`` (``ProxyLoop``, ``ClientCache``, ``proxyClient``).

    Args:
        name: the ServicePortName text, for logs.
        balancer: chooses the endpoint of each new session.
        clock: float seconds (monotonic) for the balancer's affinity.
        idle_timeout_s: a session with no datagram either way for this long is closed.
        tasks: the owner of the session set-up tasks.
        budget: the proxy's session caps and logged episodes (default: sized from
            RLIMIT_NOFILE, see :class:`~kproxy.modes.userspace.limits.ConnectionLimits`).

    Raises:
        InvalidArgument: ``idle_timeout_s`` is not positive.
    """

    def __init__(
        self,
        *,
        name: str,
        balancer: RoundRobinBalancer,
        clock: Callable[[], float],
        idle_timeout_s: float = DEFAULT_UDP_IDLE_TIMEOUT_S,
        tasks: TaskOwner,
        budget: Budget | None = None,
    ) -> None:
        if not idle_timeout_s > 0:
            raise InvalidArgument(f"idle_timeout_s must be > 0 seconds, got {idle_timeout_s=}")
        self.name = name
        self.balancer = balancer
        self.idle_timeout_s = float(idle_timeout_s)
        self.stats = UdpStats()
        self.transport: asyncio.DatagramTransport | None = None
        self._clock = clock
        self._tasks = tasks
        self._targets: dict[str, tuple[str, int]] = {}
        self._budget = budget or Budget(ConnectionLimits.from_nofile(), _log)
        self._sessions: OrderedDict[_Address, _Session] = OrderedDict()  # least recently active first
        self._loop: asyncio.AbstractEventLoop | None = None
        self._address: tuple[str, int] | None = None
        self._service_side: _ServiceSide | None = None
        self._closed = False

    @property
    def sessions(self) -> int:
        """Open sessions (client flows)."""
        return len(self._sessions)

    @property
    def address(self) -> tuple[str, int]:
        """The ``(ip, port)`` the service socket is bound to while there are endpoints, and will be
        bound to again when they return.

        Raises:
            RuntimeError: :meth:`start` has not been called.
        """
        if self._address is None:
            raise RuntimeError(f"UdpListener {self.name}: address before start()")
        return self._address

    @property
    def serving(self) -> bool:
        """True while the service socket is open (the balancer has endpoints and binding worked)."""
        return self.transport is not None

    def touch(self, session: _Session) -> None:
        """Mark an open ``session`` as the most recently active (for eviction order)."""
        if self._sessions.get(session.client) is session:
            self._sessions.move_to_end(session.client)
            self._budget.touch(session)

    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    def loop_time(self) -> float:
        return self.loop().time()

    async def set_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """Replace the endpoint set: close the sessions whose endpoint left, then open the service
        socket if there are endpoints (see :attr:`address`) or close it if there are none.

        A failure to bind is logged and retried on the next call.
        """
        self._targets = {ep.address: (ep.ip, ep.port) for ep in endpoints}
        self.balancer.update(self._targets)
        for session in [s for s in self._sessions.values() if s.endpoint not in self._targets]:
            session.close()
        await self._sync_serving()

    async def start(self, sock: socket.socket) -> None:
        """Serve on the bound UDP ``sock`` while the balancer has endpoints (the listener owns it
        now; with no endpoints it is closed at once and its ``ip:port`` kept for later)."""
        self._loop = asyncio.get_running_loop()
        host, port = sock.getsockname()[:2]
        self._address = (str(host), int(port))
        if not self.balancer.endpoints:
            sock.close()
            return
        await self._serve(sock)

    def close(self) -> None:
        """Close the service socket and every session, for good."""
        self._closed = True
        self._stop_serving()

    async def _sync_serving(self) -> None:
        if self._closed or self._address is None:
            return  # closed, or not started
        if not self.balancer.endpoints:
            self._stop_serving()
            await self._wait_socket_closed()
            return
        if self.transport is not None:
            return
        await self._wait_socket_closed()
        ip, port = self._address
        try:
            sock = bind_socket(ListenPlan(ip=ip, port=port, fallback=True), Protocol.UDP)
        except OSError as exc:
            _log.error("cannot bind service socket", service=self.name, listen=join_host_port(ip, port),
                       error=str(exc) or type(exc).__name__)
            return
        got = int(sock.getsockname()[1])
        if got != port:
            _log.warning("service port fell back to a free port", service=self.name, protocol="UDP",
                         wanted_port=port, port=got, reason="port taken while the Service had no endpoints")
            self._address = (ip, got)
        await self._serve(sock)

    async def _serve(self, sock: socket.socket) -> None:
        side = _ServiceSide(self)
        try:
            transport, _ = await self.loop().create_datagram_endpoint(lambda: side, sock=sock)
        except BaseException:
            sock.close()
            raise
        self._service_side = side
        self.transport = transport

    def _stop_serving(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        for session in list(self._sessions.values()):
            session.close()

    async def _wait_socket_closed(self) -> None:
        side = self._service_side
        if side is not None and self.transport is None:
            await side.closed
            self._service_side = None

    def from_client(self, data: bytes, addr: _Address) -> None:
        """Relay one datagram from ``addr`` (opening its session if needed)."""
        session = self._sessions.get(addr)
        now_s = self.loop_time()
        if session is None:
            if self.transport is None:
                return
            try:
                endpoint = self.balancer.next_endpoint(str(addr[0]), self._clock())
            except NoEndpointsError:
                self.stats.dropped += 1
                return
            self._make_room()
            session = _Session(self, addr, endpoint)
            try:
                self._tasks.spawn(self._open(session), name=f"udp session {self.name}")
            except RuntimeError:  # shutting down
                self.stats.dropped += 1
                return
            self._sessions[addr] = session
            self._budget.udp_sessions[session] = None
            self.stats.peak_sessions = max(self.stats.peak_sessions, len(self._sessions))
            self.balancer.acquire(endpoint)
            self.stats.sessions_opened += 1
            session.arm(self.loop(), self.idle_timeout_s)
        session.send(data, now_s)

    def _make_room(self) -> None:
        """Close the least recently active session when a new one would exceed a cap."""
        budget = self._budget
        limits = budget.limits
        victim: _Session | None = None
        if len(self._sessions) >= limits.max_udp_sessions_per_service:
            victim = next(iter(self._sessions.values()))
        elif len(budget.udp_sessions) >= limits.max_udp_sessions:
            oldest = next(iter(budget.udp_sessions))
            assert isinstance(oldest, _Session)
            victim = oldest
        if victim is None:
            budget.udp_full.clear()
            return
        victim.listener.stats.evicted += 1
        budget.udp_full.hit(service=self.name, sessions_on_port=len(self._sessions),
                            sessions_in_total=len(budget.udp_sessions),
                            max_udp_sessions_per_service=limits.max_udp_sessions_per_service,
                            max_udp_sessions=limits.max_udp_sessions)
        victim.close()

    async def _open(self, session: _Session) -> None:
        ip, port = self._targets.get(session.endpoint) or split_host_port(session.endpoint)
        try:
            await self.loop().create_datagram_endpoint(lambda: session, remote_addr=(ip, port))
        except OSError as exc:
            if out_of_resources(exc, dial=True):
                self._budget.out_of_fds.hit(failed="udp session", service=self.name,
                                            error=exc.strerror or str(exc),
                                            retry="the client's next datagram tries again")
            else:
                _log.warning("udp session failed", service=self.name, endpoint=session.endpoint,
                             error=exc.strerror or str(exc), retry="the client's next datagram tries again")
            self.stats.dropped += len(session.pending or ())
            session.close()
            return
        except BaseException:
            session.close()
            raise
        if session.closed and session.transport is not None:
            session.transport.close()
        else:
            self._budget.out_of_fds.clear()

    def session_closed(self, session: _Session) -> None:
        self._budget.udp_sessions.pop(session, None)
        if self._sessions.get(session.client) is session:
            del self._sessions[session.client]
            self.balancer.release(session.endpoint)
