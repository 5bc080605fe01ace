"""A node: its interfaces and addresses, its routes, and the sysctls the data path reads.

Theory of operation: routing is a longest-prefix match over the connected routes derived from
interface addresses plus the explicit routes given (``default`` included). Local addresses are
every interface address and, as in the kernel's ``local`` table, all of ``127.0.0.0/8`` and
``::1``. :meth:`Node.address_type` follows ``inet_dev_addr_type`` (net/ipv4/fib_frontend.c): it
looks only at the local table, so an address is LOCAL, BROADCAST, MULTICAST or else UNICAST.

The address MASQUERADE picks (:meth:`Node.source_address`) follows ``inet_select_addr`` for
IPv4 (an address of the out interface) and ``ipv6_dev_get_saddr`` for IPv6 (RFC 6724 source
address selection over the addresses of every interface, unless the destination is link-local,
loopback or multicast; see :meth:`Node.source_address`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from emulation.addr import Cidr, format_address, parse_address, parse_cidr

__all__ = ["Interface", "Node", "Route", "RouteResult"]

RouteKind = Literal["local", "unicast", "broadcast", "multicast", "unreachable", "blackhole", "prohibit"]
_LOOPBACK4 = parse_cidr("127.0.0.0/8")
_MCAST4 = parse_cidr("224.0.0.0/4")
_MCAST6 = parse_cidr("ff00::/8")
_LINKLOCAL6 = parse_cidr("fe80::/10")
_SITELOCAL6 = parse_cidr("fec0::/10")
_LOOPBACK6 = (6, 1)
#: The kernel's default IPv6 address labels (net/ipv6/addrlabel.c, RFC 6724 section 2.1); the
#: longest matching prefix gives an address its label, and anything else (``::/0``) is label 1.
_LABELS6 = tuple(
    (parse_cidr(prefix), label)
    for prefix, label in (
        ("::1/128", 0),
        ("::ffff:0:0/96", 4),
        ("::/96", 3),
        ("2001::/32", 6),
        ("2001:10::/28", 7),
        ("2002::/16", 2),
        ("3ffe::/16", 12),
        ("fec0::/10", 11),
        ("fc00::/7", 5),
    )
)


def _scope6(value: int) -> int:
    """The scope of an IPv6 source address as ``__ipv6_addr_src_scope`` sees it (loopback 1,
    link-local 2, site-local 5, a multicast address its scope field, anything else global 14)."""
    if (6, value) == _LOOPBACK6:
        return 1
    if _MCAST6.contains(6, value):
        return value >> 112 & 0xF
    if _LINKLOCAL6.contains(6, value):
        return 2
    if _SITELOCAL6.contains(6, value):
        return 5
    return 14


def _label6(value: int) -> int:
    """The address's label in the default policy table; the longest matching prefix wins."""
    best, label = -1, 1
    for cidr, lab in _LABELS6:
        if cidr.prefix > best and cidr.contains(6, value):
            best, label = cidr.prefix, lab
    return label


def _common_prefix6(a: int, b: int) -> int:
    return 128 - (a ^ b).bit_length()


