"""Transport header matches: ``-m tcp|udp|sctp`` ports and flags, ``-m multiport`` (icmp: icmp.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from emulation.netfilter.context import Ctx
from emulation.netfilter.matches.base import Match, Pred, neg_word, port_text

__all__ = ["Multiport", "Ports"]


@dataclass(frozen=True, slots=True)
class Ports(Match):
    """``-m tcp|udp|sctp [!] --sport R [!] --dport R`` (xt_tcpudp.c, xt_sctp.c).

    ``--tcp-flags``/``--syn`` is modelled from :attr:`Packet.syn`: a SYN packet carries only
    SYN, any later packet only ACK.
    """

    proto: str
    sport: tuple[int, int] | None = None
    sport_neg: bool = False
    dport: tuple[int, int] | None = None
    dport_neg: bool = False
    flags: tuple[frozenset[str], frozenset[str]] | None = None
    flags_neg: bool = False

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if ctx.proto != self.proto:
            return False
        if self.sport is not None and (self.sport[0] <= ctx.sport <= self.sport[1]) == self.sport_neg:
            return False
        if self.dport is not None and (self.dport[0] <= ctx.dport <= self.dport[1]) == self.dport_neg:
            return False
        if self.flags is not None:
            have = frozenset({"SYN"} if ctx.syn else {"ACK"})
            mask, comp = self.flags
            if ((have & mask) == comp) == self.flags_neg:
                return False
        return True

    def compile(self, uid: int) -> Pred | None:
        proto, sport, dport = self.proto, self.sport, self.dport
        if self.flags is not None or self.sport_neg or self.dport_neg:
            return Match.compile(self, uid)
        if sport is None and dport is None:
            return lambda ctx: ctx.proto == proto
        if sport is None and dport is not None:
            lo, hi = dport
            if lo == hi:
                return lambda ctx: ctx.proto == proto and ctx.dport == lo
            return lambda ctx: ctx.proto == proto and lo <= ctx.dport <= hi
        return Match.compile(self, uid)

    def save_args(self) -> list[str]:
        out: list[str] = []
        if self.sport is not None:
            out += [*neg_word(self.sport_neg), "--sport", port_text(self.sport)]
        if self.dport is not None:
            out += [*neg_word(self.dport_neg), "--dport", port_text(self.dport)]
        if self.flags is not None:
            order = ("FIN", "SYN", "RST", "PSH", "ACK", "URG")
            mask, comp = (",".join(f for f in order if f in s) or "NONE" for s in self.flags)
            out += [*neg_word(self.flags_neg), "--tcp-flags", mask, comp]
        return out

    @property
    def module(self) -> str:  # type: ignore[override]
        return self.proto


@dataclass(frozen=True, slots=True)
class Multiport(Match):
    """``-m multiport [!] --sports|--dports|--ports LIST`` (xt_multiport.c, up to 15 ports)."""

    which: str  # "sports", "dports" or "ports"
    ranges: tuple[tuple[int, int], ...]
    negated: bool = False
    module: ClassVar[str] = "multiport"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if ctx.proto not in ("tcp", "udp", "sctp"):
            return False
        ports = {"sports": (ctx.sport,), "dports": (ctx.dport,), "ports": (ctx.sport, ctx.dport)}[self.which]
        hit = any(lo <= p <= hi for p in ports for lo, hi in self.ranges)
        return hit != self.negated

    def save_args(self) -> list[str]:
        return [*neg_word(self.negated), f"--{self.which}", ",".join(port_text(r) for r in self.ranges)]
