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
- SCTP: 10 unreplied (an INIT nobody answered leaves the entry ``CLOSED``: ``sctp_conntracks``
  takes INIT from ``sNO`` to ``sCL``; ``COOKIE_WAIT`` needs the INIT_ACK), 210 replied
  (``ESTABLISHED``) -- nf_conntrack_proto_sctp.c. The client's own packets do not renew an
  unreplied entry ("don't renew timeout on init retransmit").
- ICMP: 30 -- nf_conntrack_proto_icmp.c.

Expired entries are never found; they are also removed from memory a few at a time as new
ones are confirmed, as the kernel's ``gc_worker`` evicts them in the background, so a long
run holds only the live flows. Entries wait in one queue per timeout length: the clock only
moves forward, so each queue is in expiry order and its front is the next to expire.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from emulation.addr import format_address
from emulation.clock import Clock
from emulation.slots import maker

__all__ = ["ConntrackEntry", "ConntrackTable", "FlowKey", "timeout_s"]

#: ``(ip version, src, sport, dst, dport, protocol)`` with addresses as integers.
FlowKey = tuple[int, int, int, int, int, str]

UDP_STREAM_AFTER_S = 2.0
#: Expired entries removed at most per confirmed entry.
SWEEP_PER_CONFIRM = 4
_NEVER = float("inf")


def timeout_s(proto: str, seen_reply: bool, age_s: float) -> float:
    """The kernel's default timeout for an entry in that state (see the module docstring)."""
    if proto == "tcp":
        return 432000.0 if seen_reply else 120.0
    if proto == "udp":
        return 120.0 if seen_reply and age_s >= UDP_STREAM_AFTER_S else 30.0
    if proto == "sctp":
        return 210.0 if seen_reply else 10.0
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


_Row = tuple[FlowKey, FlowKey, float, float, bool, int]
_make_entry = maker(ConntrackEntry)


