"""The port-forward client: kubectl's target and port syntax, many local connections over one
upgraded connection, and an async library API (``async with port_forward(...)``).

Theory of operation
-------------------
:func:`resolve_target` does what kubectl does before forwarding (``kubectl/pkg/cmd/portforward``):
``pod/NAME`` (or ``NAME``) must be Running; ``svc/NAME`` picks the first ready Pod of the
Service's selector and maps each service port to its ``targetPort`` (a number, or a container
port name looked up in the Pod); a named remote port on a Pod is looked up the same way.
:func:`dial` upgrades, tunnel first and SPDY on an upgrade failure (client-go
``fallback_dialer.go``). :class:`PortForwarder` then carries each local connection as an error
and a data stream with the next ``requestID`` (client-go ``handleConnection``). Unlike client-go
since kubernetes PR #103526, an error on one stream is reported and that connection closed, but
the upgraded connection and the other forwards go on; only the upgraded connection ending
(the Pod went away) ends the forward. PINGs every 5 s keep idle-timeout middleboxes quiet, as
client-go's SPDY transport does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from kproxy.errors import ConfigError, PortForwardError
from kproxy.portforward.bridge import relay
from kproxy.portforward.connection import SpdyConnection
from kproxy.portforward.http import ApiEndpoint, UpgradeFailed, get_json, upgrade_spdy, upgrade_tunnel
from kproxy.portforward.protocol import PING_PERIOD_S, StreamType, stream_headers
from kproxy.portforward.session import Role

__all__ = ["ForwardedPort", "PortForward", "PortForwarder", "PortSpec", "ResolvedTarget", "dial",
           "parse_ports", "port_forward", "resolve_target"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PortSpec:
    """One ``[LOCAL:]REMOTE``: ``local`` 0 picks a free port; ``remote`` a number or a port name."""

    local: int
    remote: str
    local_given: bool


def parse_ports(words: Sequence[str]) -> tuple[PortSpec, ...]:
    """kubectl's port arguments: ``8080``, ``8080:80``, ``:80`` (a free local port), ``0:80``.

    Raises:
        ConfigError: an empty list or a port that is not a number in range.
    """
    if not words:
        raise ConfigError("TYPE/NAME and list of ports are required for port-forward")
    out = []
    for word in words:
        local, sep, remote = word.partition(":")
        if not sep:
            local, remote = word, word
        if not remote:
            raise ConfigError(f"Error parsing remote port for {word!r}")
        try:
            lport = int(local) if local else 0
        except ValueError:
            raise ConfigError(f"Error parsing local port '{local}': not a number") from None
        if not 0 <= lport <= 65535:
            raise ConfigError(f"Error parsing local port '{local}': out of range")
        if remote.isdigit() and not 1 <= int(remote) <= 65535:
            raise ConfigError(f"Error parsing remote port '{remote}': out of range")
        out.append(PortSpec(local=lport, remote=remote, local_given=bool(sep)))
    return tuple(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedTarget:
    """The Pod to forward to and each spec's ``(local, remote port number)``."""

    namespace: str
    pod: str
    ports: tuple[tuple[int, int], ...]


def _container_port(pod: dict[str, Any], name: str) -> int | None:
    for container in pod.get("spec", {}).get("containers", []) or []:
        for port in container.get("ports", []) or []:
            if port.get("name") == name:
                return int(port["containerPort"])
    return None


def _ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions", []) or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


