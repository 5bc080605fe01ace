"""Expired conntrack entries leave memory as new ones are confirmed (the kernel's gc_worker)."""

from __future__ import annotations

from emulation.clock import ManualClock
from emulation.conntrack import ConntrackEntry, ConntrackTable, timeout_s


def _entry(i: int, now: float, proto: str = "tcp") -> ConntrackEntry:
    original = (4, 0x0A000001, 1000 + i, 0x0A000002, 80, proto)
    reply = (4, 0x0A000002, 80, 0x0A000001, 1000 + i, proto)
    expires = now + timeout_s(proto, False, 0)
    return ConntrackEntry(original=original, reply=reply, created_s=now, expires_s=expires)


def test_expired_entries_are_removed_as_new_ones_arrive() -> None:
    """Unreplied TCP entries live 120 s; one new flow a second keeps the last 119 or 120 of them."""
    clock = ManualClock()
    table = ConntrackTable(clock)
    for i in range(1000):
        table.confirm(_entry(i, clock.now()))
        clock.advance(1.0)
    live = table.entries()
    assert len(live) == 119  # created at 881..999 s, the clock at 1000 s
    assert len(table._by_key) <= 2 * 125  # both tuples of each entry, a few not swept yet
    assert table.lookup(live[0].original) is not None


def test_a_refreshed_entry_is_not_swept_at_its_first_expiry() -> None:
    """A flow that saw a reply lives on (432000 s) although its unreplied timeout passed."""
    clock = ManualClock()
    table = ConntrackTable(clock)
    first = _entry(0, 0.0)
    table.confirm(first)
    table.refresh(first, reply=True, mark=0)
    for i in range(1, 400):
        clock.advance(1.0)
        table.confirm(_entry(i, clock.now()))
    found = table.lookup(first.original)
    assert found is not None and found[0].seen_reply
