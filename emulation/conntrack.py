"""Connection tracking: flows keyed by their original and reply tuples, with NAT and timeouts.

Theory of operation (net/netfilter/nf_conntrack_core.c, nf_nat_core.c): the first packet of a
flow creates an unconfirmed entry; the nat table decides the translation for it once, and the
entry is confirmed (inserted) only if the packet survives every hook. Later packets find the
entry by either tuple: in the original direction they are translated as decided, replies are
translated back. A packet is ESTABLISHED once the flow has seen a reply, else NEW. Entries
expire by the kernel's default timeouts (seconds) from the injected clock:

- TCP: 120 unreplied (``SYN_SENT``), 432000 once replied (``ESTABLISHED``; close states are
  not modelled) -- nf_conntrack_proto_tcp.c.
- UDP: 30 unreplied; 120 (``UDP_CT_REPLIED``) once replied and the flow is older than 2 s,
  else 30 -- nf_conntrack_proto_udp.c.
- SCTP: 3 unreplied (``COOKIE_WAIT``), 210 replied (``ESTABLISHED``) -- nf_conntrack_proto_sctp.c.
- ICMP: 30 -- nf_conntrack_proto_icmp.c.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from emulation.addr import format_address
from emulation.clock import Clock

__all__ = ["ConntrackEntry", "ConntrackTable", "FlowKey", "timeout_s"]

#: ``(ip version, src, sport, dst, dport, protocol)`` with addresses as integers.
FlowKey = tuple[int, int, int, int, int, str]

UDP_STREAM_AFTER_S = 2.0


def timeout_s(proto: str, seen_reply: bool, age_s: float) -> float:
    """The kernel's default timeout for an entry in that state (see the module docstring)."""
    if proto == "tcp":
        return 432000.0 if seen_reply else 120.0
    if proto == "udp":
        return 120.0 if seen_reply and age_s >= UDP_STREAM_AFTER_S else 30.0
    if proto == "sctp":
        return 210.0 if seen_reply else 3.0
    return 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConntrackEntry:
    """One tracked flow.

    Attributes:
        original: the tuple of the first packet as it arrived (before NAT).
        reply: the tuple a reply carries (its source is the post-DNAT destination, its
            destination the post-SNAT source).
        created_s, expires_s: clock times in seconds.
        seen_reply: the flow has seen a reply (``IPS_SEEN_REPLY``).
        mark: the connection mark (``ctmark``).
    """

    original: FlowKey
    reply: FlowKey
    created_s: float
    expires_s: float
    seen_reply: bool = False
    mark: int = 0

    @property
    def dnat(self) -> bool:
        """The destination was translated (``IPS_DST_NAT``)."""
        return (self.original[3], self.original[4]) != (self.reply[1], self.reply[2])

    @property
    def snat(self) -> bool:
        """The source was translated (``IPS_SRC_NAT``)."""
        return (self.original[1], self.original[2]) != (self.reply[3], self.reply[4])

    def describe(self) -> str:
        """A ``conntrack -L``-like line."""

        def side(k: FlowKey) -> str:
            v = k[0]
            return f"src={format_address(v, k[1])} dst={format_address(v, k[3])} sport={k[2]} dport={k[4]}"

        flag = "" if self.seen_reply else " [UNREPLIED]"
        return f"{self.original[5]} {side(self.original)}{flag} {side(self.reply)} mark={self.mark}"


class ConntrackTable:
    """The conntrack table of one node (a thin mutable shell over frozen entries)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._by_key: dict[FlowKey, ConntrackEntry] = {}

    def lookup(self, key: FlowKey) -> tuple[ConntrackEntry, bool] | None:
        """The live entry with ``key`` as its original or reply tuple, and whether it is the reply."""
        entry = self._by_key.get(key)
        if entry is None:
            return None
        if entry.expires_s <= self.clock.now():
            self._remove(entry)
            return None
        return entry, key == entry.reply and key != entry.original

    def confirm(self, entry: ConntrackEntry) -> None:
        """Insert a new entry, or replace the entry with the same original tuple."""
        old = self._by_key.get(entry.original)
        if old is not None:
            self._remove(old)
        self._by_key[entry.original] = entry
        self._by_key[entry.reply] = entry

    def refresh(self, entry: ConntrackEntry, *, reply: bool, mark: int) -> ConntrackEntry:
        """Account a packet of an existing entry: reply seen, new timeout, new ctmark."""
        now = self.clock.now()
        seen = entry.seen_reply or reply
        updated = replace(
            entry,
            seen_reply=seen,
            mark=mark,
            expires_s=now + timeout_s(entry.original[5], seen, now - entry.created_s),
        )
        self.confirm(updated)
        return updated

    def entries(self) -> list[ConntrackEntry]:
        """Every live entry."""
        now = self.clock.now()
        seen: dict[int, ConntrackEntry] = {}
        for e in self._by_key.values():
            if e.expires_s > now:
                seen[id(e)] = e
        return list(seen.values())

    def delete(self, predicate: Callable[[ConntrackEntry], bool]) -> int:
        """Delete every entry for which ``predicate`` holds (``conntrack -D``); return how many."""
        doomed = [e for e in self.entries() if predicate(e)]
        for e in doomed:
            self._remove(e)
        return len(doomed)

    def _remove(self, entry: ConntrackEntry) -> None:
        for k in (entry.original, entry.reply):
            if self._by_key.get(k) is entry:
                del self._by_key[k]
