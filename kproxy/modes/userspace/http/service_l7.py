"""HTTP Service ports with an Istio DestinationRule ``consistentHash``: balanced per request, as Envoy does.

Which ports (Istio's protocol selection, ``pilot/pkg/model`` / "Protocol Selection" docs): a TCP
port whose ``appProtocol`` is ``http``, or whose name is ``http`` or starts with ``http-``. Such
a port with a matching DestinationRule that has ``trafficPolicy.loadBalancer.consistentHash``
(the port-level setting of its number first, then the top level, Istio's precedence) is served
by :class:`ServiceHttpListener` in the userspace mode: each request is hashed (Envoy's policies,
see :mod:`.envoy_hash`) over a ring-hash or Maglev table of the port's endpoints, a request
without a hash picks at random, and a connect error retries with Envoy's ``attempt`` offset.
Every other port stays layer 4.

Which rule (Istio's host matching): ``spec.host`` names ``name.namespace.svc.cluster.local``
(a short name is relative to the rule's namespace), or a wildcard such as
``*.namespace.svc.cluster.local``; an exact host beats a wildcard, a rule in the Service's own
namespace beats one elsewhere, then namespace/name order decides.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import socket
from collections.abc import Iterable, Sequence

import structlog

from kproxy.model import ConsistentHash, DestinationRule, Endpoint, Protocol, ServicePortInfo
from kproxy.modes.userspace.balancer import RoundRobinBalancer
from kproxy.modes.userspace.http._wire import Head
from kproxy.modes.userspace.http.choosers import EnvoyChooser
from kproxy.modes.userspace.http.envoy_hash import HashRequest
from kproxy.modes.userspace.http.listener import IngressListener, IngressOptions
from kproxy.modes.userspace.http.pool import Conn
from kproxy.modes.userspace.tcp import TcpStats

__all__ = ["ServiceHttpListener", "is_http_port", "service_hash_policy"]

log = structlog.get_logger("kproxy.http")


def is_http_port(info: ServicePortInfo) -> bool:
    """Istio's HTTP detection: a TCP port with appProtocol ``http`` or a name ``http`` or ``http-*``."""
    if info.protocol is not Protocol.TCP:
        return False
    name = info.name.port.lower()
    return info.app_protocol.lower() == "http" or name == "http" or name.startswith("http-")


def service_hash_policy(info: ServicePortInfo, rules: Iterable[DestinationRule], *,
                        domain: str = "cluster.local") -> ConsistentHash | None:
    """The consistent hash Istio's sidecar applies to ``info``, or None (the port stays layer 4)."""
    if not is_http_port(info):
        return None
    fqdn = f"{info.name.name}.{info.name.namespace}.svc.{domain}"
    ranked: list[tuple[int, int, str, str, DestinationRule]] = []
    for rule in rules:
        host = rule.fqdn(domain)
        if host == fqdn:
            exact = 0
        elif host == "*" or (host.startswith("*.") and fqdn.endswith(host[1:])):
            exact = 1
        else:
            continue
        ranked.append((exact, rule.namespace != info.name.namespace, rule.namespace, rule.name, rule))
    for *_, rule in sorted(ranked, key=lambda r: r[:4]):
        lb = rule.policy_for(info.port)
        return lb.consistent_hash if lb is not None else None
    return None


class ServiceHttpListener(IngressListener):
    """One HTTP Service port balanced per request with Envoy's consistent hashing.

    It stands in for a :class:`~kproxy.modes.userspace.tcp.TcpListener` in
    :class:`~kproxy.modes.userspace.UserspaceProxy` (``set_endpoints``, ``start(sock)``,
    ``close``, ``address``, ``balancer``, ``stats``).

    Args:
        name: the ServicePortName text (for logs).
        policy: the DestinationRule's consistent hash.
        rng: randomness for requests without a hash.
    """

    def __init__(self, *, name: str, policy: ConsistentHash, rng: random.Random | None = None) -> None:
        super().__init__(IngressOptions(host="", port=0), rng=rng)
        self.name = name
        self.policy = policy
        self.balancer = RoundRobinBalancer(name=name)  # kept for the proxy's interface; not used to choose
        self.stats = TcpStats()
        self._hosts: tuple[str, ...] = ()
        self._chooser: EnvoyChooser | None = None
        self._address: tuple[str, int] = ("", 0)

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens."""
        return self._address

    async def set_endpoints(self, endpoints: Iterable[Endpoint]) -> None:
        """Rebuild the ring or table when the endpoint set changes."""
        hosts = tuple(sorted({e.address for e in endpoints}))
        if hosts == self._hosts:
            return
        self._hosts = hosts
        self._chooser = EnvoyChooser(hosts, self.policy, rng=self._rng) if hosts else None
        self.balancer.update(hosts)

    async def start(self, sock: socket.socket) -> None:  # type: ignore[override]
        """Serve HTTP on the bound ``sock``."""
        sock.setblocking(False)
        self._server = await asyncio.start_server(self._client, sock=sock, backlog=1024)
        name = sock.getsockname()
        self._address = (name[0], name[1])
        log.info("http service port balanced by consistent hash", service=self.name,
                 algorithm=str(self.policy.algorithm), key=str(self.policy.key),
                 address=f"{name[0]}:{name[1]}")

    def close(self) -> None:
        """Stop accepting and cut open connections."""
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()

    async def _connect(self, head: Head, peer: tuple[str, int],
                       local: tuple[str, int]) -> tuple[Conn, str, tuple[str, ...]] | int:
        chooser = self._chooser
        if chooser is None:
            return 503
        headers = tuple((k.decode("latin-1"), v.decode("latin-1")) for k, v in head.headers)
        request = HashRequest(headers=headers, path=head.url.decode("latin-1"), remote=(peer[0], peer[1]),
                              local=(local[0], local[1]))
        cookies: tuple[str, ...] = ()
        for attempt in range(self.options.next_upstream_tries):
            host, set_cookies = chooser.choose(request, attempt)
            cookies = cookies or set_cookies
            try:
                return await self._pool.get(host), host, cookies
            except OSError as err:
                log.info("upstream connect failed", service=self.name, endpoint=host, error=str(err))
        return 503  # Envoy: "no healthy upstream" / connect failure after retries

    def _request_head(self, head: Head, host: str, peer: tuple[str, int], local: tuple[str, int]) -> bytes:
        """The request as the sidecar forwards it: Host kept, x-request-id and x-forwarded-proto added."""
        lines: list[bytes] = [head.method + b" " + head.url + b" HTTP/1.1"]
        seen = {k.lower() for k, _ in head.headers}
        keep: Sequence[tuple[bytes, bytes]] = [
            (k, v) for k, v in head.headers
            if k.lower() not in (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                 b"expect", b"upgrade", b"te")]
        lines += [k + b": " + v for k, v in keep]
        if b"x-request-id" not in seen:
            lines.append(b"x-request-id: " + secrets.token_hex(16).encode())
        if b"x-forwarded-proto" not in seen:
            lines.append(b"x-forwarded-proto: http")
        if head.upgrade:
            upgrade = next((v for k, v in head.headers if k.lower() == b"upgrade"), b"")
            lines += [b"Connection: upgrade", b"Upgrade: " + upgrade]
        if head.chunked:
            lines.append(b"Transfer-Encoding: chunked")
        return b"\r\n".join(lines) + b"\r\n\r\n"
