# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""When conntrack entries are made and updated: the reply tuple of a new flow, the reply bit
and the refresh of a packet dropped later, the confirmation of a packet of the node to itself."""

from __future__ import annotations

import random

from emulation.clock import ManualClock
from emulation.netfilter import Netns, load
from emulation.packet import Packet
from tests.emulation.helpers import make_node, netns, pkt

MASQ_AND_DROP_REPLIES = """*nat
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -o eth0 -j MASQUERADE
COMMIT
*filter
:FORWARD ACCEPT [0:0]
-A FORWARD -i eth0 -p udp -j {target}
-A FORWARD -i cni0 -m conntrack --ctstate NEW
-A FORWARD -i cni0 -m conntrack --ctstate ESTABLISHED
COMMIT
"""


def _pod(sport: int = 40000) -> Packet:
    return Packet(src="10.0.0.5", dst="198.51.100.1", sport=sport, dport=53, protocol="udp", in_interface="cni0", length=36)


def test_the_reply_tuple_is_known_on_a_flows_first_packet() -> None:
    """``--ctreplsrc`` matches the first packet (the kernel builds the reply tuple in the
    conntrack hook), and after DNAT it is the new destination (nf_conntrack_alter_reply)."""
    rules = """*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -m conntrack --ctreplsrc 8.8.8.8 -j MARK --or-mark 0x1
-A FORWARD -m conntrack --ctreplsrc 10.0.1.9 --ctrepldst 10.0.1.5 -j MARK --or-mark 0x2
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -d 8.8.8.8/32 -p tcp -j DNAT --to-destination 10.0.1.9:80
COMMIT
"""
    for cache in (True, False):
        ns = Netns(make_node(), ManualClock(), ruleset=load(rules))
        ns.cache_flows = cache
        for sport in (1, 2, 3):
            out = ns.send(
                pkt(src="10.0.1.5", dst="8.8.8.8", sport=sport, dport=80, in_interface="cni0"),
                random.Random(1),
            )
            assert out.packet.mark == 0x3, (cache, sport)


def test_a_dropped_reply_still_marks_the_flow_replied() -> None:
    """nf_conntrack_in sets IPS_SEEN_REPLY when it sees the reply at PREROUTING, before filter
    drops or rejects it: the flow's next packet is ESTABLISHED (kernel: kt9 in the report)."""
    for target in ("DROP", "REJECT"):
        ns = netns(MASQ_AND_DROP_REPLIES.format(target=target))
        rng = random.Random(0)
        first = ns.send(_pod(), rng)
        reply = ns.send(Packet(src="198.51.100.1", dst="192.168.0.2", sport=53, dport=first.packet.sport,
                               protocol="udp", in_interface="eth0", length=36), rng)  # fmt: skip
        assert reply.verdict == target
        assert [e.seen_reply for e in ns.conntrack.entries()] == [True]
        assert ns.send(_pod(), rng).ctstate == "ESTABLISHED"


def test_a_dropped_packet_refreshes_its_entry_and_writes_its_connmark() -> None:
    """nf_ct_refresh_acct and CONNMARK act at once: a packet dropped later in FORWARD still
    extends its entry's timeout and sets the connection mark."""
    rules = """*mangle
:PREROUTING ACCEPT [0:0]
-A PREROUTING -i cni0 -p udp -m conntrack --ctstate ESTABLISHED -j CONNMARK --set-mark 5
COMMIT
*filter
:FORWARD ACCEPT [0:0]
-A FORWARD -i cni0 -m conntrack --ctstate ESTABLISHED -j DROP
COMMIT
"""
    clock = ManualClock()
    ns = netns(rules, clock=clock)
    rng = random.Random(0)
    ns.send(_pod(), rng)
    ns.send(Packet(src="198.51.100.1", dst="10.0.0.5", sport=53, dport=40000, protocol="udp", in_interface="eth0"), rng)
    clock.advance(6.0)
    assert ns.send(_pod(), rng).verdict == "DROP"
    (entry,) = ns.conntrack.entries()
    assert entry.mark == 5
    assert entry.expires_s == 6.0 + 120.0  # refreshed: replied and older than 2 s (UDP stream)


def test_a_packet_of_the_node_to_itself_keeps_its_entry_when_input_drops_it() -> None:
    """ipv4_confirm runs at POSTROUTING, before the packet loops back over lo: a DROP in INPUT
    leaves the entry, and the flow's next packet does not walk nat again."""
    rules = """*nat
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A OUTPUT -p udp
-A POSTROUTING -p udp
COMMIT
*filter
:INPUT ACCEPT [0:0]
-A INPUT -p udp --dport 12 -j DROP
COMMIT
"""
    ns = netns(rules)
    rng = random.Random(0)
    p = Packet(src="192.168.0.2", dst="192.168.0.2", sport=40010, dport=12, protocol="udp")
    assert ns.send(p, rng).verdict == "DROP"
    assert len(ns.conntrack.entries()) == 1
    ns.send(p, rng)
    counts = {line.split("] ", 1)[1]: line.split("]")[0] + "]" for line in ns.save(counters=True).splitlines()
              if line.startswith("[") and "-A" in line}  # fmt: skip
    assert counts["-A OUTPUT -p udp"] == "[1:60]"
    assert counts["-A POSTROUTING -p udp"] == "[1:60]"
