"""UserspaceProxy: reconcile TCP and UDP listeners with each Snapshot.

Theory of operation. kube-proxy's userspace ``proxier.go`` ``mergeService`` in one method,
:meth:`UserspaceProxy.apply`, per service port ``(family, ServicePortName)``:

* a port that left the snapshot, or whose ClusterIP, port number or protocol changed, has its
  listener closed (open TCP connections stay; UDP sessions end, as in the legacy proxier);
* a port that is new gets an address (:mod:`kproxy.modes.userspace.addresses`), a bound socket, a
  balancer and a listener; a port that fails to bind is logged and retried on the next apply,
  and never stops the others. New ports of one ClusterIP and port number are bound together, so
  TCP and UDP share one port also when it falls back (a warning names the service, the wanted port
  and the port used); a port added beside a served sibling tries the sibling's port first;
* a port that stayed has its balancer updated in place (endpoints, affinity timeout), so its
  listener and connections are untouched, where the legacy proxier tore listeners down on any
  config change;
* a port without endpoints refuses as kube-proxy's REJECT rule does: its TCP port is held but not
  listening (connect() gets ECONNREFUSED) and its UDP socket is closed (ICMP port unreachable);
  see :mod:`kproxy.modes.userspace.tcp` and :mod:`kproxy.modes.userspace.udp`. The UDP socket is re-bound
  when endpoints return, on another port if its own was taken meanwhile; the address table
  always shows the port in use;
* SCTP ports are logged and skipped: the userspace mode never served SCTP.

After every apply that changed it, the changes to the address table (where each port listens:
entries added, removed and moved, at most :data:`TABLE_CHANGES_SHOWN` of each named) are logged
through structlog and, when ``address_map_path`` is set, the whole table is written atomically
(temp file + ``os.replace``) as a JSON list of ``{"service", "protocol", "cluster_ip", "port",
"listen"}`` dicts, mode 0644 less the process umask (readable by the tools that look Services up).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from types import TracebackType

import structlog

from kproxy.errors import ConfigError, InvalidArgument, InvalidTransition, KproxyError
from kproxy.model.destinationrule import ConsistentHash
from kproxy.model.names import IPFamily, Protocol, ServicePortName, join_host_port
from kproxy.model.snapshot import ServicePortInfo, Snapshot
from kproxy.modes.userspace._table import (
    check_map_path,
    table_changes,
    write_atomically,
)
from kproxy.modes.userspace._tasks import TaskOwner
from kproxy.modes.userspace.addresses import (
    DEFAULT_LOOPBACK_BLOCK,
    ListenPlan,
    allocate_addresses,
    bind_sockets,
    parse_bind_address,
    plan_listen,
)
from kproxy.modes.userspace.balancer import RoundRobinBalancer
from kproxy.modes.userspace.http.service_l7 import ServiceHttpListener, service_hash_policy
from kproxy.modes.userspace.limits import Budget, ConnectionLimits
from kproxy.modes.userspace.tcp import (
    DEFAULT_DIAL_TIMEOUTS_S,
    ConnectionRegistry,
    TcpConnectionInfo,
    TcpListener,
    TcpStats,
)
from kproxy.modes.userspace.udp import DEFAULT_UDP_IDLE_TIMEOUT_S, UdpListener, UdpStats

__all__ = ["AddressEntry", "UserspaceProxy"]

_log = structlog.get_logger("kproxy.modes.userspace")

_Key = tuple[IPFamily, ServicePortName]


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressEntry:
    """Where one service port is served.

    Attributes:
        service: the ServicePortName text, ``namespace/name:port``.
        protocol: ``"TCP"`` or ``"UDP"``.
        cluster_ip: the Service's ClusterIP in this port's family.
        port: the service port number.
        listen: the proxy's ``ip:port`` (``[ip]:port`` for IPv6) for this port.
    """

    service: str
    protocol: str
    cluster_ip: str
    port: int
    listen: str


@dataclass(slots=True)
class _Served:
    identity: tuple[str, int, Protocol]
    listener: TcpListener | UdpListener | ServiceHttpListener
    service: str
    #: the Istio consistent hash an HTTP port is balanced with per request (None: layer 4)
    l7: ConsistentHash | None = None

    @property
    def entry(self) -> AddressEntry:
        cluster_ip, port, protocol = self.identity
        return AddressEntry(service=self.service, protocol=str(protocol), cluster_ip=cluster_ip, port=port,
                            listen=join_host_port(*self.listener.address))


class UserspaceProxy:
    """The userspace data plane: a listener per service port, reconciled with each Snapshot.

    As kube-proxy's legacy userspace proxier (``pkg/proxy/userspace``), rootless: listeners on
    loopback instead of iptables portals (see :mod:`kproxy.modes.userspace.addresses`).

    Use ``async with UserspaceProxy(...) as proxy:`` or call :meth:`aclose` when done.

    Args:
        bind_address: one specific address for every service port, each on a free port; None
            gives each IPv4 Service its own loopback address (IPv6: ``::1``) and its own port
            numbers. Check at start-up that it can be bound with :func:`check_bind_address`.
        loopback_block: the IPv4 CIDR the per-Service addresses come from.
        address_map_path: where to write the address table as JSON on every change, or None.
        udp_idle_timeout_s: seconds of silence after which a UDP session closes.
        clock: float seconds from a monotonic clock, for ClientIP affinity.
        dial_timeouts_s: one TCP dial timeout per attempt, in seconds (kube-proxy's
            ``EndpointDialTimeouts``); a failed attempt tries the next endpoint.
        limits: caps on open TCP connections and UDP sessions, per service port and in total;
            None sizes them from the soft RLIMIT_NOFILE at construction
            (:meth:`~kproxy.modes.userspace.limits.ConnectionLimits.from_nofile`).

    Raises:
        ConfigError: ``loopback_block`` is not an IPv4 CIDR, or ``bind_address`` is not an IP
            address or is a wildcard (``0.0.0.0``, ``::``), which cannot answer UDP from the
            address the client used, or ``address_map_path`` is a folder or in a folder that
            does not exist (the message names ``--address-map``).
        InvalidArgument: ``dial_timeouts_s`` is empty or not all positive, or
            ``udp_idle_timeout_s`` is not positive.
    """

    def __init__(
        self,
        *,
        bind_address: str | None = None,
        loopback_block: str = DEFAULT_LOOPBACK_BLOCK,
        address_map_path: str | os.PathLike[str] | None = None,
        udp_idle_timeout_s: float = DEFAULT_UDP_IDLE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        dial_timeouts_s: tuple[float, ...] = DEFAULT_DIAL_TIMEOUTS_S,
        limits: ConnectionLimits | None = None,
    ) -> None:
        if not dial_timeouts_s or not all(t > 0 for t in dial_timeouts_s):
            raise InvalidArgument(f"dial_timeouts_s must be positive seconds, got {dial_timeouts_s=}")
        if not udp_idle_timeout_s > 0:
            raise InvalidArgument(f"udp_idle_timeout_s must be > 0 seconds, got {udp_idle_timeout_s=}")
        allocate_addresses((), block=loopback_block)  # validates the block eagerly
        if address_map_path is not None:
            check_map_path(os.fspath(address_map_path))
        self._bind_address = None if bind_address is None else parse_bind_address(bind_address)
        self._block = loopback_block
        self._map_path = os.fspath(address_map_path) if address_map_path is not None else None
        self._udp_idle_timeout_s = float(udp_idle_timeout_s)
        self._clock = clock
        self._dial_timeouts_s = tuple(dial_timeouts_s)
        self._served: dict[_Key, _Served] = {}
        self._l7: dict[_Key, ConsistentHash] = {}
        self._loopback: dict[str, str] = {}
        self._skipped: set[_Key] = set()
        self._registry = ConnectionRegistry()
        self._budget = Budget(limits if limits is not None else ConnectionLimits.from_nofile(), _log)
        self._tasks = TaskOwner()
        self._lock = asyncio.Lock()
        self._closed = False
        self._last_table: list[AddressEntry] | None = None

    async def __aenter__(self) -> UserspaceProxy:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose(0.0)

    # -- reconcile -----------------------------------------------------------------------

    async def apply(self, snapshot: Snapshot) -> None:
        """Make the listeners match ``snapshot`` (open, close, update balancers in place).

        A port that cannot be served (no address, bind failure) is logged as an error and
        retried on the next apply; it never stops the other ports.

        Raises:
            InvalidTransition: the proxy is closed.
        """
        async with self._lock:
            if self._closed:
                raise InvalidTransition("UserspaceProxy: apply() after aclose(); make a new proxy")
            wanted: dict[_Key, ServicePortInfo] = {}
            self._l7 = {(i.family, i.name): p for i in snapshot
                        if (p := service_hash_policy(i, snapshot.destination_rules)) is not None}
            for info in snapshot:
                key = (info.family, info.name)
                if info.protocol is Protocol.SCTP:
                    if key not in self._skipped:
                        self._skipped.add(key)
                        _log.warning("SCTP service port not served in userspace mode", service=str(info.name))
                    continue
                wanted[key] = info
            self._skipped &= {(i.family, i.name) for i in snapshot}
            for key in [k for k, s in self._served.items()
                        if k not in wanted or s.identity != _identity(wanted[k])
                        or s.l7 != self._l7.get(k)]:
                self._served.pop(key).listener.close()
            self._allocate(wanted.values())
            now_s = self._clock()
            fresh: list[ServicePortInfo] = []
            for key, info in wanted.items():
                served = self._served.get(key)
                if served is None:
                    fresh.append(info)
                    continue
                served.listener.balancer.set_affinity(info.session_affinity_timeout_s)
                await served.listener.set_endpoints(info.internal_endpoints)
                served.listener.balancer.cleanup_stale_affinity(now_s)
            held = {s.identity[:2]: s.listener.address[1] for s in self._served.values()}
            for group in _port_groups(fresh):
                ports = await self._open_group(group, held.get((group[0].cluster_ip, group[0].port)))
                if ports:
                    held.setdefault((group[0].cluster_ip, group[0].port), ports[0])
            self._publish()

    def _allocate(self, infos: Iterable[ServicePortInfo]) -> None:
        if self._bind_address is not None:
            return
        try:
            self._loopback = allocate_addresses((i.cluster_ip for i in infos), block=self._block,
                                                previous=self._loopback)
        except ConfigError as exc:
            _log.error("cannot allocate loopback addresses", error=str(exc))

    async def _open_group(self, infos: Sequence[ServicePortInfo], sibling_port: int | None) -> list[int]:
        """Bind and serve the new ports of one ClusterIP and port number (one per protocol) on one port.

        Args:
            infos: the new ports, one per protocol, of one ClusterIP and port number.
            sibling_port: the port a served port of the same ClusterIP and number (another
                protocol) listens on, tried first; None when there is none.

        Returns:
            The ports now served (empty when binding failed; the failure is logged).
        """
        first = infos[0]
        try:
            plan = plan_listen(cluster_ip=first.cluster_ip, port=first.port,
                               bind_address=self._bind_address, loopback=self._loopback)
            if sibling_port is not None:
                plan = ListenPlan(ip=plan.ip, port=sibling_port, fallback=True)
            socks = bind_sockets(plan, [i.protocol for i in infos])
        except (OSError, KproxyError) as exc:
            for info in infos:
                _log_cannot_serve(info, exc)
            return []
        served: list[int] = []
        try:
            for info in infos:
                sock = socks.pop(info.protocol)
                got = int(sock.getsockname()[1])
                if plan.fallback and got != info.port:
                    _log.warning("service port fell back to a free port", service=str(info.name),
                                 protocol=str(info.protocol), wanted_port=info.port, port=got, ip=plan.ip)
                try:
                    self._served[(info.family, info.name)] = await self._open(info, sock)
                except (OSError, KproxyError) as exc:
                    _log_cannot_serve(info, exc)
                else:
                    served.append(got)
        finally:
            for sock in socks.values():
                sock.close()
        return served

    async def _open(self, info: ServicePortInfo, sock: socket.socket) -> _Served:
        """Serve ``info`` on the bound ``sock`` (owned from here on, closed on failure)."""
        name = str(info.name)
        balancer = RoundRobinBalancer(affinity_ttl_s=info.session_affinity_timeout_s, name=name)
        listener: TcpListener | UdpListener | ServiceHttpListener
        l7 = self._l7.get((info.family, info.name))
        try:
            if l7 is not None:
                listener = ServiceHttpListener(name=name, policy=l7)
            elif info.protocol is Protocol.TCP:
                listener = TcpListener(name=name, balancer=balancer, clock=self._clock,
                                       dial_timeouts_s=self._dial_timeouts_s, registry=self._registry,
                                       tasks=self._tasks, budget=self._budget)
            else:
                listener = UdpListener(name=name, balancer=balancer, clock=self._clock,
                                       idle_timeout_s=self._udp_idle_timeout_s, tasks=self._tasks,
                                       budget=self._budget)
            await listener.set_endpoints(info.internal_endpoints)
            await listener.start(sock)
        except BaseException:
            sock.close()
            raise
        return _Served(identity=_identity(info), listener=listener, service=name, l7=l7)

    # -- the address table ---------------------------------------------------------------

    def address_table(self) -> list[AddressEntry]:
        """Every served port, sorted by service, protocol, then ClusterIP."""
        return sorted((s.entry for s in self._served.values()),
                      key=lambda e: (e.service, e.protocol, e.cluster_ip))

    def listen_address(
        self, service: str, protocol: str = "TCP", family: IPFamily = IPFamily.IPv4
    ) -> str | None:
        """The ``ip:port`` serving ``service`` (ServicePortName text), or None when not served."""
        for (fam, spn), served in self._served.items():
            if fam is family and str(spn) == service and str(spn.protocol) == protocol:
                return served.entry.listen
        return None

    def find_listen_address(self, service: str, protocol: str = "TCP",
                            family: IPFamily | str | None = None) -> str:
        """The ``ip:port`` serving a port of ``service``, addressed by name or by number.

        Args:
            service: ``ns/name:PORT``, PORT being the service port's name (``http``, or
                ``p80`` for the harness's named ports) or its number (``80``); or ``ns/name``
                alone when the Service has one port of ``protocol`` (or an unnamed one).
            protocol: ``"TCP"`` or ``"UDP"``.
            family: IPv4 or IPv6 (an :class:`IPFamily` or its text); None prefers IPv4.

        Raises:
            LookupError: nothing served matches, or ``ns/name`` alone matches several ports;
                the message lists what this Service serves.
            InvalidArgument: ``family`` is not IPv4 or IPv6.
        """
        fam = _family(family)
        base, sep, port = service.partition(":")
        proto = protocol.upper()
        ports = [(f, spn, s) for (f, spn), s in self._served.items()
                 if f"{spn.namespace}/{spn.name}" == base and str(spn.protocol) == proto
                 and (fam is None or f is fam)]
        if sep:
            ports = [p for p in ports if port in (p[1].port, str(p[2].identity[1]))]
        elif len({p[1] for p in ports}) > 1:
            ports = [p for p in ports if not p[1].port]
        names = sorted({p[1] for p in ports}, key=str)
        if len(names) == 1:
            ports.sort(key=lambda p: p[0] is not IPFamily.IPv4)
            return ports[0][2].entry.listen
        served = sorted({f"{e.service} ({e.protocol}, port {e.port})" for e in self.address_table()
                         if e.service.partition(":")[0] == base})
        wanted = f"{service} over {proto}" + (f" in {fam}" if fam is not None else "")
        if names:
            raise LookupError(f"{wanted} matches several ports; name one, by name or number: {served}")
        raise LookupError(f"{wanted} is not served; this Service serves {served or 'nothing'} "
                          "(address a port as ns/name:NAME or ns/name:NUMBER)")

    def _publish(self) -> None:
        table = self.address_table()
        if table == self._last_table:
            return
        previous, self._last_table = self._last_table or [], table
        rows = [asdict(e) for e in table]
        _log.info("userspace address table changed", **table_changes(previous, table),
                  entries=len(table), **({"full_table": self._map_path} if self._map_path else {}))
        if self._map_path is not None:
            try:
                write_atomically(self._map_path, json.dumps(rows, indent=2) + "\n")
            except OSError as exc:
                _log.error("cannot write address map", path=self._map_path, error=str(exc))

    # -- introspection -------------------------------------------------------------------

    @property
    def limits(self) -> ConnectionLimits:
        """The caps on open TCP connections and UDP sessions in force."""
        return self._budget.limits

    def connections(self) -> list[TcpConnectionInfo]:
        """One :class:`TcpConnectionInfo` per open TCP connection (including those of removed ports)."""
        return self._registry.infos()

    def stats(self) -> dict[tuple[str, str, IPFamily], TcpStats | UdpStats]:
        """Live counters ``{(service, protocol, family): TcpStats | UdpStats}`` of every served port.

        The objects are the listeners' own (mutable, cumulative since the listener opened); a
        listener that closes takes its counters with it.
        """
        return {(str(spn), str(spn.protocol), fam): served.listener.stats
                for (fam, spn), served in self._served.items()}

    def balancer(self, service: str, protocol: str = "TCP",
                 family: IPFamily = IPFamily.IPv4) -> RoundRobinBalancer | None:
        """The live balancer of a served port (ServicePortName text), or None."""
        for (fam, spn), served in self._served.items():
            if fam is family and str(spn) == service and str(spn.protocol) == protocol:
                return served.listener.balancer
        return None

    # -- shutdown ------------------------------------------------------------------------

    async def aclose(self, drain_timeout_s: float) -> None:
        """Stop accepting, let open TCP connections finish for up to ``drain_timeout_s``, reset the rest.

        Every listener closes at once (UDP sessions end with it); dials in progress are cancelled
        and their clients reset. Connections left when the timeout ends are reset on both sides (a
        RST, so neither peer mistakes the cut for a complete exchange). Idempotent.

        Args:
            drain_timeout_s: seconds to wait for open TCP connections to end on their own.
        """
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            for served in self._served.values():
                served.listener.close()
            self._served.clear()
            self._publish()
        await self._tasks.aclose()
        if len(self._registry):
            try:
                async with asyncio.timeout(max(drain_timeout_s, 0.0)):
                    await self._registry.wait_empty()
            except TimeoutError:
                _log.warning("aborting connections after drain timeout", open=len(self._registry),
                             drain_timeout_s=drain_timeout_s)
                self._registry.abort_all()
                for _ in range(3):  # let connection_lost callbacks run
                    await asyncio.sleep(0)


def _family(family: IPFamily | str | None) -> IPFamily | None:
    if family is None or isinstance(family, IPFamily):
        return family
    for fam in IPFamily:
        if str(fam).lower() == str(family).lower():
            return fam
    raise InvalidArgument(f"family must be IPv4 or IPv6, got {family=!r}")


def _identity(info: ServicePortInfo) -> tuple[str, int, Protocol]:
    return (info.cluster_ip, info.port, info.protocol)


def _port_groups(infos: Iterable[ServicePortInfo]) -> list[list[ServicePortInfo]]:
    """``infos`` grouped by (family, ClusterIP, port number), at most one port per protocol a group."""
    groups: dict[tuple[IPFamily, str, int], list[list[ServicePortInfo]]] = {}
    for info in infos:
        chains = groups.setdefault((info.family, info.cluster_ip, info.port), [])
        for group in chains:
            if all(g.protocol is not info.protocol for g in group):
                group.append(info)
                break
        else:
            chains.append([info])
    return [group for chains in groups.values() for group in chains]


def _log_cannot_serve(info: ServicePortInfo, exc: BaseException) -> None:
    _log.error("cannot serve service port", service=str(info.name), protocol=str(info.protocol),
               cluster_ip=info.cluster_ip, port=info.port, error=str(exc) or type(exc).__name__)
