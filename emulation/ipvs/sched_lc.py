"""The load-based schedulers: ``lc``, ``wlc``, ``sed``, ``nq``, ``fo`` and ``ovf``.

Each walks the destination list head first and keeps the first best candidate, so ties go to
the entry nearest the head (the most recently added). Comparisons are the kernel's integer
cross-multiplications; Python integers do not overflow, the kernel's 64-bit (``__s64``) ones do
not either for any weight (at most 65535) and connection count it can hold.
"""

from __future__ import annotations

from collections.abc import Sequence

from emulation.ipvs.model import Dest
from emulation.ipvs.sched_base import SchedInput, Scheduler, eligible

__all__ = [
    "FailOver",
    "LeastConnection",
    "NeverQueue",
    "Overflow",
    "ShortestExpectedDelay",
    "WeightedLeastConnection",
]


class LeastConnection(Scheduler):
    """``lc`` (``ip_vs_lc_schedule``): least ``overhead`` (``active<<8 + inactive``), strict ``<``.

    Overloaded and weight-0 servers are skipped; other weights are ignored.
    """

    name = "lc"

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_lc_schedule``."""
        least: Dest | None = None
        loh = 0
        for d in dests:
            if d.overloaded or d.weight == 0:
                continue
            doh = d.overhead()
            if least is None or doh < loh:
                least, loh = d, doh
        return least


class _Weighted(Scheduler):
    """The wlc/sed shape: first eligible server, then ``loh * w(d) > doh * w(least)`` wins."""

    def overhead(self, d: Dest) -> int:
        raise NotImplementedError

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_wlc_schedule`` / ``ip_vs_sed_schedule``: the ``nextstage`` loop skips only overloaded."""
        it = iter(dests)
        least: Dest | None = None
        for d in it:
            if eligible(d):
                least = d
                break
        if least is None:
            return None
        loh = self.overhead(least)
        for d in it:
            if d.overloaded:
                continue
            doh = self.overhead(d)
            if loh * d.weight > doh * least.weight:
                least, loh = d, doh
        return least


class WeightedLeastConnection(_Weighted):
    """``wlc`` (``ip_vs_wlc.c``): least ``overhead / weight``."""

    name = "wlc"

    def overhead(self, d: Dest) -> int:
        """``ip_vs_dest_conn_overhead``."""
        return d.overhead()


class ShortestExpectedDelay(_Weighted):
    """``sed`` (``ip_vs_sed.c``): least ``(activeconns + 1) / weight``; inactive ones are ignored."""

    name = "sed"

    def overhead(self, d: Dest) -> int:
        """``ip_vs_sed_dest_overhead``: ``activeconns + 1``."""
        return d.activeconns + 1


class NeverQueue(Scheduler):
    """``nq`` (``ip_vs_nq.c``): the first idle server (no active connections), else sed's choice."""

    name = "nq"

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_nq_schedule``."""
        least: Dest | None = None
        loh = 0
        for d in dests:
            if d.overloaded or d.weight == 0:
                continue
            doh = d.activeconns + 1
            if d.activeconns == 0:
                return d
            if least is None or loh * d.weight > doh * least.weight:
                least, loh = d, doh
        return least


class FailOver(Scheduler):
    """``fo`` (``ip_vs_fo.c``): the available server with the highest weight (first on a tie)."""

    name = "fo"

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_fo_schedule``: ``weight > hw`` with ``hw`` starting at 0, so weight 0 never wins."""
        best: Dest | None = None
        hw = 0
        for d in dests:
            if not d.overloaded and d.weight > hw:
                best, hw = d, d.weight
        return best


class Overflow(Scheduler):
    """``ovf`` (``ip_vs_ovf.c``): highest weight among servers with ``activeconns <= weight``."""

    name = "ovf"

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_ovf_schedule``."""
        best: Dest | None = None
        hw = 0
        for d in dests:
            w = d.weight
            if d.overloaded or d.activeconns > w or w == 0:
                continue
            if best is None or w > hw:
                best, hw = d, w
        return best