@dataclass(frozen=True, slots=True, kw_only=True)
class Interface:
    """A network interface: ``name`` and its ``addresses`` as CIDRs (``"192.168.0.2/24"``).

    The first address of a family is its primary address (what MASQUERADE prefers).

    Attributes:
        scopes: each address's scope as ``ip addr`` prints it (``global``, ``link``, ``host``),
            parallel to ``addresses``; when empty (or shorter), an address's scope is derived
            as the kernel gives it by default: ``host`` for 127.0.0.0/8 and ``::1``, ``link``
            for ``fe80::/10``, else ``global``.
        master: the bridge (or other master device) this interface is a port of, or ``None``.
        bridge: the interface is a bridge (``ip -d link``'s ``info_kind bridge``, or the master
            of another interface).
        up: the link is up; routes through a down link are not used (the kernel marks them
            ``linkdown``/dead).
    """

    name: str
    addresses: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    master: str | None = None
    bridge: bool = False
    up: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an interface needs a name")
        for a in self.addresses:
            parse_cidr(a)
        if len(self.scopes) > len(self.addresses):
            raise ValueError(f"interface {self.name}: more scopes than addresses")

    def scope(self, index: int) -> str:
        """The scope of ``addresses[index]`` (see ``scopes``)."""
        if index < len(self.scopes):
            return self.scopes[index]
        version, value = parse_address(self.addresses[index].partition("/")[0])
        if _LOOPBACK4.contains(version, value) or (version, value) == _LOOPBACK6:
            return "host"
        if _LINKLOCAL6.contains(version, value):
            return "link"
        return "global"


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """A route: ``destination`` CIDR or ``"default"``, out ``device``, optional gateway ``via``.

    ``kind`` may be ``unicast`` (default), ``blackhole``, ``unreachable`` or ``prohibit``.
    ``version`` chooses the family of a ``default`` route; an IPv6 ``destination`` or ``via``
    makes it 6 by itself. ``metric`` orders routes of the same prefix (the lowest wins, as
    ``fib6``/``fib_table_lookup`` prefer the lowest priority); ``prefsrc`` is the route's
    preferred source (``src`` in ``ip route``), what a socket on the node binds to when it
    sends without choosing.

    Raises:
        ValueError: ``version=6`` with an IPv4 destination or gateway, or families mixed.
    """

    destination: str
    device: str = ""
    via: str | None = None
    kind: Literal["unicast", "blackhole", "unreachable", "prohibit"] = "unicast"
    version: int = 4
    metric: int = 0
    prefsrc: str | None = None

    def __post_init__(self) -> None:
        families = set()
        if self.destination != "default":
            families.add(parse_cidr(self.destination).version)
        if self.via:
            families.add(parse_address(self.via)[0])
        if len(families) > 1:
            raise ValueError(f"route to {self.destination} via {self.via}: IPv4 and IPv6 mixed")
        if families and families != {self.version}:
            if self.version == 6:
                raise ValueError(f"route to {self.destination} via {self.via} is IPv4, not version=6")
            object.__setattr__(self, "version", 6)

    def cidr(self) -> Cidr:
        """The destination prefix (``default`` is ``0.0.0.0/0`` or ``::/0``)."""
        if self.destination == "default":
            return parse_cidr("0.0.0.0/0" if self.version == 4 else "::/0")
        return parse_cidr(self.destination)


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteResult:
    """A routing decision: ``kind``, the out ``device`` (``lo`` for local) and the ``nexthop``."""

    kind: RouteKind
    device: str | None
    nexthop: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """The node whose netfilter tables are emulated.

    Attributes:
        interfaces: its interfaces; ``lo`` (127.0.0.1/8, ::1/128) is added when missing.
        routes: routes besides the connected ones, e.g. ``Route(destination="default", ...)``.
        route_localnet: ``net.ipv4.conf.all.route_localnet``: allow 127.0.0.0/8 off ``lo``.
        local_prefixes: more local destinations (``local`` routes of the ``local`` table that
            are not an interface address, such as ``ip route add local 10.0.0.0/8 dev lo``).
        ip_forward: ``net.ipv4.ip_forward`` (and the IPv6 equivalent).
        tcp_loose: ``net.netfilter.nf_conntrack_tcp_loose``: pick up mid-stream TCP as NEW.
    """

    interfaces: tuple[Interface, ...] = ()
    routes: tuple[Route, ...] = ()
    route_localnet: bool = False
    ip_forward: bool = True
    tcp_loose: bool = True
    local_prefixes: tuple[str, ...] = ()
    _table: tuple[tuple[Cidr, RouteResult], ...] = field(default=(), init=False, repr=False, compare=False)
    _local: frozenset[tuple[int, int]] = field(default=frozenset(), init=False, repr=False, compare=False)
    _broadcast: frozenset[tuple[int, int]] = field(default=frozenset(), init=False, repr=False, compare=False)
    _local_nets: tuple[Cidr, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ifaces = self.interfaces
        if not any(i.name == "lo" for i in ifaces):
            ifaces = (Interface(name="lo", addresses=("127.0.0.1/8", "::1/128")), *ifaces)
            object.__setattr__(self, "interfaces", ifaces)
        names = [i.name for i in ifaces]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate interface names in {names}")
        local: set[tuple[int, int]] = set()
        bcast: set[tuple[int, int]] = set()
        table: list[tuple[Cidr, int, RouteResult]] = []
        down = {i.name for i in ifaces if not i.up}
        for iface in ifaces:
            for text in iface.addresses:
                host = parse_address(text.partition("/")[0])
                local.add(host)
                net = parse_cidr(text)
                if net.version == 4 and net.prefix < 31:
                    bcast.add((4, net.network | (net.mask ^ 0xFFFFFFFF)))
                if iface.name != "lo" and iface.up:
                    table.append((net, 0, RouteResult(kind="unicast", device=iface.name, nexthop=None)))
        for r in self.routes:
            if r.device and r.device not in names:
                raise ValueError(f"route {r.destination} uses unknown device {r.device!r}; have {names}")
            if r.device in down:
                continue
            table.append((r.cidr(), r.metric,
                          RouteResult(kind=r.kind, device=r.device or None, nexthop=r.via)))
        table.sort(key=lambda e: (-e[0].prefix, e[1]))
        object.__setattr__(self, "_table", tuple((c, res) for c, _, res in table))
        object.__setattr__(self, "_local_nets", tuple(parse_cidr(p) for p in self.local_prefixes))
        object.__setattr__(self, "_local", frozenset(local))
        object.__setattr__(self, "_broadcast", frozenset(bcast))

    def interface(self, name: str) -> Interface | None:
        """The interface called ``name``, or ``None``."""
        for i in self.interfaces:
            if i.name == name:
                return i
        return None

    def is_local(self, version: int, value: int) -> bool:
        """Whether the address is the node's own (interface addresses, 127.0.0.0/8, ::1)."""
        return ((version, value) in self._local or _LOOPBACK4.contains(version, value)
                or any(n.contains(version, value) for n in self._local_nets))

    def is_local_ip(self, ip: str) -> bool:
        """:meth:`is_local` for an address in text form."""
        return self.is_local(*parse_address(ip))

    def address_type(self, version: int, value: int, device: str | None = None) -> str:
        """The ``addrtype`` of an address: LOCAL, BROADCAST, MULTICAST or UNICAST.

        With ``device``, LOCAL/BROADCAST only count when the address belongs to that device
        (``--limit-iface-in/out``); 127.0.0.0/8 belongs to ``lo``.
        """
        if version == 4 and value in (0, 0xFFFFFFFF):
            return "BROADCAST"
        if _MCAST4.contains(version, value) or _MCAST6.contains(version, value):
            return "MULTICAST"
        if device is None:
            if self.is_local(version, value):
                return "LOCAL"
            return "BROADCAST" if (version, value) in self._broadcast else "UNICAST"
        iface = self.interface(device)
        if iface is None:
            return "UNICAST"
        for text in iface.addresses:
            if parse_address(text.partition("/")[0]) == (version, value):
                return "LOCAL"
            net = parse_cidr(text)
            if (
                version == 4 == net.version
                and net.prefix < 31
                and value == net.network | (net.mask ^ 0xFFFFFFFF)
            ):
                return "BROADCAST"
        if device == "lo" and _LOOPBACK4.contains(version, value):
            return "LOCAL"
        return "UNICAST"

    def route(self, version: int, value: int) -> RouteResult:
        """The routing decision for a destination (local, longest prefix match, or unreachable)."""
        if self.is_local(version, value):
            return RouteResult(kind="local", device="lo", nexthop=None)
        if (version, value) in self._broadcast:
            return RouteResult(kind="broadcast", device=None, nexthop=None)
        for cidr, result in self._table:
            if cidr.contains(version, value):
                return result
        return RouteResult(kind="unreachable", device=None, nexthop=None)

    def source_address(self, device: str, version: int, nexthop: str | None, dst: int) -> str | None:
        """The address MASQUERADE picks on ``device`` for destination ``dst``.

        IPv4, as ``inet_select_addr(dev, nexthop, RT_SCOPE_UNIVERSE)`` (net/ipv4/devinet.c),
        which ``nf_nat_masquerade_ipv4`` calls: among the device's addresses of global scope,
        the one in the same subnet as the next hop (or destination), else the first; a
        host-scope address (loopback's 127.0.0.1) or a link-scope one is never picked. When
        the device has none (a Calico ``cali*`` veth, or ``lo`` for a packet the node sends to
        itself), the first address of global scope of any interface, in interface order, so a
        node talking to itself keeps its own address; ``None`` when no interface has one.

        IPv6, as ``ipv6_dev_get_saddr`` (``nf_nat_masquerade_ipv6`` calls it with the packet's
        destination; the next hop plays no part): see :meth:`_source_address6`.
        """
        if version == 6:
            return self._source_address6(device, dst)
        iface = self.interface(device)
        if iface is None:
            return None
        target = parse_address(nexthop)[1] if nexthop else dst
        first: str | None = None
        for index, text in enumerate(iface.addresses):
            net = parse_cidr(text)
            if net.version != version or iface.scope(index) != "global":
                continue
            host = text.partition("/")[0]
            if first is None:
                first = host
            if net.contains(version, target):
                return host
        if first is None:  # inet_select_addr's no_in_dev walk over every device
            for other in self.interfaces:
                for index, text in enumerate(other.addresses):
                    if parse_cidr(text).version == 4 and other.scope(index) == "global":
                        return text.partition("/")[0]
        return first

    def primary_address(self, device: str, version: int) -> str | None:
        """The first address of ``version`` on ``device`` (REDIRECT uses it), or ``None``."""
        iface = self.interface(device)
        for text in iface.addresses if iface else ():
            v, value = parse_address(text.partition("/")[0])
            if v == version:
                return format_address(v, value)
        return None

    def _source_address6(self, device: str, dst: int) -> str | None:
        """RFC 6724 source address selection as Linux's ``ipv6_dev_get_saddr`` does it.

        Candidates are the IPv6 addresses of ``device`` when the destination is link-local,
        loopback or multicast, and of every interface otherwise (in interface order). The best
        candidate wins by these rules, in order (the kernel's numbering): 1 the destination
        itself; 2 a scope at least the destination's, the smallest such (else the largest);
        5 on ``device``; 6 the same label as the destination; 8 the longest prefix shared with
        the destination, counted at most to the candidate's prefix length. Rules 3, 4 and 7
        (deprecated, home and temporary addresses) never apply to the static addresses
        modelled here. On a full tie the first candidate stays. ``None`` when there is no
        candidate.
        """
        dst_scope = _scope6(dst)
        only_device = dst_scope <= 2 or _MCAST6.contains(6, dst)
        dst_label = _label6(dst)
        best: tuple[int, int, int, int, int] | None = None
        chosen: str | None = None
        for iface in self.interfaces:
            if only_device and iface.name != device:
                continue
            for text in iface.addresses:
                net = parse_cidr(text)
                if net.version != 6:
                    continue
                value = parse_address(text.partition("/")[0])[1]
                scope = _scope6(value)
                score = (
                    value == dst,
                    -scope if scope >= dst_scope else scope - 128,
                    iface.name == device,
                    _label6(value) == dst_label,
                    min(_common_prefix6(value, dst), net.prefix),
                )
                if best is None or score > best:
                    best, chosen = score, format_address(6, value)
        return chosen
