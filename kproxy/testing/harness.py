"""A running in-process cluster for tests: memory source, userspace proxy, loopback identity backends.

Theory of operation: :func:`in_process_cluster` starts a
:class:`~kproxy.sources.memory.MemorySource` and :func:`~kproxy.daemon.running_userspace_proxy`
(minimum sync period 0, so a change is applied at once) in the caller's event loop, and yields an
:class:`InProcessCluster`. Its helpers change the cluster while the test runs and wait until the
proxy has applied the change (:meth:`InProcessCluster.sync`): add a Service (its ClusterIP is
allocated), scale it (identity backends are started or stopped on ``127.0.0.1``, each answering
every TCP line or UDP datagram with ``<ip:port> <request>``, and the endpoints follow), remove it,
and send a request through the proxy to learn which backend answered. On exit every backend and
the proxy are closed, in reverse order of creation.

Naming the ports. :meth:`InProcessCluster.add_service` returns ``namespace/name``. A Service
with one port leaves it unnamed; with several, port ``N`` is named ``pN`` (``shop/web:p80``).
Every helper that takes a service accepts ``ns/name`` (its first port), ``ns/name:NUMBER``
(``shop/web:8443``) or ``ns/name:NAME`` (``shop/web:p8443``); ``name`` alone means the
``default`` namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

from kproxy.daemon import RunningProxy, UserspaceOptions, running_userspace_proxy
from kproxy.errors import InvalidArgument
from kproxy.model import IPFamily, NodeConfig, join_host_port
from kproxy.sources.memory import MemorySource

__all__ = ["IDENTITY_TIMEOUT_S", "InProcessCluster", "TcpIdentity", "UdpIdentity", "in_process_cluster"]

#: How long a request through the proxy may take, in seconds.
IDENTITY_TIMEOUT_S = 5.0
_CLUSTER_IP_BLOCK = ipaddress.ip_network("10.97.0.0/16")


class TcpIdentity(asyncio.Protocol):
    """A pod for tests: answers every TCP line with ``<identity> <line>``, so a client sees who answered."""

    def __init__(self, identity: bytes) -> None:
        self._identity = identity
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._transport.write(self._identity + b" " + line + b"\n")


class UdpIdentity(asyncio.DatagramProtocol):
    """A pod for tests: answers every UDP datagram with ``<identity> <datagram>``."""

    def __init__(self, identity: bytes) -> None:
        self.identity = identity
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self._transport is not None
        self._transport.sendto(self.identity + b" " + data, addr)


@dataclass(slots=True)
class _Backend:
    address: str
    closers: list[asyncio.BaseTransport | asyncio.Server]

    async def aclose(self) -> None:
        for closer in reversed(self.closers):
            closer.close()
            if isinstance(closer, asyncio.Server):
                await closer.wait_closed()


class _UdpReply(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if not self.reply.done():
            self.reply.set_result(data)


class InProcessCluster:
    """A cluster served by a real userspace proxy in this event loop (see the module docstring).

    Build it with :func:`in_process_cluster` (or the pytest fixture ``kproxy_cluster``).

    Attributes:
        source: the memory source (change objects directly through it if the helpers do not fit).
        running: the running proxy (``running.engine``, ``running.proxy``).
    """

    def __init__(self, source: MemorySource, running: RunningProxy) -> None:
        self.source = source
        self.running = running
        self._backends: dict[tuple[str, str, str], list[_Backend]] = {}
        self._ports: dict[str, tuple[int, ...]] = {}
        self._next_ip = 1

    # -- changing the cluster -----------------------------------------------------------------

    async def add_service(self, name: str, ports: tuple[int, ...] = (80,), *, replicas: int = 0,
                          protocol: str = "TCP", **spec: Any) -> str:
        """Add a Service with an allocated ClusterIP, start ``replicas`` backends, wait for the sync.

        Args:
            name: ``namespace/name`` (or ``name`` in ``default``).
            ports: its port numbers (one port: unnamed; several: ``p<number>``; see the module
                docstring for addressing them).
            replicas: backends to start for its first port.
            protocol: TCP or UDP, for every port.
            **spec: more ``spec`` fields by their API names (``sessionAffinity="ClientIP"``).

        Returns:
            The Service's ``namespace/name``.

        Raises:
            InvalidArgument: a malformed name, or no ClusterIP left.
            InvalidObject: the Service is invalid.
            TimeoutError: the proxy did not apply it in time.
        """
        if self._next_ip >= _CLUSTER_IP_BLOCK.num_addresses - 1:
            raise InvalidArgument("no ClusterIP left in 10.97.0.0/16 for this cluster")
        cluster_ip = str(_CLUSTER_IP_BLOCK.network_address + self._next_ip)
        self._next_ip += 1
        specs = [{"port": p, "protocol": protocol, **({"name": f"p{p}"} if len(ports) > 1 else {})}
                 for p in ports]
        svc = self.source.add_service(name, cluster_ip, specs, **spec)
        key = f"{svc.namespace}/{svc.name}"
        self._ports[key] = tuple(ports)
        if replicas:
            await self.scale(key, replicas, protocol=protocol)
        await self.sync()
        return key

    def resolve_port(self, service: str) -> tuple[str, str]:
        """``(ns/name, port name)`` of ``service``, given as ``ns/name[:NUMBER|:NAME]`` (module docstring).

        Raises:
            LookupError: a port this cluster's helpers did not create (by number or by name).
        """
        base, sep, port = service.partition(":")
        key = base if "/" in base else f"default/{base}"
        ports = self._ports.get(key)
        if ports is None:  # made through self.source directly: take the text as it is
            return key, port
        names = {p: ("" if len(ports) == 1 else f"p{p}") for p in ports}
        if not sep:
            return key, names[ports[0]]
        for number, name in names.items():
            if port in (str(number), name) and port:
                return key, name
        raise LookupError(f"{key} has no port {port!r}; its ports: "
                          + ", ".join(f"{n} ({key}:{n}" + (f" or {key}:{m})" if m else ")")
                                      for n, m in names.items()))

    async def scale(self, service: str, replicas: int, *, port_name: str | None = None,
                    protocol: str = "TCP") -> list[str]:
        """Start or stop identity backends until ``service``'s port has ``replicas`` of them.

        Args:
            service: ``ns/name`` (its first port), ``ns/name:NUMBER`` or ``ns/name:NAME``.
            replicas: how many backends the port should have.
            port_name: the port's name, instead of naming it in ``service``.
            protocol: TCP or UDP.

        Returns:
            The endpoints now (``ip:port``), oldest first.

        Raises:
            InvalidArgument: ``replicas`` < 0, or a malformed service name.
            LookupError: no such port.
            TimeoutError: the proxy did not apply the change in time.
        """
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise InvalidArgument(f"replicas must be an int >= 0, got {replicas=!r}")
        base, named = self.resolve_port(service)
        key: tuple[str, str, str] = (base, named if port_name is None else port_name, protocol.upper())
        backends = self._backends.setdefault(key, [])
        while len(backends) < replicas:
            backends.append(await self._start_backend(key[2]))
        while len(backends) > replicas:
            await backends.pop().aclose()
        addresses = [b.address for b in backends]
        self.source.set_endpoints(key[0], addresses, port_name=key[1], protocol=key[2])
        await self.sync()
        return addresses

    async def remove_service(self, service: str) -> None:
        """Delete ``service``, its endpoints and its backends, and wait for the sync.

        Raises:
            InvalidArgument: no such Service.
            TimeoutError: the proxy did not apply it in time.
        """
        base = service.partition(":")[0]
        ns, _, name = (base if "/" in base else f"default/{base}").partition("/")
        self._ports.pop(f"{ns}/{name}", None)
        for key in [k for k in self._backends if k[0] == f"{ns}/{name}"]:
            self.source.set_endpoints(key[0], [], port_name=key[1], protocol=key[2])
            for backend in self._backends.pop(key):
                await backend.aclose()
        self.source.delete("Service", ns, name)
        await self.sync()

    async def sync(self, timeout_s: float = IDENTITY_TIMEOUT_S) -> None:
        """Wait until the proxy has applied every change made so far.

        Raises:
            TimeoutError: it did not within ``timeout_s`` seconds.
        """
        engine = self.running.engine
        async with asyncio.timeout(timeout_s):
            while engine.tracker.pending_count or engine.snapshot is not engine.tracker.snapshot:
                await asyncio.sleep(0.005)

    # -- talking to it ------------------------------------------------------------------------

    def address(self, service: str, protocol: str = "TCP",
                family: IPFamily | str | None = None) -> tuple[str, int]:
        """Where the proxy serves ``service`` over ``protocol`` (and ``family``, for dual-stack ports).

        Args:
            service: ``ns/name`` (its first port), ``ns/name:NUMBER`` or ``ns/name:NAME``.
            protocol: TCP or UDP.
            family: IPv4 or IPv6; None prefers IPv4.

        Raises:
            LookupError: it is not served (the message lists what the Service serves).
        """
        base, port_name = self.resolve_port(service)
        return self.running.listen_address(f"{base}:{port_name}" if port_name else base, protocol, family)

    async def request(self, service: str, payload: str = "hello", *, protocol: str = "TCP",
                      family: IPFamily | str | None = None) -> str:
        """Send ``payload`` through the proxy to ``service`` and return the answering backend's ``ip:port``.

        Args:
            service: ``ns/name`` (its first port), ``ns/name:NUMBER`` or ``ns/name:NAME``.

        Raises:
            LookupError: the service port is not served.
            ConnectionError: the proxy refused or closed the connection.
            TimeoutError: no answer within :data:`IDENTITY_TIMEOUT_S`.
        """
        host, port = self.address(service, protocol, family)
        async with asyncio.timeout(IDENTITY_TIMEOUT_S):
            if protocol.upper() == "UDP":
                loop = asyncio.get_running_loop()
                transport, proto = await loop.create_datagram_endpoint(_UdpReply, remote_addr=(host, port))
                try:
                    transport.sendto(payload.encode())
                    data = await proto.reply
                finally:
                    transport.close()
            else:
                reader, writer = await asyncio.open_connection(host, port)
                try:
                    writer.write(payload.encode() + b"\n")
                    await writer.drain()
                    data = await reader.readline()
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        if not data:
            raise ConnectionError(f"{service}: the proxy closed the connection without an answer")
        return data.decode().split(" ", 1)[0]

    # -- internals -----------------------------------------------------------------------------

    async def _start_backend(self, protocol: str) -> _Backend:
        loop = asyncio.get_running_loop()
        if protocol == "UDP":
            transport, udp = await loop.create_datagram_endpoint(
                lambda: UdpIdentity(b""), local_addr=("127.0.0.1", 0))
            port = transport.get_extra_info("sockname")[1]
            udp.identity = join_host_port("127.0.0.1", port).encode()
            return _Backend(address=join_host_port("127.0.0.1", port), closers=[transport])
        ident: list[bytes] = []
        server = await loop.create_server(lambda: TcpIdentity(ident[0]), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        ident.append(join_host_port("127.0.0.1", port).encode())
        return _Backend(address=join_host_port("127.0.0.1", port), closers=[server])

    async def aclose(self) -> None:
        """Stop every backend (the proxy is closed by :func:`in_process_cluster`)."""
        errors: list[Exception] = []
        for backends in reversed(list(self._backends.values())):
            for backend in reversed(backends):
                try:
                    await backend.aclose()
                except Exception as err:  # collect, close the rest, then raise them together
                    errors.append(err)
        self._backends.clear()
        if errors:
            raise ExceptionGroup("closing identity backends failed", errors)


@contextlib.asynccontextmanager
async def in_process_cluster(
    *, node: NodeConfig | None = None, options: UserspaceOptions | None = None,
) -> AsyncIterator[InProcessCluster]:
    """Run an :class:`InProcessCluster` in the current event loop (see the module docstring).

    Args:
        node: the node (default: ``node-a``, IPv4 only).
        options: the userspace options (default: minimum sync period 0, drain timeout 1 s).

    Raises:
        TimeoutError: the proxy did not start in time.
    """
    source = MemorySource()
    opts = options or UserspaceOptions(min_sync_period_s=0.0, sync_period_s=30.0, drain_timeout_s=1.0)
    the_node = node or NodeConfig(hostname="node-a", ip_families=(IPFamily.IPv4,))
    async with running_userspace_proxy(source, node=the_node, options=opts) as running:
        cluster = InProcessCluster(source, running)
        try:
            yield cluster
        finally:
            await cluster.aclose()
