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


def test_sweeping_matches_a_naive_table_under_mixed_timeouts_and_shared_tuples() -> None:
    """Interleaved TCP/UDP/SCTP entries, refreshes, and flows whose original tuple is another
    flow's reply tuple: every lookup agrees with a table that never sweeps, and memory stays
    bounded by the live entries (a regression test for the one-hash-per-key sweep)."""
    import random

    rng = random.Random(7)
    clock = ManualClock()
    table = ConntrackTable(clock)
    naive: dict[tuple[int, int, int, int, int, str], ConntrackEntry] = {}  # by both tuples
    keys: list[tuple[int, int, int, int, int, str]] = []
    for step in range(6000):
        proto = rng.choice(("tcp", "udp", "sctp"))
        a, b = rng.randrange(40), rng.randrange(40)
        original = (4, 0x0A000000 + a, 1000 + b, 0x0A000100 + b, 80, proto)
        reply = (4, 0x0A000100 + b, 80, 0x0A000000 + a, 1000 + b, proto)
        roll = rng.random()
        if roll < 0.1:  # a flow whose original tuple is an existing flow's reply
            reply, original = original, reply
        elif roll < 0.2:  # two flows translated to one reply tuple (a NAT clash)
            original = (4, 0x0A000200 + a, 2000 + b, 0x0A000100 + b, 80, proto)
        now = clock.now()
        if rng.random() < 0.2 and keys:
            found = table.lookup(rng.choice(keys))
            if found is not None:
                updated = table.refresh(found[0], reply=True, mark=step)
                for k in (updated.original, updated.reply):
                    naive[k] = updated
        else:
            entry = ConntrackEntry(
                original=original, reply=reply, created_s=now, expires_s=now + timeout_s(proto, False, 0)
            )
            old = naive.get(original)
            if old is not None and old.original == original:
                for k in (old.original, old.reply):
                    if naive.get(k) is old:
                        del naive[k]
            table.confirm(entry)
            naive[original] = naive[reply] = entry
            keys.append(original)
        clock.advance(rng.choice((0.01, 0.5, 3.0)))
        probe = rng.choice(keys)
        want = naive.get(probe)
        got = table.lookup(probe)
        if want is None or want.expires_s <= clock.now():
            assert got is None
        else:
            assert got is not None and got[0] == want
    live = {id(e): e for e in naive.values() if e.expires_s > clock.now()}
    assert {e.original for e in table.entries()} == {e.original for e in live.values()}
    assert len(table._by_key) <= 2 * len(live) + 64


def test_source_mappings_are_built_at_first_use_in_creation_order() -> None:
    """NAT's bysource view: the remapped entries of one original source, most recent first,
    whether they were confirmed before its first use or after; a refresh keeps an entry's
    place, and an expired entry leaves it."""
    clock = ManualClock()
    table = ConntrackTable(clock)
    client = (4, 0x0A000005, 40000)

    def flow(dst: int, mapped_port: int, now: float) -> ConntrackEntry:
        original = (*client, dst, 53, "udp")
        reply = (4, dst, 53, 0xC0A80002, mapped_port, "udp")
        return ConntrackEntry(original=original, reply=reply, created_s=now, expires_s=now + 30)

    first = flow(0x08080808, 50001, 0.0)
    table.confirm(first)
    clock.advance(1)
    table.confirm(flow(0x09090909, 50002, 1.0))
    assert table.source_mappings(4, 0x0A000005, 40000, "udp") == [(0xC0A80002, 50002), (0xC0A80002, 50001)]
    clock.advance(1)
    table.confirm(flow(0x01010101, 40000, 2.0))  # not remapped, but its source is kept now
    table.refresh(first, reply=True, mark=0)
    assert table.source_mappings(4, 0x0A000005, 40000, "udp") == [
        (0xC0A80002, 40000), (0xC0A80002, 50002), (0xC0A80002, 50001)]  # fmt: skip
    clock.advance(30.5)  # the second and third expire; the refreshed first lives on (120 s)
    assert table.source_mappings(4, 0x0A000005, 40000, "udp") == [(0xC0A80002, 50001)]
    assert table.source_mappings(4, 0x0A000006, 40000, "udp") == []
