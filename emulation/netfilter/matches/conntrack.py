"""``-m conntrack`` and ``-m state``: the packet's conntrack state, tuples and direction."""

from __future__ import annotations

from dataclasses import dataclass

from emulation.addr import parse_cidr
from emulation.netfilter.context import Ctx
from emulation.netfilter.matches.base import Match, Pred, neg_word, parse_port_range

__all__ = ["CT_STATES", "Conntrack"]

CT_STATES = ("INVALID", "NEW", "RELATED", "ESTABLISHED", "UNTRACKED", "SNAT", "DNAT")


@dataclass(frozen=True, slots=True)
class Conntrack(Match):
    """``-m conntrack`` / ``-m state`` (xt_conntrack.c, xt_state.c).

    ``--ctstate`` tests the packet's state (INVALID, NEW, RELATED, ESTABLISHED, UNTRACKED) and
    the pseudo-states SNAT/DNAT (the entry's source / destination is translated). Also
    ``--ctorigsrc/--ctorigdst/--ctreplsrc/--ctrepldst``, ``--ctorigdstport`` etc. and ``--ctdir``.
    """

    states: frozenset[str] = frozenset()
    states_neg: bool = False
    tuple_checks: tuple[tuple[str, bool, str], ...] = ()  # (option, negated, value)
    direction: str | None = None
    legacy_state: bool = False  # written as -m state --state

    @property
    def module(self) -> str:  # type: ignore[override]
        return "state" if self.legacy_state else "conntrack"

    def compile(self, uid: int) -> Pred | None:
        if self.tuple_checks or self.direction is not None or not self.states:
            return Match.compile(self, uid)
        states, neg = self.states, self.states_neg
        dnat, snat = "DNAT" in states, "SNAT" in states
        return lambda ctx: (ctx.ctstate in states or (dnat and ctx.ct_dnat) or (snat and ctx.ct_snat)) != neg

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if self.states:
            have = {ctx.ctstate}
            if ctx.ct_dnat:
                have.add("DNAT")
            if ctx.ct_snat:
                have.add("SNAT")
            if bool(have & self.states) == self.states_neg:
                return False
        for opt, neg, value in self.tuple_checks:
            tup = ctx.ct_orig if opt.startswith("--ctorig") else ctx.ct_reply
            if tup is None:
                return False
            field_ = opt.removeprefix("--ctorig").removeprefix("--ctrepl")
            idx = {"src": 0, "srcport": 1, "dst": 2, "dstport": 3}[field_]
            if field_ in ("src", "dst"):
                hit = parse_cidr(value).contains(ctx.version, tup[idx])
            else:
                lo, hi = parse_port_range(value)
                hit = lo <= tup[idx] <= hi
            if hit == neg:
                return False
        if self.direction is not None:
            return (self.direction == "REPLY") == ctx.ct_dir_reply
        return True

    def save_args(self) -> list[str]:
        states = ",".join(s for s in CT_STATES if s in self.states)
        if self.legacy_state:
            return [*neg_word(self.states_neg), "--state", states]
        out: list[str] = []
        if self.states:
            out += [*neg_word(self.states_neg), "--ctstate", states]
        for opt, neg, value in self.tuple_checks:
            out += [*neg_word(neg), opt, value]
        if self.direction:
            out += ["--ctdir", self.direction]
        return out
