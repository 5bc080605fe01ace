"""nft data types: how a value is read from nft text and printed back, as intervals of integers.

Every value is kept as a :data:`Key`, an inclusive interval ``(low, high)`` of unsigned
integers: a host address or a port is ``(v, v)``, a prefix or a range its bounds. Printing
follows nft's ``datatype_print`` for each type (``src/datatype.c``): IPv4/IPv6 prefixes as
``a/len``, other intervals as ``a-b``; ``inet_proto`` by name (``tcp``); ports in decimal
(``nft`` without ``-S``); marks as ``0x%08x``; interface names quoted. How many elements one
line of a set's listing holds is ``calculate_delim`` in ``src/expression.c`` (:data:`PER_LINE`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum

from emulation.addr import format_address, parse_address
from emulation.errors import InputError

__all__ = [
    "PER_LINE",
    "PROTO_NAMES",
    "TYPE_BITS",
    "Datum",
    "Key",
    "Verdict",
    "VerdictKind",
    "format_key",
    "parse_key",
]

#: An inclusive interval of a type's values, as unsigned integers.
Key = tuple[int, int]

#: Width in bits of each type this model knows.
TYPE_BITS: dict[str, int] = {
    "ipv4_addr": 32,
    "ipv6_addr": 128,
    "inet_proto": 8,
    "inet_service": 16,
    "mark": 32,
    "ifname": 128,
    "nf_proto": 8,
    "integer": 32,
    "ether_type": 16,
}

#: Elements per line in a named set's listing, by key type (``calculate_delim``); a type not
#: here (a concatenation, an IPv6 address) gets one per line.
PER_LINE: dict[str, int] = {"ipv4_addr": 2, "inet_proto": 16, "inet_service": 16, "mark": 16, "integer": 16}

#: ``/etc/protocols`` names nft prints for ``inet_proto`` values.
PROTO_NAMES: dict[int, str] = {
    1: "icmp",
    2: "igmp",
    6: "tcp",
    17: "udp",
    58: "ipv6-icmp",
    132: "sctp",
    136: "udplite",
    33: "dccp",
}
_PROTO_NUMBERS = {name: number for number, name in PROTO_NAMES.items()} | {"icmpv6": 58}
_NFPROTO = {"ipv4": 2, "ipv6": 10}
_NFPROTO_NAMES = {v: k for k, v in _NFPROTO.items()}


class VerdictKind(StrEnum):
    """nftables verdicts (``NF_ACCEPT``, ``NF_DROP``, ``NFT_CONTINUE``, ``NFT_RETURN``, ``NFT_JUMP``,
    ``NFT_GOTO``)."""

    ACCEPT = "accept"
    DROP = "drop"
    CONTINUE = "continue"
    RETURN = "return"
    JUMP = "jump"
    GOTO = "goto"


@dataclass(frozen=True, slots=True)
class Verdict:
    """A verdict; ``chain`` is the target of a ``jump`` or ``goto`` (else ``None``)."""

    kind: VerdictKind
    chain: str | None = None

    def __str__(self) -> str:
        return f"{self.kind} {self.chain}" if self.chain is not None else str(self.kind)


#: A map element's data: a verdict, or a value (one key part per concatenated data type).
Datum = Verdict | tuple[Key, ...]


def _ifname(text: str) -> int:
    raw = text.encode()
    if len(raw) > 15:
        raise InputError(f"interface name {text!r} is longer than 15 bytes (IFNAMSIZ)")
    return int.from_bytes(raw.ljust(16, b"\0"), "big")


def _address_key(kind: str, text: str) -> Key:
    version = 4 if kind == "ipv4_addr" else 6
    try:
        if "/" in text:
            net = ipaddress.ip_network(text, strict=False)
            if net.version != version:
                raise ValueError
            return int(net.network_address), int(net.broadcast_address)
        if "-" in text:
            lo, _, hi = text.partition("-")
            lv, low = parse_address(lo)
            hv, high = parse_address(hi)
            if lv != version or hv != version or high < low:
                raise ValueError
            return low, high
        v, value = parse_address(text)
        if v != version:
            raise ValueError
        return value, value
    except (ValueError, InputError):
        raise InputError(f"{text!r} is not an {kind} value (an address, a prefix or a range)") from None


def _number(text: str, bits: int, kind: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise InputError(f"{text!r} is not an {kind} value (a number)") from None
    if not 0 <= value < 1 << bits:
        raise InputError(f"{text!r} is out of range for {kind} ({bits} bits)")
    return value


def _scalar(kind: str, text: str) -> int:
    if kind == "inet_proto":
        if text in _PROTO_NUMBERS:
            return _PROTO_NUMBERS[text]
        return _number(text, 8, kind)
    if kind == "nf_proto":
        if text not in _NFPROTO:
            raise InputError(f"{text!r} is not an nf_proto value (ipv4 or ipv6)")
        return _NFPROTO[text]
    if kind == "ifname":
        return _ifname(text.strip('"'))
    return _number(text, TYPE_BITS[kind], kind)


def parse_key(kind: str, text: str) -> Key:
    """Read one value of type ``kind`` (``ipv4_addr``, ``inet_service``, ...) from nft text:
    a single value, a range ``a-b`` or, for addresses, a prefix ``a/len``.

    Raises:
        InputError: an unknown type, or text that is not a value of it.
    """
    if kind not in TYPE_BITS:
        raise InputError(f"unknown data type {kind!r}; known: {', '.join(TYPE_BITS)}")
    if kind in ("ipv4_addr", "ipv6_addr"):
        return _address_key(kind, text)
    if kind != "ifname" and "-" in text[1:] and not (kind == "inet_proto" and text in _PROTO_NUMBERS):
        lo, _, hi = text.partition("-")
        low, high = _scalar(kind, lo), _scalar(kind, hi)
        if high < low:
            raise InputError(f"range {text!r} is empty: its end is below its start")
        return low, high
    value = _scalar(kind, text)
    return value, value


def _format_scalar(kind: str, value: int) -> str:
    if kind == "inet_proto":
        return PROTO_NAMES.get(value, str(value))
    if kind == "nf_proto":
        return _NFPROTO_NAMES.get(value, str(value))
    if kind == "mark":
        return f"0x{value:08x}"
    if kind == "ifname":
        return '"' + value.to_bytes(16, "big").rstrip(b"\0").decode() + '"'
    return str(value)


def format_key(kind: str, key: Key) -> str:
    """The text nft prints for ``key`` of type ``kind`` (see the module docstring)."""
    low, high = key
    if kind in ("ipv4_addr", "ipv6_addr"):
        version = 4 if kind == "ipv4_addr" else 6
        if low == high:
            return format_address(version, low)
        size = high - low + 1
        bits = TYPE_BITS[kind]
        if size & (size - 1) == 0 and low % size == 0:
            return f"{format_address(version, low)}/{bits - (size.bit_length() - 1)}"
        return f"{format_address(version, low)}-{format_address(version, high)}"
    if low == high:
        return _format_scalar(kind, low)
    return f"{_format_scalar(kind, low)}-{_format_scalar(kind, high)}"
