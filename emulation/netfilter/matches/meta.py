"""Matches on what the node knows besides the headers: the skb ``mark``, ``addrtype`` and ipset membership."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from emulation.addr import format_address
from emulation.netfilter.context import Ctx
from emulation.netfilter.matches.base import Match, Pred, neg_word

__all__ = ["ADDR_TYPES", "AddrType", "Mark", "SetMatch"]


@dataclass(frozen=True, slots=True)
class Mark(Match):
    """``-m mark [!] --mark V[/M]``: ``(nfmark & M) == V`` (xt_mark.c)."""

    value: int
    mask: int = 0xFFFFFFFF
    negated: bool = False
    module: ClassVar[str] = "mark"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        return ((ctx.mark & self.mask) == self.value) != self.negated

    def compile(self, uid: int) -> Pred | None:
        value, mask, neg = self.value, self.mask, self.negated
        return lambda ctx: (ctx.mark & mask == value) != neg

    def save_args(self) -> list[str]:
        text = f"{self.value:#x}" if self.mask == 0xFFFFFFFF else f"{self.value:#x}/{self.mask:#x}"
        return [*neg_word(self.negated), "--mark", text]


ADDR_TYPES = (
    "UNSPEC",
    "UNICAST",
    "LOCAL",
    "BROADCAST",
    "ANYCAST",
    "MULTICAST",
    "BLACKHOLE",
    "UNREACHABLE",
    "PROHIBIT",
    "THROW",
    "NAT",
    "XRESOLVE",
)


@dataclass(frozen=True, slots=True)
class AddrType(Match):
    """``-m addrtype [!] --src-type T,.. [!] --dst-type T,.. [--limit-iface-in|out]`` (xt_addrtype.c)."""

    src_types: frozenset[str] = frozenset()
    src_neg: bool = False
    dst_types: frozenset[str] = frozenset()
    dst_neg: bool = False
    limit_in: bool = False
    limit_out: bool = False
    module: ClassVar[str] = "addrtype"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        dev = ctx.iif if self.limit_in else ctx.oif if self.limit_out else None
        if self.src_types:
            t = ctx.node.address_type(ctx.version, ctx.src, dev)
            if (t in self.src_types) == self.src_neg:
                return False
        if self.dst_types:
            t = ctx.node.address_type(ctx.version, ctx.dst, dev)
            if (t in self.dst_types) == self.dst_neg:
                return False
        return True

    def save_args(self) -> list[str]:
        out: list[str] = []
        for types, neg, opt in (
            (self.src_types, self.src_neg, "--src-type"),
            (self.dst_types, self.dst_neg, "--dst-type"),
        ):
            if types:
                out += [*neg_word(neg), opt, ",".join(t for t in ADDR_TYPES if t in types)]
        if self.limit_in:
            out.append("--limit-iface-in")
        if self.limit_out:
            out.append("--limit-iface-out")
        return out


@dataclass(frozen=True, slots=True)
class SetMatch(Match):
    """``-m set [!] --match-set NAME FLAGS``: ipset membership through the pluggable lookup.

    Each flag (``src``/``dst``) gives one ``(ip, port, protocol)`` key; a missing lookup or set
    is unknown. Other options (``--return-nomatch`` ...) are kept for printing only.
    """

    name: str
    flags: tuple[str, ...]
    negated: bool = False
    extra: tuple[str, ...] = ()
    module: ClassVar[str] = "set"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if ctx.set_lookup is None:
            return None
        keys = tuple(
            (format_address(ctx.version, ctx.src), ctx.sport, ctx.proto)
            if f == "src"
            else (format_address(ctx.version, ctx.dst), ctx.dport, ctx.proto)
            for f in self.flags
        )
        hit = ctx.set_lookup(self.name, keys)
        return None if hit is None else hit != self.negated

    def save_args(self) -> list[str]:
        return [*neg_word(self.negated), "--match-set", self.name, ",".join(self.flags), *self.extra]
