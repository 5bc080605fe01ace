"""Where each service port listens: a pure allocation step and a thin binding step.

Theory of operation. kube-proxy's userspace mode listened on a random proxy port and sent
ClusterIP traffic there with iptables REDIRECT/DNAT (``port_allocator.go``); its Windows twin
(``winuserspace``) owned every ClusterIP as a real address and listened on the Service's own port.
Rootless, kproxy does the Windows thing on loopback, as kubefwd does:

* every IPv4 Service (keyed by its ClusterIP) gets its own address in a loopback block (default
  ``127.0.0.0/8``), derived from a SHA-256 hash of the ClusterIP with linear probing on
  collision, so the address is stable for a ClusterIP and does not depend on the loop's history;
  the block's network address, ``127.0.0.1`` and the broadcast address are never handed out;
* it then listens on the Service's own port numbers there; a port that cannot be bound
  (privileged as non-root, in use) falls back to a free high port on the same address;
* IPv6 service ports listen on ``::1``, each on a free port;
* with a ``bind_address``, every service port gets its own free port on that one address.

:func:`allocate_addresses` is pure (a set of ClusterIPs in, a mapping out);
:func:`bind_socket` is the only function here that touches the OS.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kproxy.errors import ConfigError
from kproxy.model.names import Protocol

__all__ = [
    "DEFAULT_LOOPBACK_BLOCK",
    "IPV6_LOOPBACK",
    "LISTEN_BACKLOG",
    "ListenPlan",
    "allocate_addresses",
    "bind_socket",
    "plan_listen",
    "split_host_port",
]

DEFAULT_LOOPBACK_BLOCK = "127.0.0.0/8"
IPV6_LOOPBACK = "::1"
#: The listen(2) backlog; the kernel caps it at net.core.somaxconn (4096 on current kernels).
#: Go's net.Listen, which kube-proxy used, asks for somaxconn as well.
LISTEN_BACKLOG = 4096
#: Errors on bind that mean "this port, not this address": fall back to port 0.
_PORT_FALLBACK_ERRNOS = frozenset({errno.EADDRINUSE, errno.EACCES, errno.EPERM})
_NEVER = frozenset({ipaddress.IPv4Address("127.0.0.1")})


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenPlan:
    """Where one service port should listen before binding.

    Attributes:
        ip: the listen address.
        port: the port to try first; 0 asks the kernel for a free one.
        fallback: when ``port`` cannot be bound (EADDRINUSE, EACCES, EPERM), bind port 0 instead.
    """

    ip: str
    port: int
    fallback: bool = True


def _parse_block(block: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(block, strict=False)
    except ValueError as exc:
        raise ConfigError(f"loopback_block must be an IPv4 CIDR such as '127.0.0.0/8', got {block=}") from exc
    if not isinstance(net, ipaddress.IPv4Network):
        raise ConfigError(f"loopback_block must be an IPv4 CIDR such as '127.0.0.0/8', got {block=}")
    return net


def _usable(net: ipaddress.IPv4Network, addr: ipaddress.IPv4Address) -> bool:
    if addr in _NEVER:
        return False
    return not (net.num_addresses > 2 and addr in (net.network_address, net.broadcast_address))


def _first_probe(cluster_ip: str, size: int) -> int:
    digest = hashlib.sha256(cluster_ip.encode("ascii")).digest()
    return int.from_bytes(digest[:8], "big") % size


def allocate_addresses(
    cluster_ips: Iterable[str],
    *,
    block: str = DEFAULT_LOOPBACK_BLOCK,
    previous: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Give each IPv4 ClusterIP its own address in ``block`` (pure; no I/O).

    An address is ``block[sha256(cluster_ip) mod size]``, probing upward (wrapping) past
    addresses taken or never handed out (network, ``127.0.0.1``, broadcast). ClusterIPs are
    placed in sorted order, after those in ``previous`` that still fit, so the result depends
    only on its inputs and an address does not move while its ClusterIP stays.

    Args:
        cluster_ips: IPv4 ClusterIPs (IPv6 ones are ignored: they listen on ``::1``).
        block: an IPv4 CIDR, e.g. ``"127.0.0.0/8"``.
        previous: an earlier result ``{cluster_ip: address}`` to keep stable.

    Returns:
        ``{cluster_ip: address}`` for every IPv4 ClusterIP given, as long as the block has room;
        when it is full, the ClusterIPs that come last in sorted order are left out (and
        :func:`plan_listen` raises for them, so each such port is reported on its own).

    Raises:
        ConfigError: ``block`` is not an IPv4 CIDR.
    """
    net = _parse_block(block)
    wanted = sorted({ip for ip in cluster_ips if ":" not in ip})
    size = net.num_addresses
    base = int(net.network_address)
    out: dict[str, str] = {}
    taken: set[str] = set()
    for cip, held in sorted((previous or {}).items()):
        if cip in wanted and held not in taken:
            parsed = ipaddress.ip_address(held)
            if isinstance(parsed, ipaddress.IPv4Address) and parsed in net and _usable(net, parsed):
                out[cip] = held
                taken.add(held)
    specials = {net.network_address, net.broadcast_address, *_NEVER}
    usable = size - sum(1 for a in specials if a in net and not _usable(net, a))
    for cip in wanted:
        if cip in out:
            continue
        if len(taken) >= usable:
            break  # the block is full: the remaining ClusterIPs get no address
        start = _first_probe(cip, size)
        for step in range(size):
            addr = ipaddress.IPv4Address(base + (start + step) % size)
            text = str(addr)
            if text not in taken and _usable(net, addr):
                out[cip] = text
                taken.add(text)
                break
    return out


