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
* with a ``bind_address``, every service port gets its own free port on that one address. It must
  be a specific address: a socket bound to the wildcard answers UDP from the address routing picks,
  not the one the client sent to, so connected UDP clients drop the replies.
* TCP and UDP of one service port number share one port: whenever a free port is chosen (a
  fallback, ``::1``, a ``bind_address``), :func:`bind_sockets` binds TCP to port 0 and then UDP to
  the number TCP got, retrying up to :data:`JOINT_PORT_ATTEMPTS` times, so a DNS client that
  retries over TCP finds the same port.

:func:`allocate_addresses` is pure (a set of ClusterIPs in, a mapping out); :func:`bind_socket`,
:func:`bind_sockets`, :func:`check_bind_address` and :func:`check_loopback_block` touch the OS.
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kproxy.errors import ConfigError, InvalidArgument
from kproxy.model.names import Protocol

__all__ = [
    "DEFAULT_LOOPBACK_BLOCK",
    "IPV6_LOOPBACK",
    "JOINT_PORT_ATTEMPTS",
    "LISTEN_BACKLOG",
    "ListenPlan",
    "allocate_addresses",
    "bind_socket",
    "bind_sockets",
    "check_bind_address",
    "check_loopback_block",
    "parse_bind_address",
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
#: Free TCP ports tried before giving up on one that is free for UDP too. A port the kernel hands
#: out for TCP is taken for UDP only by chance (a few in thousands), so a handful of tries suffices.
JOINT_PORT_ATTEMPTS = 16
#: Addresses of a loopback block that :func:`check_loopback_block` tries to bind before giving up.
LOOPBACK_CHECK_ATTEMPTS = 16
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
                          "full; give a larger block with --loopback-block, or one --bind-address")
    return ListenPlan(ip=ip, port=port, fallback=True)


def bind_socket(plan: ListenPlan, protocol: Protocol) -> socket.socket:
    """Create and bind a non-blocking socket for ``plan`` (the thin I/O step).

    ``bind_sockets(plan, [protocol])[protocol]``; see :func:`bind_sockets`.

    Raises:
        OSError: the address cannot be bound even on a free port (the socket is closed).
        ConfigError: ``protocol`` is SCTP, which the userspace mode does not serve.
    """
    return bind_sockets(plan, (protocol,))[protocol]


def bind_sockets(plan: ListenPlan, protocols: Sequence[Protocol]) -> dict[Protocol, socket.socket]:
    """Bind one non-blocking socket per protocol of one service port number, all on one port.

    ``plan.port`` is tried first (unless 0). When it cannot be bound for some protocol
    (EADDRINUSE, EACCES, EPERM) and ``plan.fallback`` is set, or when it is 0, a port free for
    every protocol is chosen: TCP is bound to port 0 and the others to the number it got, up to
    :data:`JOINT_PORT_ATTEMPTS` times. TCP sockets get SO_REUSEADDR (so a restarted proxy can
    rebind ports in TIME_WAIT, and a listening socket can join a holder, see
    :mod:`kproxy.modes.userspace.tcp`) and are left unlistened. UDP sockets are bound only.

    Args:
        plan: where to bind.
        protocols: TCP and/or UDP (duplicates are folded).

    Returns:
        ``{protocol: bound socket}``, every socket on the same port; read it with ``getsockname()``.

    Raises:
        OSError: the address cannot be bound, or no port free for all protocols was found
            (nothing is left open).
        ConfigError: a protocol is SCTP, which the userspace mode does not serve.
        InvalidArgument: ``protocols`` is empty.
    """
    order = sorted(set(protocols), key=lambda p: (p is not Protocol.TCP, str(p)))
    if not order:
        raise InvalidArgument(f"bind_sockets needs at least one protocol, got {protocols=}")
    if Protocol.SCTP in order:
        raise ConfigError("the userspace proxy serves TCP and UDP only; SCTP ports are skipped")
    if plan.port:
        try:
            return _bind_all(plan.ip, plan.port, order)
        except OSError as exc:
            if not (plan.fallback and exc.errno in _PORT_FALLBACK_ERRNOS):
                raise
    first, rest = order[0], order[1:]
    for _ in range(JOINT_PORT_ATTEMPTS):
        head = _bind_one(plan.ip, 0, first)
        port = int(head.getsockname()[1])
        try:
            tail = _bind_all(plan.ip, port, rest)
        except OSError as exc:
            head.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            continue
        return {first: head, **tail}
    names = "/".join(str(p) for p in order)
    raise OSError(errno.EADDRINUSE, f"no port on {plan.ip} free for {names} in {JOINT_PORT_ATTEMPTS} tries")


