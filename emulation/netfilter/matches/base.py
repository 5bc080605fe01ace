"""The match base class and the option-value parsers shared by matches and targets.

Each match is a frozen value with ``test(ctx, uid) -> True | False | None`` (``None`` is
"unknown": the emulator cannot tell, see ``UnknownMatch``) and ``save_args()``, its options in
the canonical order ``iptables-save`` prints them. ``compile(uid)`` gives the same test as a
closure over the match's fields (``None`` when the match always holds and has no side
effect), which the indexed evaluator runs instead of ``test``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from emulation.errors import NetfilterError
from emulation.netfilter.context import Ctx

__all__ = [
    "PROBABILITY_SCALE",
    "PROTO_NUMBERS",
    "Match",
    "Opt",
    "Pred",
    "neg_word",
    "parse_int",
    "parse_mark",
    "parse_port_range",
    "port_text",
]

Opt = tuple[str, bool, str | None]  # (option, negated, value)
#: A compiled match: ``pred(ctx) -> True | False | None``, the same value as ``test(ctx, uid)``.
Pred = Callable[[Ctx], "bool | None"]
PROTO_NUMBERS = {
    "icmp": 1,
    "tcp": 6,
    "udp": 17,
    "sctp": 132,
    "icmpv6": 58,
    "ipv6-icmp": 58,
    "udplite": 136,
    "esp": 50,
    "ah": 51,
    "gre": 47,
    "dccp": 33,
    "mh": 135,
    "mobility-header": 135,
}
#: Userspace stores a probability as ``lround(p * 2**31)``; the kernel matches when
#: ``(get_random_u32() & 0x7FFFFFFF) < that`` (xt_statistic.c), i.e. with probability n / 2**31.
PROBABILITY_SCALE = 0x80000000


class Match:
    """Base of every match: ``module`` name (``""`` for basic matches)."""

    __slots__ = ()
    module: ClassVar[str] = ""

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        """Whether the packet in ``ctx`` matches (``None``: unknown)."""
        raise NotImplementedError

    def compile(self, uid: int) -> Pred | None:
        """``test`` for the rule ``uid`` as a closure; ``None`` when it always holds, side-effect free.

        Subclasses specialise it for the shapes rulesets use most; this default calls ``test``.
        """
        test = self.test
        return lambda ctx: test(ctx, uid)

    def save_args(self) -> list[str]:
        """The options after ``-m module`` (or the basic option itself), canonical and quoted."""
        raise NotImplementedError


def neg_word(flag: bool) -> list[str]:
    """``["!"]`` for a negated option, else ``[]``."""
    return ["!"] if flag else []


def parse_port_range(text: str) -> tuple[int, int]:
    """``"80"`` -> (80, 80); ``"1000:2000"`` -> (1000, 2000); ``":5"``/``"5:"`` open ends."""
    lo_s, sep, hi_s = text.partition(":")
    try:
        lo = int(lo_s) if lo_s else 0
        hi = (int(hi_s) if hi_s else 65535) if sep else lo
    except ValueError:
        raise NetfilterError(f"invalid port {text!r}; expected a number or a range like 1000:2000") from None
    if not (0 <= lo <= 65535 and 0 <= hi <= 65535) or lo > hi:
        raise NetfilterError(f"invalid port range {text!r}")
    return lo, hi


def port_text(r: tuple[int, int]) -> str:
    """``(80, 80)`` -> ``"80"``; ``(1000, 2000)`` -> ``"1000:2000"``."""
    return str(r[0]) if r[0] == r[1] else f"{r[0]}:{r[1]}"


def parse_int(text: str, what: str) -> int:
    """Parse a decimal or ``0x`` hex integer, naming ``what`` in the error."""
    try:
        return int(text, 0)
    except ValueError:
        raise NetfilterError(f"invalid {what} {text!r}; expected a number") from None


def parse_mark(text: str, default_mask: int = 0xFFFFFFFF) -> tuple[int, int]:
    """``"0x4000/0x4000"`` -> (0x4000, 0x4000); without a mask, ``default_mask``."""
    v, sep, m = text.partition("/")
    value, mask = parse_int(v, "mark"), (parse_int(m, "mask") if sep else default_mask)
    if not (0 <= value <= 0xFFFFFFFF and 0 <= mask <= 0xFFFFFFFF):
        raise NetfilterError(f"mark {text!r} does not fit in 32 bits")
    return value, mask
