"""Set types: how an element is written, parsed, stored and matched against a packet.

An element is stored as a tuple of *parts*; each part is ``("ip", version, int)``,
``("net", version, int, prefix)`` or ``("port", proto, port)``. A packet key (one per
``src``/``dst`` flag of ``-m set``) is ``(ip_text, port, protocol)``, as the netfilter model's
``SetLookup`` hands it over. Per ``net/netfilter/ipset/ip_set_core.c`` ``ip_set_test``, a
match with fewer flags than the type has dimensions never matches; extra flags are ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass

from emulation.ipset.errors import IpsetError

__all__ = ["TYPES", "Part", "SetType", "format_element", "parse_element"]

Part = tuple[object, ...]
_BITS = {4: 32, 6: 128}
#: protocols an ``ip,port`` element may name (``ipset``'s ``proto:port``).
_PORT_PROTOS = ("tcp", "udp", "sctp", "udplite")
#: the most elements one ``add`` of a range or CIDR may expand to (ipset refuses huge ranges too).
MAX_EXPAND = 65536


@dataclass(frozen=True, slots=True)
class SetType:
    """A set type: its name and the kind of each dimension (``ip``, ``port`` or ``net``)."""

    name: str
    dims: tuple[str, ...]

    @property
    def is_bitmap(self) -> bool:
        """``bitmap:*`` types have a fixed range and no family."""
        return self.name.startswith("bitmap:")


TYPES: dict[str, SetType] = {
    "hash:ip": SetType("hash:ip", ("ip",)),
    "hash:ip,port": SetType("hash:ip,port", ("ip", "port")),
    "hash:ip,port,ip": SetType("hash:ip,port,ip", ("ip", "port", "ip")),
    "hash:ip,port,net": SetType("hash:ip,port,net", ("ip", "port", "net")),
    "hash:net": SetType("hash:net", ("net",)),
    "bitmap:port": SetType("bitmap:port", ("port",)),
}


def _ip(text: str, family: int) -> Iterator[Part]:
    """An address, ``a-b`` range or ``a/n`` CIDR (expanded) of the set's family."""
    try:
        if "/" in text:
            net = ipaddress.ip_network(text, strict=False)
            first, last = int(net.network_address), int(net.broadcast_address)
            version = net.version
        elif "-" in text:
            a, b = (ipaddress.ip_address(x) for x in text.split("-", 1))
            if a.version != b.version or int(b) < int(a):
                raise ValueError
            first, last, version = int(a), int(b), a.version
        else:
            ip = ipaddress.ip_address(text)
            first = last = int(ip)
            version = ip.version
    except ValueError:
        raise IpsetError(f"invalid IP {text!r}") from None
    if version != family:
        raise IpsetError(f"{text!r} is not of the set's family (inet{'6' if family == 6 else ''})")
    if last - first >= MAX_EXPAND:
        raise IpsetError(f"range {text!r} has more than {MAX_EXPAND} addresses")
    for v in range(first, last + 1):
        yield ("ip", version, v)


def _net(text: str, family: int) -> Part:
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise IpsetError(f"invalid network {text!r}") from None
    if net.version != family:
        raise IpsetError(f"{text!r} is not of the set's family")
    if net.prefixlen == 0:
        raise IpsetError(f"{text!r}: a /0 network cannot be stored in a hash:net set")
    return ("net", net.version, int(net.network_address), net.prefixlen)


def _port(text: str, *, with_proto: bool) -> Iterator[Part]:
    proto = "tcp"
    if with_proto and ":" in text:
        proto, _, text = text.partition(":")
        proto = proto.lower()
        if proto not in _PORT_PROTOS:
            raise IpsetError(f"protocol {proto!r} is not modelled; expected one of {_PORT_PROTOS}")
    first_t, _, last_t = text.partition("-")
    last_t = last_t or first_t
    if not (first_t.isdigit() and last_t.isdigit()) or int(last_t) > 65535 or int(first_t) > int(last_t):
        raise IpsetError(f"invalid port {text!r}")
    for p in range(int(first_t), int(last_t) + 1):
        yield ("port", proto if with_proto else "", p)


def parse_element(stype: SetType, text: str, family: int) -> list[tuple[Part, ...]]:
    """All elements one ``add``/``del``/``test`` argument stands for (ranges expanded).

    Raises:
        IpsetError: the text does not fit the type (wrong number of parts, bad address ...).
    """
    pieces = text.split(",")
    if len(pieces) != len(stype.dims):
        raise IpsetError(f"element {text!r} does not fit {stype.name} ({len(stype.dims)} parts)")
    options: list[list[Part]] = []
    for dim, piece in zip(stype.dims, pieces, strict=True):
        if dim == "ip":
            options.append(list(_ip(piece, family)))
        elif dim == "net":
            options.append([_net(piece, family)])
        else:
            options.append(list(_port(piece, with_proto=not stype.is_bitmap)))
    out: list[tuple[Part, ...]] = [()]
    for opts in options:
        out = [(*e, o) for e in out for o in opts]
        if len(out) > MAX_EXPAND:
            raise IpsetError(f"element {text!r} expands to more than {MAX_EXPAND} entries")
    return out


def format_element(elem: tuple[Part, ...]) -> str:
    """The element as ``ipset save`` prints it (``10.0.0.1,tcp:80``; a host network without ``/``)."""
    out = []
    for part in elem:
        kind = part[0]
        if kind == "ip":
            value = part[2]
            assert isinstance(value, int)
            out.append(str(ipaddress.ip_address(value)))
        elif kind == "net":
            version, value, prefix = part[1], part[2], part[3]
            assert isinstance(version, int) and isinstance(value, int)
            addr = str(ipaddress.ip_address(value))
            out.append(addr if prefix == _BITS[version] else f"{addr}/{prefix}")
        else:
            proto, port = part[1], part[2]
            out.append(f"{proto}:{port}" if proto else str(port))
    return ",".join(out)
