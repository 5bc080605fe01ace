"""Round robin (``ip_vs_rr.c``) and weighted round robin (``ip_vs_wrr.c``).

Both keep a cursor into the destination list: a :class:`Dest`, or ``None`` for the list head
(``&svc->destinations``), exactly where the kernel keeps ``svc->sched_data`` / ``mark->cl``.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd

from emulation.ipvs.model import Dest
from emulation.ipvs.sched_base import SchedInput, Scheduler, eligible

__all__ = ["RoundRobin", "WeightedRoundRobin"]


class RoundRobin(Scheduler):
    """``rr``: the next eligible server after the cursor, wrapping once.

    ``ip_vs_rr_schedule``: walk from the entry after the cursor to the end of the list; then,
    unless the cursor is the head, a second pass from the first entry up to and including the
    cursor itself. Weight-0 and overloaded servers are skipped but keep their place.
    ``ip_vs_rr_del_dest``: if the cursor was the deleted server, it moves to its predecessor.
    A new server needs no callback: it sits at the head and is reached when the walk wraps.
    """

    name = "rr"

    def __init__(self) -> None:
        self.cursor: Dest | None = None
        self._pos = 0

    def init_service(self, dests: Sequence[Dest], flags: int) -> None:
        """``ip_vs_rr_init_svc``: the cursor starts at the list head."""
        self.cursor = None

    def del_dest(self, dests: Sequence[Dest], dest: Dest, index: int) -> None:
        """``ip_vs_rr_del_dest``: ``sched_data = p->next->prev``, the deleted entry's predecessor."""
        if self.cursor is dest:
            self.cursor = dests[index - 1] if index > 0 else None

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_rr_schedule``."""
        last = self.cursor
        if last is None:
            for i, d in enumerate(dests):
                if eligible(d):
                    self.cursor, self._pos = d, i
                    return d
            return None
        start = _index(dests, last, self._pos) + 1
        for i in range(start, len(dests)):
            d = dests[i]
            if eligible(d):
                self.cursor, self._pos = d, i
                return d
        for i, d in enumerate(dests):
            if eligible(d):
                self.cursor, self._pos = d, i
                return d
            if d is last:
                break
        return None


class WeightedRoundRobin(Scheduler):
    """``wrr``: passes over the list with a falling current weight ``cw`` (``ip_vs_wrr.c``).

    State ``mark = {cl, cw, mw, di}``: ``di`` is the gcd of the positive weights (1 if none),
    ``mw`` the largest weight minus ``di - 1`` (so the last pass runs with ``cw = 1``), ``cl``
    the cursor. Every add, delete and weight change resets ``cl`` to the head and adjusts ``cw``
    (``ip_vs_wrr_dest_changed``).
    """

    name = "wrr"

    def __init__(self) -> None:
        self.cl: Dest | None = None
        self.cw = 0
        self.mw = 0
        self.di = 1
        self._pos = 0

    def _weights(self, dests: Sequence[Dest]) -> None:
        g = 0
        top = 0
        for d in dests:
            w = d.weight
            if w > 0:
                g = gcd(w, g) if g > 0 else w
            top = max(top, w)
        self.di = g or 1
        self.mw = top - (self.di - 1)

    def init_service(self, dests: Sequence[Dest], flags: int) -> None:
        """``ip_vs_wrr_init_svc``: ``cl`` = head, ``cw = mw``."""
        self.cl = None
        self._weights(dests)
        self.cw = self.mw

    def _changed(self, dests: Sequence[Dest]) -> None:
        # ip_vs_wrr_dest_changed
        self.cl = None
        self._weights(dests)
        if self.cw > self.mw or not self.cw:
            self.cw = self.mw
        elif self.di > 1:
            self.cw = (self.cw // self.di) * self.di + 1

    def add_dest(self, dests: Sequence[Dest], dest: Dest) -> None:
        """``ip_vs_wrr_dest_changed``."""
        self._changed(dests)

    def del_dest(self, dests: Sequence[Dest], dest: Dest, index: int) -> None:
        """``ip_vs_wrr_dest_changed``."""
        self._changed(dests)

    def upd_dest(self, dests: Sequence[Dest], dest: Dest) -> None:
        """``ip_vs_wrr_dest_changed``."""
        self._changed(dests)

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_wrr_schedule``, including its ``stop``/``last_pass``/``restarted`` logic."""
        dest = self.cl
        if self.mw == 0:
            return None
        last = dest
        stop: Dest | None = None
        last_pass = restarted = False
        while True:
            start = 0 if dest is None else _index(dests, dest, self._pos) + 1
            for i in range(start, len(dests)):
                d = dests[i]
                if not d.overloaded and d.weight >= self.cw:
                    self.cl, self._pos = d, i
                    return d
                if d is stop:
                    self.cl = d
                    return None
            dest = None
            self.cw -= self.di
            if self.cw <= 0:
                self.cw = self.mw
                if last_pass or last is None:
                    self.cl = None
                    return None
                restarted = True
            last_pass = self.cw <= self.di
            if last_pass and restarted and last is not None:
                stop = last


def _index(dests: Sequence[Dest], dest: Dest, hint: int) -> int:
    """Position of ``dest``; ``hint`` (its last known position) makes the usual case O(1)."""
    if 0 <= hint < len(dests) and dests[hint] is dest:
        return hint
    for i, d in enumerate(dests):
        if d is dest:
            return i
    raise LookupError(f"{dest!r} is not in the destination list")
