"""The scheduler interface (``struct ip_vs_scheduler`` in include/net/ip_vs.h) and its input.

A scheduler object holds one service's ``sched_data``. The service calls ``add_dest`` after a
real server was linked at the head of the list, ``del_dest`` after one was unlinked (with the
index it had), ``upd_dest`` after an edit, as ``__ip_vs_update_dest`` / ``__ip_vs_unlink_dest``
do; ``schedule`` picks a real server for a new connection or returns ``None`` ("no destination
available"). ``dests`` is always the service's list, head first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from emulation.ipvs.model import Dest

__all__ = ["SchedInput", "Scheduler", "eligible"]


@dataclass(frozen=True, slots=True)
class SchedInput:
    """What a scheduler may read from the packet (``skb`` and ``ip_vs_iphdr``).

    ``saddr``/``daddr`` are integers of the service's family, ``protocol`` is ``tcp``/``udp``/
    ``sctp``. ``inverse`` is the ``ip_vs_iph_inverse`` case (an ICMP error about a reply);
    it makes sh and mh hash the destination instead of the source.
    """

    version: int
    saddr: int
    sport: int
    daddr: int
    dport: int
    protocol: str
    inverse: bool = False


def eligible(d: Dest) -> bool:
    """Neither overloaded nor quiesced: ``!(flags & IP_VS_DEST_F_OVERLOAD) && weight > 0``."""
    return not d.overloaded and d.weight > 0


class Scheduler:
    """Base scheduler: no state, no callbacks (lc, wlc, sed, nq, fo and ovf need nothing else)."""

    name = ""

    def init_service(self, dests: Sequence[Dest], flags: int) -> None:
        """``init_service``: build state for the current list."""

    def add_dest(self, dests: Sequence[Dest], dest: Dest) -> None:
        """``add_dest``: ``dest`` was just linked at the head (``dests[0] is dest``)."""

    def del_dest(self, dests: Sequence[Dest], dest: Dest, index: int) -> None:
        """``del_dest``: ``dest`` was just unlinked from position ``index``."""

    def upd_dest(self, dests: Sequence[Dest], dest: Dest) -> None:
        """``upd_dest``: ``dest``'s weight or thresholds were edited in place."""

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """Choose a real server, or ``None`` when none is available."""
        raise NotImplementedError


class TableScheduler(Scheduler):
    """A scheduler whose lookup table is rebuilt from the whole list on every change.

    sh, dh and mh register one ``*_dest_changed`` callback for add, delete and (sh, mh) edit,
    which reassigns the table (``ip_vs_sh_reassign``, ``ip_vs_dh_reassign``,
    ``ip_vs_mh_reassign``); dh registers no ``upd_dest`` (``rebuild_on_update = False``).
    """

    rebuild_on_update = True

    def _reassign(self, dests: Sequence[Dest]) -> None:
        raise NotImplementedError

    def init_service(self, dests: Sequence[Dest], flags: int) -> None:
        """``*_init_svc``: build the table."""
        self._reassign(dests)

    def add_dest(self, dests: Sequence[Dest], dest: Dest) -> None:
        """``*_dest_changed``."""
        self._reassign(dests)

    def del_dest(self, dests: Sequence[Dest], dest: Dest, index: int) -> None:
        """``*_dest_changed``."""
        self._reassign(dests)

    def upd_dest(self, dests: Sequence[Dest], dest: Dest) -> None:
        """``*_dest_changed`` where the scheduler registers it for edits."""
        if self.rebuild_on_update:
            self._reassign(dests)
