"""The basic matches ``[!] -s -d -i -o -p`` (ipt_ip in net/ipv4/netfilter/ip_tables.c: ip_packet_match).

They are tested before any match module and never have side effects, so an evaluator may skip
a rule whose basic match is known to fail without changing counters or state.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.addr import Cidr
from emulation.netfilter.context import Ctx
from emulation.netfilter.matches.base import PROTO_NUMBERS, Match, Pred, neg_word

__all__ = ["AddressMatch", "InterfaceMatch", "ProtoMatch"]


@dataclass(frozen=True, slots=True)
class AddressMatch(Match):
    """``[!] -s CIDR`` / ``[!] -d CIDR``: prefix containment of the current address."""

    side: str  # "s" or "d"
    cidr: Cidr
    negated: bool = False

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        value = ctx.src if self.side == "s" else ctx.dst
        return self.cidr.contains(ctx.version, value) != self.negated

    def compile(self, uid: int) -> Pred | None:
        v, net, mask, neg = self.cidr.version, self.cidr.network, self.cidr.mask, self.negated
        if self.side == "s":
            if neg:
                return lambda ctx: not (ctx.version == v and ctx.src & mask == net)
            return lambda ctx: ctx.version == v and ctx.src & mask == net
        if neg:
            return lambda ctx: not (ctx.version == v and ctx.dst & mask == net)
        return lambda ctx: ctx.version == v and ctx.dst & mask == net

    def save_args(self) -> list[str]:
        return [*neg_word(self.negated), f"-{self.side}", str(self.cidr)]


@dataclass(frozen=True, slots=True)
class InterfaceMatch(Match):
    """``[!] -i NAME`` / ``[!] -o NAME``; a trailing ``+`` matches any name with that prefix."""

    side: str  # "i" or "o"
    name: str
    negated: bool = False

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        dev = ctx.iif if self.side == "i" else ctx.oif
        if dev is None:
            # No such interface on this hook (e.g. -i in OUTPUT): ip_tables compares with "".
            hit = self.name == "+"
        elif self.name.endswith("+"):
            hit = dev.startswith(self.name[:-1])
        else:
            hit = dev == self.name
        return hit != self.negated

    def compile(self, uid: int) -> Pred | None:
        name, neg = self.name, self.negated
        if name.endswith("+"):
            return Match.compile(self, uid)
        # An exact name never equals a missing interface (None), as test() finds.
        if self.side == "i":
            return lambda ctx: (ctx.iif == name) != neg
        return lambda ctx: (ctx.oif == name) != neg

    def save_args(self) -> list[str]:
        return [*neg_word(self.negated), f"-{self.side}", self.name]


@dataclass(frozen=True, slots=True)
class ProtoMatch(Match):
    """``[!] -p PROTO`` (name or number; ``all``/``0`` matches every protocol)."""

    proto: str
    negated: bool = False

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if self.proto in ("all", "0"):
            hit = True
        else:
            want = PROTO_NUMBERS.get(self.proto)
            have = PROTO_NUMBERS[ctx.proto if ctx.proto != "icmp" or ctx.version == 4 else "icmpv6"]
            hit = (want if want is not None else int(self.proto)) == have
        return hit != self.negated

    def compile(self, uid: int) -> Pred | None:
        proto, neg = self.proto, self.negated
        if proto in ("all", "0"):
            return (lambda ctx: False) if neg else None
        if proto in ("tcp", "udp", "sctp"):
            # Only a packet of that protocol has its number (icmp maps to 1 or 58).
            if neg:
                return lambda ctx: ctx.proto != proto
            return lambda ctx: ctx.proto == proto
        return Match.compile(self, uid)

    def save_args(self) -> list[str]:
        return [*neg_word(self.negated), "-p", self.proto]