class ConntrackTable:
    """The conntrack table of one node (a thin mutable shell over frozen entries)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # Rows ``(original, reply, created_s, expires_s, seen_reply, mark)`` by both tuples.
        # Tuples of numbers and text, which the cyclic garbage collector stops tracking, where
        # entry objects would stay tracked: 100,000 flows made each full collection ~1 s longer.
        self._by_key: dict[FlowKey, _Row] = {}
        # Rows by the length of the timeout they were given, in expiry order (see _sweep).
        self._queues: dict[float, deque[_Row]] = {}
        self._due = float("inf")  # no queue's front expires before this
        self._last: tuple[float, deque[_Row]] = (float("nan"), deque())  # the last queue used, by length
        # NAT's bysource table, for the sources that matter to it (see source_mappings): rows
        # by (version, src, sport, protocol) of their original tuple, oldest first. Built at
        # its first use (None until then: kube-proxy's --random-fully never uses it).
        self._bysource: dict[tuple[int, int, int, str], list[_Row]] | None = None

    def lookup(self, key: FlowKey) -> tuple[ConntrackEntry, bool] | None:
        """The live entry with ``key`` as its original or reply tuple, and whether it is the reply."""
        row = self._by_key.get(key)
        if row is None:
            return None
        if row[3] <= self.clock.now():
            self._remove(row)
            return None
        return _make_entry(*row), key == row[1] and key != row[0]

    def taken(self, key: FlowKey) -> bool:
        """Whether a live entry has ``key`` as its original or reply tuple
        (``nf_conntrack_tuple_taken``)."""
        row = self._by_key.get(key)
        return row is not None and row[3] > self.clock.now()

    def source_mappings(self, version: int, src: int, sport: int, proto: str) -> list[tuple[int, int]]:
        """``(address, port)`` each live entry from this original source was mapped to, most
        recent first, as NAT's ``find_appropriate_src`` walks its ``bysource`` bucket.

        Only sources one of whose entries had its port remapped are kept (from that entry on):
        for any other, reusing a mapping tries the flow's own port, which the next step of
        :func:`~emulation.netfilter.nat.choose_source_port` tries anyway, so the answer is the same.
        The table is made from the live entries at the first call and kept from then on.
        """
        if self._bysource is None:
            self._bysource = self._build_bysource()
        key = (version, src, sport, proto)
        rows = self._bysource.get(key)
        if not rows:
            return []
        now = self.clock.now()
        live = [r for r in rows if r[3] > now and self._by_key.get(r[0]) is r]
        if len(live) != len(rows):
            if live:
                self._bysource[key] = live
            else:
                del self._bysource[key]
        return [(r[1][3], r[1][4]) for r in reversed(live)]

    def _build_bysource(self) -> dict[tuple[int, int, int, str], list[_Row]]:
        now = self.clock.now()
        rows = {id(r): r for r in self._by_key.values() if r[3] > now and self._by_key.get(r[0]) is r}
        table: dict[tuple[int, int, int, str], list[_Row]] = {}
        for row in sorted(rows.values(), key=lambda r: r[2]):  # in creation order
            original, reply = row[0], row[1]
            skey = (original[0], original[1], original[2], original[5])
            if skey in table or original[2] != reply[4]:
                table.setdefault(skey, []).append(row)
        return table

    def confirm(self, entry: ConntrackEntry) -> None:
        """Insert a new entry, or replace the entry with the same original tuple."""
        self.insert(
            entry.original, entry.reply, entry.created_s, entry.expires_s, entry.seen_reply, entry.mark
        )

    def insert(
        self,
        original: FlowKey,
        reply: FlowKey,
        created_s: float,
        expires_s: float,
        seen_reply: bool,
        mark: int,
    ) -> None:
        """:meth:`confirm` of the entry with these fields, without making the entry."""
        row = (original, reply, created_s, expires_s, seen_reply, mark)
        by_key = self._by_key
        old = by_key.get(original)
        if old is not None:
            self._remove(old)
        by_key[original] = row
        by_key[reply] = row
        bysource = self._bysource
        if bysource is not None and (bysource or original[2] != reply[4]):  # (see source_mappings)
            skey = (original[0], original[1], original[2], original[5])
            rows = bysource.get(skey)
            at = -1 if rows is None or old is None else next((i for i, r in enumerate(rows) if r is old), -1)
            if rows is not None and at >= 0:
                rows[at] = row  # a refreshed entry keeps its place, as in the kernel
            elif rows is not None:
                rows.append(row)
            elif original[2] != reply[4]:  # a source port remapped: its source is kept from now
                bysource[skey] = [row]
        now = self.clock.now()
        if old is None:  # a refreshed entry keeps its flow's place (see _sweep)
            last_length, queue = self._last
            if abs(expires_s - now - last_length) < 0.0005:  # _enqueue's common case, inline
                queue.append(row)
                if expires_s < self._due:
                    self._due = expires_s
            else:
                self._enqueue(row, now)
        if self._due <= now:
            self._sweep(now)

    def _enqueue(self, row: _Row, now: float) -> None:
        expires = row[3]
        length = expires - now
        if abs(length - self._last[0]) < 0.0005:  # most entries get the last one's timeout
            queue = self._last[1]
        else:
            length = round(length, 3)  # one queue per timeout, rounding aside
            found = self._queues.get(length)
            if found is None:
                found = self._queues[length] = deque()
            queue = found
            self._last = (length, queue)
        queue.append(row)
        if expires < self._due:
            self._due = expires

    def _sweep(self, now: float) -> None:
        """Remove up to :data:`SWEEP_PER_CONFIRM` expired entries from the queues' fronts.

        An entry refreshed since it was queued goes to the back of the queue of its new
        timeout; one already gone (deleted, replaced, expired at a lookup) is dropped.
        """
        by_key = self._by_key
        budget = SWEEP_PER_CONFIRM
        requeue: list[_Row] = []
        due = _NEVER
        for queue in self._queues.values():
            while queue and budget:
                row = queue[0]
                if row[3] > now:
                    break
                queue.popleft()
                budget -= 1
                # Pop first, put back if it was not this flow's entry: one hash per key
                # (a tuple's hash is computed anew each time, from cold memory here).
                original = row[0]
                current = by_key.pop(original, None)
                if current is None:
                    continue  # already gone
                if current[0] != original or current[3] > now:
                    by_key[original] = current  # another flow's reply tuple, or refreshed
                    if current[0] == original:
                        requeue.append(current)
                    continue
                reply = current[1]
                other = by_key.pop(reply, None)
                if other is not current and other is not None:
                    by_key[reply] = other
                if self._bysource:
                    self.source_mappings(original[0], original[1], original[2], original[5])  # prunes
            if queue and queue[0][3] < due:
                due = queue[0][3]
        self._due = due if budget else now  # out of budget: more may be due
        for row in requeue:
            self._enqueue(row, now)

    def refresh(self, entry: ConntrackEntry, *, reply: bool, mark: int) -> ConntrackEntry:
        """Account a packet of an existing entry: reply seen, new timeout, new ctmark.

        An SCTP entry that has seen no reply keeps its expiry: its packets can only be
        retransmitted INITs, which ``nf_conntrack_sctp_packet`` accepts without refreshing the
        entry (CLOSED to CLOSED), so a client cannot keep it, and its NAT, alive forever.
        """
        now = self.clock.now()
        seen = entry.seen_reply or reply
        proto = entry.original[5]
        expires = (
            entry.expires_s
            if proto == "sctp" and not seen
            else now + timeout_s(proto, seen, now - entry.created_s)
        )
        updated = replace(entry, seen_reply=seen, mark=mark, expires_s=expires)
        self.confirm(updated)
        return updated

    def entries(self) -> list[ConntrackEntry]:
        """Every live entry."""
        now = self.clock.now()
        seen: dict[int, _Row] = {}
        for row in self._by_key.values():
            if row[3] > now:
                seen[id(row)] = row
        return [_make_entry(*row) for row in seen.values()]

    def delete(self, predicate: Callable[[ConntrackEntry], bool]) -> int:
        """Delete every entry for which ``predicate`` holds (``conntrack -D``); return how many."""
        now = self.clock.now()
        doomed = {id(r): r for r in self._by_key.values() if r[3] > now and predicate(_make_entry(*r))}
        for row in doomed.values():
            self._remove(row)
        return len(doomed)

    def _remove(self, row: _Row) -> None:
        for k in (row[0], row[1]):
            if self._by_key.get(k) is row:
                del self._by_key[k]