async def resolve_target(endpoint: ApiEndpoint, namespace: str, target: str,
                         specs: Sequence[PortSpec]) -> ResolvedTarget:
    """Resolve ``pod/NAME``, ``NAME`` or ``svc/NAME`` (also ``service/``, ``services/``) as kubectl.

    Raises:
        PortForwardError: the object is missing, the Pod not running, no ready Pod, or a port
            that does not map (kubectl's messages).
    """
    kind, _, name = target.rpartition("/")
    kind = kind.lower() or "pod"
    ns = quote(namespace)
    if kind in ("svc", "service", "services"):
        status, svc = await get_json(endpoint, f"/api/v1/namespaces/{ns}/services/{quote(name)}")
        if status != 200:
            raise PortForwardError(f'services "{name}" not found')
        labels = svc.get("spec", {}).get("selector") or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        if not selector:
            raise PortForwardError(f"cannot attach to *v1.Service: invalid service '{name}': "
                                   "Service is defined without a selector")
        _, pods = await get_json(endpoint, f"/api/v1/namespaces/{ns}/pods?labelSelector={quote(selector)}")
        items = sorted(pods.get("items", []) or [], key=lambda p: (not _ready(p), p["metadata"]["name"]))
        if not items:
            raise PortForwardError(f"timed out waiting for the condition: no pods for service {name}")
        pod = items[0]
        mapped = []
        for spec in specs:
            sport = next((p for p in svc["spec"].get("ports", []) if str(p.get("port")) == spec.remote
                          or p.get("name") == spec.remote), None)
            if sport is None:
                raise PortForwardError(f"Service {name} does not have a service port {spec.remote}")
            tp = sport.get("targetPort", sport["port"])
            remote = int(tp) if isinstance(tp, int) or str(tp).isdigit() else _container_port(pod, str(tp))
            if remote is None:
                raise PortForwardError(f"Pod '{pod['metadata']['name']}' does not have a named port '{tp}'")
            local = spec.local if spec.local_given else int(sport["port"])
            mapped.append((local, remote))
    elif kind in ("pod", "pods", "po"):
        status, pod = await get_json(endpoint, f"/api/v1/namespaces/{ns}/pods/{quote(name)}")
        if status != 200:
            raise PortForwardError(f'pods "{name}" not found')
        mapped = []
        for spec in specs:
            remote = int(spec.remote) if spec.remote.isdigit() else _container_port(pod, spec.remote)
            if remote is None:
                raise PortForwardError(f"Pod '{name}' does not have a named port '{spec.remote}'")
            mapped.append((spec.local if spec.local_given else remote, remote))
    else:
        raise PortForwardError(f"cannot attach to {kind}: only pods and services are supported")
    phase = pod.get("status", {}).get("phase")
    if phase != "Running":
        raise PortForwardError(f"unable to forward port because pod is not running. Current status={phase}")
    return ResolvedTarget(namespace=namespace, pod=pod["metadata"]["name"], ports=tuple(mapped))


async def dial(endpoint: ApiEndpoint, namespace: str, pod: str, *, tunnel: bool = True
               ) -> tuple[SpdyConnection, str]:
    """Upgrade to ``pods/POD/portforward``: the WebSocket tunnel first (unless ``tunnel`` is
    False), SPDY/3.1 when the tunnel's upgrade fails; returns the connection and ``"websocket"``
    or ``"spdy"``.

    Raises:
        PortForwardError: neither upgrade succeeded (the last error).
    """
    path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/portforward"
    if tunnel:
        with contextlib.suppress(UpgradeFailed):
            return SpdyConnection(await upgrade_tunnel(endpoint, path), Role.CLIENT), "websocket"
    return SpdyConnection(await upgrade_spdy(endpoint, path), Role.CLIENT), "spdy"


class PortForwarder:
    """Local connections over one upgraded connection (error + data stream per connection)."""

    def __init__(self, conn: SpdyConnection, *,
                 on_error: Callable[[int, int, str], None] | None = None) -> None:
        self.conn = conn
        self._ids = itertools.count()
        self.on_error = on_error
        self.errors: list[str] = []

    async def forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, local: int,
                      remote: int) -> None:
        """Carry one accepted connection to ``remote`` until both sides finish; an error text
        from the server is recorded (and passed to ``on_error``) and ends only this connection."""
        rid = next(self._ids)
        try:
            # Both SYN_STREAMs go out back to back, saving client-go's round trip between them;
            # no payload is sent before the data stream's SYN_REPLY. The error stream's FIN may
            # precede its reply: spdystream handles a stream's frames in order, after its SYN.
            err_stream = await self.conn.open_stream(stream_headers(StreamType.ERROR, remote, rid),
                                                     wait_reply=False)
            err_stream.close()  # we never write to it (client-go does the same)
            data = await self.conn.open_stream(stream_headers(StreamType.DATA, remote, rid))
        except PortForwardError:
            writer.close()
            return
        errors = asyncio.ensure_future(err_stream.read_all())
        try:
            await relay(data, reader, writer)
            text = (await errors).decode("utf-8", "replace")
        finally:
            errors.cancel()
        if text:
            message = f"an error occurred forwarding {local} -> {remote}: {text}"
            self.errors.append(message)
            if self.on_error is not None:
                self.on_error(local, remote, message)

    async def keepalive(self, period_s: float = PING_PERIOD_S) -> None:
        """Ping every ``period_s`` until the connection closes; a missing echo after two periods
        closes it (a dead tunnel is noticed, as client-go's ping timeout does)."""
        while not self.conn.closed:
            await asyncio.sleep(period_s)
            try:
                await asyncio.wait_for(self.conn.ping(), 2 * period_s)
            except (TimeoutError, PortForwardError):
                await self.conn.aclose()
                return


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardedPort:
    """One listening forward: ``address:local`` to the Pod's ``remote``."""

    address: str
    local: int
    remote: int


