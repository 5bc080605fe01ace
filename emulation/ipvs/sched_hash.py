"""Source hashing (``ip_vs_sh.c``) and destination hashing (``ip_vs_dh.c``).

Both keep a 256-bucket table (``CONFIG_IP_VS_SH_TAB_BITS`` / ``IP_VS_DH_TAB_BITS`` = 8) of
real servers, rebuilt from the destination list on every change, and index it with
``hash_32`` of the folded address (plus the source port for ``sh-port``).
"""

from __future__ import annotations

from collections.abc import Sequence

from emulation.ipvs.hashing import fold_address, hash_32
from emulation.ipvs.model import SVC_F_SCHED1, SVC_F_SCHED2, Dest
from emulation.ipvs.sched_base import SchedInput, TableScheduler

__all__ = ["TAB_BITS", "TAB_SIZE", "DestinationHashing", "SourceHashing", "sh_hashkey"]

TAB_BITS = 8
TAB_SIZE = 1 << TAB_BITS
_MASK = TAB_SIZE - 1
SH_FALLBACK = SVC_F_SCHED1
SH_PORT = SVC_F_SCHED2
_PORT_PROTOCOLS = frozenset({"tcp", "udp", "sctp"})


def sh_hashkey(version: int, addr: int, port: int, offset: int) -> int:
    """``ip_vs_sh_hashkey``: ``(offset + hash_32(port + addr_fold, 8)) & 255``."""
    return (offset + hash_32((port + fold_address(version, addr)) & 0xFFFFFFFF, TAB_BITS)) & _MASK


def _unavailable(d: Dest) -> bool:
    # ip_vs_sh.c is_unavailable()
    return d.weight <= 0 or d.overloaded


class SourceHashing(TableScheduler):
    """``sh``: the bucket of the client address (and port with ``sh-port``).

    ``ip_vs_sh_reassign``: buckets are filled in list order, each server taking ``weight``
    consecutive buckets before the next one (a weight-0 server still takes one bucket:
    ``++d_count >= weight`` holds at once), cycling until all 256 are filled.
    ``ip_vs_sh_schedule``: without ``sh-fallback`` an unavailable (weight 0 or overloaded)
    server in the bucket means "no destination"; with it, ``ip_vs_sh_get_fallback`` probes
    ``sh_hashkey(addr, port, (ihash + off) % 256)`` for ``off`` in 0..255 and stops at an empty
    bucket.
    """

    name = "sh"

    def __init__(self) -> None:
        self.buckets: list[Dest | None] = [None] * TAB_SIZE

    def _reassign(self, dests: Sequence[Dest]) -> None:
        if not dests:
            self.buckets = [None] * TAB_SIZE
            return
        out: list[Dest | None] = []
        i = 0
        count = 0
        n = len(dests)
        for _ in range(TAB_SIZE):
            d = dests[i]
            out.append(d)
            count += 1
            if count >= d.weight:
                i = (i + 1) % n
                count = 0
        self.buckets = out

    def bucket_of(self, version: int, addr: int, port: int = 0) -> int:
        """The bucket index a client maps to (``ip_vs_sh_hashkey`` with offset 0)."""
        return sh_hashkey(version, addr, port, 0)

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_sh_schedule``."""
        addr = pkt.daddr if pkt.inverse else pkt.saddr
        port = 0
        if flags & SH_PORT and pkt.protocol in _PORT_PROTOCOLS:
            port = pkt.dport if pkt.inverse else pkt.sport
        ihash = sh_hashkey(pkt.version, addr, port, 0)
        d = self.buckets[ihash]
        if d is None:
            return None
        if not _unavailable(d):
            return d
        if not flags & SH_FALLBACK:
            return None
        for off in range(TAB_SIZE):
            roff = (off + ihash) % TAB_SIZE
            d = self.buckets[sh_hashkey(pkt.version, addr, port, roff)]
            if d is None:
                return None
            if not _unavailable(d):
                return d
        return None


class DestinationHashing(TableScheduler):
    """``dh``: the bucket of the destination (virtual) address, one bucket per server per cycle.

    ``ip_vs_dh_reassign`` ignores weights; ``ip_vs_dh_schedule`` returns ``None`` when the
    bucket's server is not available, has weight 0 or is overloaded. The kernel registers no
    ``upd_dest`` for dh (weights do not shape its table), so an edit changes nothing here.
    """

    name = "dh"
    rebuild_on_update = False

    def __init__(self) -> None:
        self.buckets: list[Dest | None] = [None] * TAB_SIZE

    def _reassign(self, dests: Sequence[Dest]) -> None:
        n = len(dests)
        self.buckets = [dests[i % n] for i in range(TAB_SIZE)] if n else [None] * TAB_SIZE

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_dh_schedule``."""
        d = self.buckets[hash_32(fold_address(pkt.version, pkt.daddr), TAB_BITS)]
        if d is None or not d.available or d.weight <= 0 or d.overloaded:
            return None
        return d