def plan_listen(
    *,
    cluster_ip: str,
    port: int,
    bind_address: str | None,
    loopback: Mapping[str, str],
) -> ListenPlan:
    """Decide where one service port listens (pure).

    Args:
        cluster_ip: the service port's ClusterIP.
        port: the service port number.
        bind_address: the single address every port shares (each on a free port), or None.
        loopback: the :func:`allocate_addresses` result for the IPv4 ClusterIPs.

    Returns:
        The :class:`ListenPlan`: ``bind_address`` port 0; IPv6 ``::1`` port 0; otherwise the
        ClusterIP's loopback address and the service port, with fallback to a free port.

    Raises:
        ConfigError: an IPv4 ``cluster_ip`` has no address in ``loopback`` (the block is full).
    """
    if bind_address is not None:
        return ListenPlan(ip=bind_address, port=0, fallback=False)
    if ":" in cluster_ip:
        return ListenPlan(ip=IPV6_LOOPBACK, port=0, fallback=False)
    ip = loopback.get(cluster_ip)
    if ip is None:
        raise ConfigError(f"no loopback address left for ClusterIP {cluster_ip}: the loopback block is "
                          "full; give a larger loopback_block or a bind_address")
    return ListenPlan(ip=ip, port=port, fallback=True)


def bind_socket(plan: ListenPlan, protocol: Protocol) -> socket.socket:
    """Create and bind a non-blocking socket for ``plan`` (the thin I/O step).

    TCP sockets get SO_REUSEADDR (so a restarted proxy can rebind ports in TIME_WAIT) and are
    left unlistened; ``loop.create_server(sock=...)`` calls listen. UDP sockets are bound only.

    Args:
        plan: where to bind.
        protocol: TCP or UDP.

    Returns:
        The bound socket; read the real port with ``getsockname()``.

    Raises:
        OSError: the address cannot be bound even on a free port (the socket is closed).
        ConfigError: ``protocol`` is SCTP, which the userspace mode does not serve.
    """
    if protocol is Protocol.SCTP:
        raise ConfigError("the userspace proxy serves TCP and UDP only; SCTP ports are skipped")
    family = socket.AF_INET6 if ":" in plan.ip else socket.AF_INET
    kind = socket.SOCK_STREAM if protocol is Protocol.TCP else socket.SOCK_DGRAM
    sock = socket.socket(family, kind)
    try:
        sock.setblocking(False)
        if protocol is Protocol.TCP:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((plan.ip, plan.port))
        except OSError as exc:
            if not (plan.fallback and plan.port and exc.errno in _PORT_FALLBACK_ERRNOS):
                raise
            sock.bind((plan.ip, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def split_host_port(address: str) -> tuple[str, int]:
    """Split ``ip:port`` or ``[ip]:port`` (Go's ``net.SplitHostPort``) into ``(ip, port)``.

    Raises:
        ValueError: ``address`` has no port or a port that is not a number.
    """
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"expected 'ip:port' or '[ip]:port', got {address=}")
    return host.strip("[]"), int(port)
