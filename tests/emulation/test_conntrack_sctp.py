"""SCTP conntrack timeouts in the emulator, as nf_conntrack_proto_sctp.c sets them.

The first packet of an association is an INIT; conntrack moves the new entry from ``sNO`` to
``sCL`` (CLOSED), whose timeout is 10 s (``sctp_timeouts[SCTP_CONNTRACK_CLOSED]``), and only
the peer's INIT_ACK brings COOKIE_WAIT (3 s). A retransmitted INIT in CLOSED is accepted
without refreshing the entry ("don't renew timeout on init retransmit"), so a client that is
never answered cannot keep the entry, and its NAT, alive. The real-kernel counterpart is
``tests/kernel/test_iptables_sctp.py::test_unreplied_init_conntrack_timeout`` (kernel 6.18:
``conntrack -L`` shows ``CLOSED`` with 9-10 s left right after the INIT).
"""

from __future__ import annotations

import random

from emulation.clock import ManualClock
from emulation.conntrack import timeout_s
from emulation.netfilter import Netns
from tests.emulation.helpers import netns, pkt

DNAT = """*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING -p sctp -m sctp --dport 80 -j DNAT --to-destination 10.0.1.1:8080
-A PREROUTING -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.1.1:8080
COMMIT
"""


def _setup() -> tuple[Netns, ManualClock]:
    clock = ManualClock()
    return netns(DNAT, clock=clock), clock


def _expiry(ns: Netns) -> float:
    (entry,) = ns.conntrack.entries()
    return entry.expires_s


def test_unreplied_sctp_entry_lives_ten_seconds() -> None:
    """An INIT nobody answers leaves an entry that expires 10 s later (CLOSED), not 3 s."""
    assert timeout_s("sctp", False, 0.0) == 10.0
    ns, clock = _setup()
    out = ns.send(pkt(protocol="sctp"), random.Random(0))
    assert (out.verdict, out.destination) == ("ACCEPT", "10.0.1.1:8080")
    assert _expiry(ns) == 10.0
    clock.advance(9.5)
    assert len(ns.conntrack.entries()) == 1
    clock.advance(0.5)
    assert ns.conntrack.entries() == []


def test_retransmitted_init_does_not_renew_the_entry() -> None:
    """A second INIT of the same flow 6 s later follows the entry's DNAT and leaves its expiry
    at 10 s; after that the entry is gone."""
    ns, clock = _setup()
    ns.send(pkt(protocol="sctp"), random.Random(0))
    clock.advance(6.0)
    again = ns.send(pkt(protocol="sctp"), random.Random(0))
    assert again.destination == "10.0.1.1:8080"
    assert _expiry(ns) == 10.0
    clock.advance(4.0)
    assert ns.conntrack.entries() == []


def test_replied_sctp_entry_is_refreshed() -> None:
    """Once a reply was seen, packets of either direction renew the entry (210 s)."""
    ns, clock = _setup()
    out = ns.send(pkt(protocol="sctp"), random.Random(0))
    clock.advance(1.0)
    ns.send(out.packet.reply(), random.Random(0))
    assert _expiry(ns) == 1.0 + 210.0
    clock.advance(5.0)
    ns.send(pkt(protocol="sctp"), random.Random(0))
    assert _expiry(ns) == 6.0 + 210.0


def test_unreplied_tcp_entry_is_still_renewed() -> None:
    """Other protocols are unchanged: a retransmitted SYN renews its unreplied entry (120 s)."""
    ns, clock = _setup()
    ns.send(pkt(), random.Random(0))
    clock.advance(6.0)
    ns.send(pkt(), random.Random(0))
    assert _expiry(ns) == 6.0 + 120.0