@dataclass(slots=True, kw_only=True)
class PortForward:
    """A running forward (from :func:`port_forward`): its ports, Pod, transport and state."""

    namespace: str
    pod: str
    transport: str
    ports: tuple[ForwardedPort, ...]
    forwarder: PortForwarder
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait(self) -> None:
        """Wait until the forward ends.

        Raises:
            PortForwardError: the upgraded connection was lost ("lost connection to pod").
        """
        await self.lost.wait()
        raise PortForwardError("lost connection to pod")


@contextlib.asynccontextmanager
async def port_forward(endpoint: ApiEndpoint, target: str, ports: Sequence[str], *,
                       namespace: str | None = None, addresses: Sequence[str] = ("127.0.0.1",),
                       tunnel: bool = True,
                       on_connection: Callable[[int], None] | None = None,
                       on_error: Callable[[int, int, str], None] | None = None) -> AsyncIterator[PortForward]:
    """Forward ``ports`` (kubectl's ``[LOCAL:]REMOTE``) of ``target`` (``pod/NAME``, ``svc/NAME``)
    on ``addresses`` while the block runs; every local connection shares one upgraded connection.

    Raises:
        PortForwardError: resolving or upgrading failed (kubectl's messages).
        ConfigError: a port argument that does not parse.
        OSError: a local port cannot be bound.
    """
    ns = namespace or endpoint.namespace
    resolved = await resolve_target(endpoint, ns, target, parse_ports(ports))
    conn, transport = await dial(endpoint, ns, resolved.pod, tunnel=tunnel)
    forwarder = PortForwarder(conn, on_error=on_error)
    servers: list[asyncio.Server] = []
    listening: list[ForwardedPort] = []
    async with asyncio.TaskGroup() as tg:
        def accept(remote: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Any]:
            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                local = writer.get_extra_info("sockname")[1]
                if on_connection is not None:
                    on_connection(local)
                try:
                    await forwarder.forward(reader, writer, local, remote)
                except asyncio.CancelledError:
                    # The forward is closing; end quietly (asyncio's stream callback would
                    # log a cancelled handler as an error).
                    writer.transport.abort()
            return handle

        try:
            for local, remote in resolved.ports:
                chosen = local
                for i, address in enumerate(addresses):
                    try:
                        server = await asyncio.start_server(accept(remote), address, chosen)
                    except OSError:
                        if i == 0:  # as kubectl: only the first address must bind
                            raise
                        continue
                    servers.append(server)
                    chosen = server.sockets[0].getsockname()[1]
                    listening.append(ForwardedPort(address=address, local=chosen, remote=remote))
            fwd = PortForward(namespace=ns, pod=resolved.pod, transport=transport, ports=tuple(listening),
                              forwarder=forwarder)

            async def run() -> None:
                await conn.run()
                fwd.lost.set()

            runner = tg.create_task(run())
            pinger = tg.create_task(forwarder.keepalive())
            yield fwd
        finally:
            for server in servers:
                server.close()
            await conn.aclose()
            with contextlib.suppress(NameError):
                pinger.cancel()
                await asyncio.gather(runner, return_exceptions=True)