def _bind_all(ip: str, port: int, protocols: Sequence[Protocol]) -> dict[Protocol, socket.socket]:
    out: dict[Protocol, socket.socket] = {}
    try:
        for protocol in protocols:
            out[protocol] = _bind_one(ip, port, protocol)
    except BaseException:
        for sock in out.values():
            sock.close()
        raise
    return out


def _bind_one(ip: str, port: int, protocol: Protocol) -> socket.socket:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    kind = socket.SOCK_STREAM if protocol is Protocol.TCP else socket.SOCK_DGRAM
    sock = socket.socket(family, kind)
    try:
        sock.setblocking(False)
        if protocol is Protocol.TCP:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((ip, port))
    except BaseException:
        sock.close()
        raise
    return sock


def parse_bind_address(address: str) -> str:
    """Validate a ``bind_address`` without I/O and return it in canonical form.

    Raises:
        ConfigError: ``address`` is not an IP address, or is the wildcard (``0.0.0.0``, ``::``).
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ConfigError(f"--bind-address must be an IP address such as 127.0.0.1, got {address=}") from None
    if ip.is_unspecified:
        raise ConfigError("--bind-address must be a specific address; a wildcard cannot answer UDP from the "
                          f"address the client used (got {address=})")
    return str(ip)


def check_bind_address(address: str) -> None:
    """Check that ``address`` can serve as the userspace proxy's ``bind_address`` (at start-up).

    It must be a specific IP address (not the wildcard) that this host can bind, TCP and UDP.

    Raises:
        ConfigError: ``address`` is not an IP address, is the wildcard, or cannot be bound (for
            example it is not an address of this host); the message names it and the OS error.
    """
    ip = parse_bind_address(address)
    try:
        socks = bind_sockets(ListenPlan(ip=ip, port=0, fallback=False), (Protocol.TCP, Protocol.UDP))
    except OSError as exc:
        raise ConfigError(f"--bind-address {ip} cannot be bound ({exc.strerror or exc}); give an address "
                          "of this host, e.g. 127.0.0.1 or the node IP") from exc
    for sock in socks.values():
        sock.close()


def check_loopback_block(cidr: str) -> None:
    """Check that the userspace proxy can listen in ``cidr`` (at start-up).

    The block must be an IPv4 CIDR with an address that is handed out (not the network,
    ``127.0.0.1`` or the broadcast address) and that this host can bind. Up to
    :data:`LOOPBACK_CHECK_ATTEMPTS` such addresses are tried, from the start of the block.

    Raises:
        ConfigError: ``cidr`` is not an IPv4 CIDR, hands out no address, or none of the addresses
            tried can be bound (the block is not routed to this host).
    """
    net = _parse_block(cidr)
    tried: list[str] = []
    last: OSError | None = None
    for addr in net:
        if len(tried) >= LOOPBACK_CHECK_ATTEMPTS:
            break
        if not _usable(net, addr):
            continue
        tried.append(str(addr))
        try:
            bind_socket(ListenPlan(ip=str(addr), port=0, fallback=False), Protocol.TCP).close()
        except OSError as exc:
            last = exc
            continue
        return
    if not tried:
        raise ConfigError(f"--loopback-block {cidr} hands out no address (the network, 127.0.0.1 and the "
                          "broadcast address are never used); give a larger block such as 127.0.0.0/8")
    reason = last.strerror if last is not None and last.strerror else str(last)
    shown = ", ".join(tried[:3]) + (", ..." if len(tried) > 3 else "")
    raise ConfigError(f"--loopback-block {cidr}: none of {shown} "
                      f"can be bound ({reason}); give a block this host owns, such as 127.0.0.0/8")


def split_host_port(address: str) -> tuple[str, int]:
    """Split ``ip:port`` or ``[ip]:port`` (Go's ``net.SplitHostPort``) into ``(ip, port)``.

    Raises:
        ValueError: ``address`` has no port or a port that is not a number.
    """
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"expected 'ip:port' or '[ip]:port', got {address=}")
    return host.strip("[]"), int(port)
