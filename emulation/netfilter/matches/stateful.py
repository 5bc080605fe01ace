"""Matches with state that outlives a packet: ``statistic`` (random and nth) and ``recent`` lists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from emulation.addr import format_address
from emulation.netfilter.context import Ctx, RecentEntry
from emulation.netfilter.matches.base import PROBABILITY_SCALE, Match, Pred, neg_word

__all__ = ["Recent", "Statistic"]


@dataclass(frozen=True, slots=True)
class Statistic(Match):
    """``-m statistic --mode random --probability P`` or ``--mode nth --every N --packet P``.

    Random: ``probability`` is the kernel's 31-bit threshold ``lround(P * 2**31)``; the match
    holds with probability ``threshold / 2**31`` (:attr:`p`). The evaluator asks its oracle
    (sample: ``rng.random() < p``, which has the same distribution as the kernel's
    ``(get_random_u32() & 0x7FFFFFFF) < threshold``; enumerate: both branches).
    Nth: the counter starts at ``every - 1 - packet`` and the match holds when the increment
    wraps it to 0 (xt_statistic.c), so packet number ``packet`` (0-based) of every ``every``
    matches. The counter belongs to the rule and advances only when this match is evaluated.
    """

    mode: str
    probability: int = 0
    every: int = 0
    packet: int = 0
    negated: bool = False
    module: ClassVar[str] = "statistic"

    @property
    def p(self) -> float:
        """The exact probability the kernel applies."""
        return self.probability / PROBABILITY_SCALE

    def compile(self, uid: int) -> Pred | None:
        if self.mode != "random":
            return Match.compile(self, uid)
        p, neg = self.p, self.negated
        return lambda ctx: ctx.oracle(p) != neg

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if self.mode == "random":
            return ctx.oracle(self.p) != self.negated
        count = ctx.nth_count(uid, self.every - 1 - self.packet)
        count = 0 if count == self.every - 1 else count + 1
        ctx.nth_overlay[uid] = count
        return (count == 0) != self.negated

    def save_args(self) -> list[str]:
        if self.mode == "random":
            return ["--mode", "random", *neg_word(self.negated), "--probability", f"{self.p:.11f}"]
        return [
            "--mode",
            "nth",
            *neg_word(self.negated),
            "--every",
            str(self.every),
            "--packet",
            str(self.packet),
        ]


@dataclass(frozen=True, slots=True)
class Recent(Match):
    """``-m recent`` (xt_recent.c, ``recent_mt``), with the kernel's defaults.

    Lists hold at most :attr:`LIST_TOT` addresses (``ip_list_tot``; the least recently
    updated is evicted) and :attr:`PKT_LIST_TOT` time stamps each (``ip_pkt_list_tot``).
    ``--rcheck``/``--update`` match when at least ``hitcount`` (default 1) stamps are within
    ``seconds`` (all stamps without ``--seconds``); ``--update`` then adds a stamp; ``--reap``
    drops the least recently updated entry if its newest stamp is older than ``seconds``.
    """

    action: str  # set, rcheck, update, remove
    name: str = "DEFAULT"
    seconds: int = 0
    hitcount: int = 0
    reap: bool = False
    rttl: bool = False
    dest: bool = False
    mask: int | None = None  # None: all ones for the packet's family
    negated: bool = False
    module: ClassVar[str] = "recent"
    LIST_TOT: ClassVar[int] = 100
    PKT_LIST_TOT: ClassVar[int] = 20

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        addr = ctx.dst if self.dest else ctx.src
        if self.mask is not None:
            addr &= self.mask
        key = (ctx.version, addr)
        ret = self.negated
        table = ctx.recent_table(self.name, write=False)
        entry = table.get(key)
        if entry is None:
            if self.action != "set":
                return ret
            table = ctx.recent_table(self.name, write=True)
            if len(table) >= self.LIST_TOT:
                del table[next(iter(table))]
            table[key] = RecentEntry((ctx.now,))
            return not ret
        if self.action == "set":
            ret = not ret
        elif self.action == "remove":
            del ctx.recent_table(self.name, write=True)[key]
            return not ret
        else:
            since = ctx.now - self.seconds
            hits = 0
            for stamp in entry.stamps:
                if self.seconds and stamp < since:
                    continue
                hits += 1
                if not self.hitcount or hits >= self.hitcount:
                    ret = not ret
                    break
            if self.reap:
                table = ctx.recent_table(self.name, write=True)
                oldest = next(iter(table))
                if (
                    not (oldest == key and self.action == "update" and ret)
                    and table[oldest].stamps[-1] < since
                ):
                    del table[oldest]
        if self.action == "set" or (self.action == "update" and ret):
            table = ctx.recent_table(self.name, write=True)
            table.pop(key, None)
            table[key] = RecentEntry((*entry.stamps, ctx.now)[-self.PKT_LIST_TOT :])
        return ret

    def save_args(self) -> list[str]:
        out = [*neg_word(self.negated), f"--{self.action}"]
        if self.seconds:
            out += ["--seconds", str(self.seconds)]
        if self.reap:
            out.append("--reap")
        if self.hitcount:
            out += ["--hitcount", str(self.hitcount)]
        if self.rttl:
            out.append("--rttl")
        out += ["--name", self.name]
        if self.mask is not None:
            out += ["--mask", format_address(4 if self.mask <= 0xFFFFFFFF else 6, self.mask)]
        out.append("--rdest" if self.dest else "--rsource")
        return out
