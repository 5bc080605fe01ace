"""Maglev hashing (``ip_vs_mh.c``): a prime-sized lookup table filled from per-server permutations.

Table size ``M = primes[CONFIG_IP_VS_MH_TAB_INDEX - 8]``; the Kconfig default index is 12,
so ``M = 4093`` (the index range 8..17 gives 251 ... 131071). The hash keys are fixed, not
random (``generate_hash_secret``), so the same servers in the same list order give the same
table on every node.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd

from emulation.ipvs.errors import IpvsError
from emulation.ipvs.hashing import fold_address, hsiphash_u32
from emulation.ipvs.model import SVC_F_SCHED1, SVC_F_SCHED2, Dest
from emulation.ipvs.sched_base import SchedInput, TableScheduler

__all__ = ["HASH1", "HASH2", "PRIMES", "MaglevHashing", "mh_hashkey", "table_size"]

PRIMES = (251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071)
#: ``generate_hash_secret``: hash1 = {2654435761, 2654435761}, hash2 = {2654446892, 2654446892}.
HASH1 = (2654435761, 2654435761)
HASH2 = (2654446892, 2654446892)
DEFAULT_TAB_INDEX = 12
MH_FALLBACK = SVC_F_SCHED1
MH_PORT = SVC_F_SCHED2
_PORT_PROTOCOLS = frozenset({"tcp", "udp", "sctp"})


def table_size(tab_index: int = DEFAULT_TAB_INDEX) -> int:
    """``IP_VS_MH_TAB_SIZE`` for a ``CONFIG_IP_VS_MH_TAB_INDEX`` in 8..17.

    Raises:
        IpvsError: the index is outside the Kconfig range.
    """
    if not 8 <= tab_index <= 17:
        raise IpvsError(f"{tab_index=} is outside CONFIG_IP_VS_MH_TAB_INDEX's range 8..17")
    return PRIMES[tab_index - 8]


def mh_hashkey(version: int, addr: int, port: int, key: tuple[int, int], offset: int) -> int:
    """``ip_vs_mh_hashkey``: ``hsiphash(u32(offset + port + addr_fold), key)``."""
    return hsiphash_u32((offset + port + fold_address(version, addr)) & 0xFFFFFFFF, key)


def _fls(x: int) -> int:
    return x.bit_length()


class MaglevHashing(TableScheduler):
    """``mh``: ``ip_vs_mh_dest_changed`` -> gcd/rshift -> ``ip_vs_mh_permutate`` -> ``ip_vs_mh_populate``.

    Weights come from ``last_weight`` (the latest non-zero weight), so setting a server to weight
    0 keeps its slots: lookups that land there return ``None`` unless ``mh-fallback`` is set.
    A server *added* with weight 0 has ``last_weight`` 0 and takes no slot.

    Raises:
        IpvsError: more real servers than table slots (``ip_vs_mh_reassign``: ``-EINVAL``).
    """

    name = "mh"

    def __init__(self, tab_index: int = DEFAULT_TAB_INDEX) -> None:
        self.size = table_size(tab_index)
        self.tab_bits = tab_index // 2
        self.table: list[Dest | None] = [None] * self.size

    def _reassign(self, dests: Sequence[Dest]) -> None:
        m = self.size
        if len(dests) > m:
            raise IpvsError(f"{len(dests)} real servers do not fit an mh table of {m} slots (EINVAL)")
        g = 0
        top = 0
        for d in dests:
            w = d.last_weight
            if w > 0:
                g = gcd(w, g) if g > 0 else w
            top = max(top, w)
        if g < 1:
            self.table = [None] * m
            return
        rshift = max(0, _fls(top // g) - self.tab_bits)
        perm: list[int] = []
        skip: list[int] = []
        turns: list[int] = []
        for d in dests:
            perm.append(mh_hashkey(d.version, d.addr, d.port, HASH1, 0) % m)
            skip.append(mh_hashkey(d.version, d.addr, d.port, HASH2, 0) % (m - 1) + 1)
            lw = d.last_weight
            turns.append(((lw // g) >> rshift) or (1 if lw != 0 else 0))
        table: list[Dest | None] = [None] * m
        filled = bytearray(m)
        n = 0
        dt = 0
        count = len(dests)
        while n < m:
            i = 0
            while i < count:
                if turns[i] < 1:
                    i += 1
                    continue
                c = perm[i]
                while filled[c]:
                    c += skip[i]
                    if c >= m:
                        c -= m
                perm[i] = c
                filled[c] = 1
                table[c] = dests[i]
                n += 1
                if n == m:
                    self.table = table
                    return
                dt += 1
                if dt >= turns[i]:
                    dt = 0
                    i += 1
        self.table = table

    def schedule(self, dests: Sequence[Dest], flags: int, pkt: SchedInput) -> Dest | None:
        """``ip_vs_mh_schedule`` with ``ip_vs_mh_get`` or ``ip_vs_mh_get_fallback``."""
        addr = pkt.daddr if pkt.inverse else pkt.saddr
        port = 0
        if flags & MH_PORT and pkt.protocol in _PORT_PROTOCOLS:
            port = pkt.dport if pkt.inverse else pkt.sport
        m = self.size
        ihash = mh_hashkey(pkt.version, addr, port, HASH1, 0) % m
        d = self.table[ihash]
        if d is None:
            return None
        if not (d.weight <= 0 or d.overloaded):
            return d
        if not flags & MH_FALLBACK:
            return None
        for off in range(m):
            roff = (off + ihash) % m
            d = self.table[mh_hashkey(pkt.version, addr, port, HASH1, roff) % m]
            if d is None:
                return None
            if not (d.weight <= 0 or d.overloaded):
                return d
        return None
