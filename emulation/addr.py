"""IP addresses and prefixes as integers, for fast matching.

An address is ``(version, value)`` with version 4 or 6 and ``value`` the address as an unsigned
integer. A :class:`Cidr` keeps its network already masked, as iptables does when it parses
``-s 10.1.2.3/8`` (it stores and prints ``10.0.0.0/8``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from functools import lru_cache

from emulation.errors import NetfilterError

__all__ = ["Cidr", "format_address", "parse_address", "parse_cidr"]

_BITS = {4: 32, 6: 128}


#: Parsed addresses, emptied when it reaches :data:`_MEMO_LIMIT` entries. A plain dict
#: rather than ``lru_cache``: a hit there also relinks the LRU list, three more scattered
#: memory accesses per packet that show at 10,000 Services.
_parsed: dict[str, tuple[int, int]] = {}
_MEMO_LIMIT = 1 << 18


def parse_address(text: str) -> tuple[int, int]:
    """Parse ``"10.0.0.1"`` or ``"fd00::1"`` into ``(version, int)`` (memoized; a pure function).

    Raises:
        NetfilterError: the text is not an IPv4 or IPv6 address.
    """
    found = _parsed.get(text)
    if found is None:
        found = _parse_address(text)
        if len(_parsed) >= _MEMO_LIMIT:
            _parsed.clear()
        _parsed[text] = found
    return found


def _parse_address(text: str) -> tuple[int, int]:
    parts = text.split(".")
    if len(parts) == 4:
        value = 0
        for part in parts:
            # Canonical decimal octets only (no sign, no leading zero); anything else goes to
            # ipaddress, which decides and words the error.
            if not (part.isascii() and part.isdigit() and len(part) <= 3) or (
                len(part) > 1 and part[0] == "0"
            ):
                break
            octet = int(part)
            if octet > 255:
                break
            value = value << 8 | octet
        else:
            return 4, value
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise NetfilterError(f"invalid IP address {text!r}; expected e.g. 10.0.0.1 or fd00::1") from None
    return ip.version, int(ip)


@lru_cache(maxsize=1 << 16)
def format_address(version: int, value: int) -> str:
    """The canonical text of an address (``ipaddress`` compression for IPv6)."""
    if version == 4 and 0 <= value <= 0xFFFFFFFF:
        return f"{value >> 24}.{value >> 16 & 255}.{value >> 8 & 255}.{value & 255}"
    return str(ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value))


@dataclass(frozen=True, slots=True)
class Cidr:
    """A prefix: ``version``, masked ``network`` integer, ``prefix`` length in bits; ``mask`` derived."""

    version: int
    network: int
    prefix: int
    mask: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        bits = _BITS[self.version]
        object.__setattr__(self, "mask", ((1 << bits) - 1) ^ ((1 << (bits - self.prefix)) - 1))

    def contains(self, version: int, value: int) -> bool:
        """Whether the address ``(version, value)`` lies inside this prefix."""
        return version == self.version and (value & self.mask) == self.network

    @property
    def is_host(self) -> bool:
        """True for a /32 (IPv4) or /128 (IPv6) prefix."""
        return self.prefix == _BITS[self.version]

    def __str__(self) -> str:
        return f"{format_address(self.version, self.network)}/{self.prefix}"


@lru_cache(maxsize=1 << 18)
def parse_cidr(text: str) -> Cidr:
    """Parse ``"10.0.0.0/8"``, ``"10.0.0.0/255.0.0.0"`` or a bare host address.

    Host bits are cleared (``10.1.2.3/8`` becomes ``10.0.0.0/8``), as iptables does.

    Raises:
        NetfilterError: not an address, or a bad prefix length or netmask.
    """
    addr, _, plen = text.partition("/")
    version, value = parse_address(addr)
    bits = _BITS[version]
    if not plen:
        prefix = bits
    elif plen.isdigit():
        prefix = int(plen)
        if prefix > bits:
            raise NetfilterError(f"prefix length /{plen} is too long for IPv{version} in {text!r}")
    else:
        mversion, mvalue = parse_address(plen)
        inverted = ((1 << bits) - 1) ^ mvalue
        if mversion != version or inverted & (inverted + 1):
            raise NetfilterError(f"invalid netmask {plen!r} in {text!r}; expected a prefix length")
        prefix = bits - inverted.bit_length()
    mask = ((1 << bits) - 1) ^ ((1 << (bits - prefix)) - 1)
    return Cidr(version, value & mask, prefix)
