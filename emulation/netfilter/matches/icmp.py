"""``-m icmp --icmp-type`` (IPv4) and ``-m icmp6 --icmpv6-type`` (IPv6).

Parsing follows ``parse_icmp``/``parse_icmpv6`` in iptables' extensions/libipt_icmp.c and
libip6t_icmp6.c: a word is looked up in the type-name table (``libxt_icmp.h``) as a
case-insensitive prefix of each name in table order, and more than one hit is an "Ambiguous"
error; otherwise it is ``TYPE`` or ``TYPE/CODE``, numbers 0-255 read like C ``strtoul`` with
base 0 (``0x8`` and ``010`` are both 8). A name gives its table code range, a bare number
the codes 0-255, ``TYPE/CODE`` that one code.

The save text is numeric, as ``icmp_save``/``icmp6_save`` print it: ``TYPE`` and, unless the
codes are 0-255, ``/CODE_MIN``. IPv4 type 255 is the wildcard and saves as ``any`` (checked
against iptables-save and ip6tables-save 1.8.9, nf_tables and legacy).

The kernel matches ``type == T and CMIN <= code <= CMAX``, XOR the ``!`` flag; IPv4 type 255
matches every ICMP packet (``icmp_type_code_match`` in net/ipv4/netfilter/ip_tables.c; IPv6
has no wildcard, ``icmp6_type_code_match`` in net/ipv6/netfilter/ip6_tables.c).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from emulation.errors import NetfilterError
from emulation.netfilter.context import Ctx
from emulation.netfilter.matches.base import Match, neg_word

__all__ = ["ICMPV6_NAMES", "ICMP_NAMES", "Icmp", "parse_icmp_type"]

_ALL = (0, 0xFF)

#: ``icmp_codes`` of libxt_icmp.h, in table order: name -> (type, (code_min, code_max)).
ICMP_NAMES: tuple[tuple[str, int, tuple[int, int]], ...] = (
    ("any", 0xFF, _ALL),
    ("echo-reply", 0, _ALL),
    ("pong", 0, _ALL),
    ("destination-unreachable", 3, _ALL),
    ("network-unreachable", 3, (0, 0)),
    ("host-unreachable", 3, (1, 1)),
    ("protocol-unreachable", 3, (2, 2)),
    ("port-unreachable", 3, (3, 3)),
    ("fragmentation-needed", 3, (4, 4)),
    ("source-route-failed", 3, (5, 5)),
    ("network-unknown", 3, (6, 6)),
    ("host-unknown", 3, (7, 7)),
    ("network-prohibited", 3, (9, 9)),
    ("host-prohibited", 3, (10, 10)),
    ("TOS-network-unreachable", 3, (11, 11)),
    ("TOS-host-unreachable", 3, (12, 12)),
    ("communication-prohibited", 3, (13, 13)),
    ("host-precedence-violation", 3, (14, 14)),
    ("precedence-cutoff", 3, (15, 15)),
    ("source-quench", 4, _ALL),
    ("redirect", 5, _ALL),
    ("network-redirect", 5, (0, 0)),
    ("host-redirect", 5, (1, 1)),
    ("TOS-network-redirect", 5, (2, 2)),
    ("TOS-host-redirect", 5, (3, 3)),
    ("echo-request", 8, _ALL),
    ("ping", 8, _ALL),
    ("router-advertisement", 9, _ALL),
    ("router-solicitation", 10, _ALL),
    ("time-exceeded", 11, _ALL),
    ("ttl-exceeded", 11, _ALL),
    ("ttl-zero-during-transit", 11, (0, 0)),
    ("ttl-zero-during-reassembly", 11, (1, 1)),
    ("parameter-problem", 12, _ALL),
    ("ip-header-bad", 12, (0, 0)),
    ("required-option-missing", 12, (1, 1)),
    ("timestamp-request", 13, _ALL),
    ("timestamp-reply", 14, _ALL),
    ("address-mask-request", 17, _ALL),
    ("address-mask-reply", 18, _ALL),
)

#: ``icmpv6_codes`` of libxt_icmp.h, in table order.
ICMPV6_NAMES: tuple[tuple[str, int, tuple[int, int]], ...] = (
    ("destination-unreachable", 1, _ALL),
    ("no-route", 1, (0, 0)),
    ("communication-prohibited", 1, (1, 1)),
    ("beyond-scope", 1, (2, 2)),
    ("address-unreachable", 1, (3, 3)),
    ("port-unreachable", 1, (4, 4)),
    ("failed-policy", 1, (5, 5)),
    ("reject-route", 1, (6, 6)),
    ("packet-too-big", 2, _ALL),
    ("time-exceeded", 3, _ALL),
    ("ttl-exceeded", 3, _ALL),
    ("ttl-zero-during-transit", 3, (0, 0)),
    ("ttl-zero-during-reassembly", 3, (1, 1)),
    ("parameter-problem", 4, _ALL),
    ("bad-header", 4, (0, 0)),
    ("unknown-header-type", 4, (1, 1)),
    ("unknown-option", 4, (2, 2)),
    ("echo-request", 128, _ALL),
    ("ping", 128, _ALL),
    ("echo-reply", 129, _ALL),
    ("pong", 129, _ALL),
    ("router-solicitation", 133, _ALL),
    ("router-advertisement", 134, _ALL),
    ("neighbour-solicitation", 135, _ALL),
    ("neighbor-solicitation", 135, _ALL),
    ("neighbour-advertisement", 136, _ALL),
    ("neighbor-advertisement", 136, _ALL),
    ("redirect", 137, _ALL),
)

#: The type of the one ICMP packet the emulator sends: an echo request, with code 0.
_ECHO_REQUEST = {4: 8, 6: 128}


def _c_uint8(text: str) -> int | None:
    """``strtoul(text, &end, 0)`` that must use all of ``text`` and give 0-255, else ``None``."""
    for pattern, base in ((r"0[xX]([0-9a-fA-F]+)", 16), (r"0([0-7]+)", 8), (r"([0-9]+)", 10)):
        found = re.fullmatch(pattern, text, re.ASCII)
        if found:
            value = int(found.group(1), base)
            return value if value <= 0xFF else None
    return None


def parse_icmp_type(text: str, version: int) -> tuple[int, tuple[int, int]]:
    """``--icmp-type``/``--icmpv6-type`` text -> ``(type, (code_min, code_max))``.

    Raises:
        NetfilterError: an ambiguous name prefix, or a type or code that is not 0-255.
    """
    table = ICMP_NAMES if version == 4 else ICMPV6_NAMES
    what = "ICMP" if version == 4 else "ICMPv6"
    hits = [row for row in table if text and row[0].lower().startswith(text.lower())]
    if len(hits) > 1:
        raise NetfilterError(f"Ambiguous {what} type {text!r}: {hits[0][0]!r} or {hits[1][0]!r}?")
    if hits:
        return hits[0][1], hits[0][2]
    type_s, slash, code_s = text.partition("/")
    type_ = _c_uint8(type_s)
    if type_ is None:
        raise NetfilterError(f"invalid {what} type {type_s!r}; expected a name or a number 0-255")
    if not slash:
        return type_, _ALL
    code = _c_uint8(code_s)
    if code is None:
        raise NetfilterError(f"invalid {what} code {code_s!r} in {text!r}; expected TYPE/CODE, numbers 0-255")
    return type_, (code, code)


@dataclass(frozen=True, slots=True)
class Icmp(Match):
    """``-m icmp [!] --icmp-type`` or ``-m icmp6 [!] --icmpv6-type``, parsed to numbers.

    The emulated ICMP packet is always an echo request with code 0 (type 8, or 128 for IPv6).
    """

    type_: int
    codes: tuple[int, int] = _ALL
    negated: bool = False
    version: int = 4

    @property
    def module(self) -> str:  # type: ignore[override]
        return "icmp" if self.version == 4 else "icmp6"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if ctx.proto != "icmp":
            return False
        wildcard = self.version == 4 and self.type_ == 0xFF
        hit = wildcard or (self.type_ == _ECHO_REQUEST[self.version] and self.codes[0] == 0)
        return hit != self.negated

    def save_args(self) -> list[str]:
        if self.version == 4 and self.type_ == 0xFF:
            value = "any"
        else:
            value = str(self.type_) if self.codes == _ALL else f"{self.type_}/{self.codes[0]}"
        option = "--icmp-type" if self.version == 4 else "--icmpv6-type"
        return [*neg_word(self.negated), option, value]
