# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Defects a fresh user found in session 3, each checked against the kernel by them first."""

from __future__ import annotations

import random

from emulation.clock import ManualClock
from emulation.netfilter import Netns
from emulation.node import Interface, Node, Route
from emulation.packet import Packet
from tests.emulation.helpers import netns

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


def test_masquerade_out_a_device_without_an_ipv4_address_takes_another_devices() -> None:
    """inet_select_addr walks every device when the output one has no address (Calico's
    cali* veths): the first universe-scope address, loopback's 127/8 excluded."""
    node = Node(
        interfaces=(
            Interface(name="lo", addresses=("127.0.0.1/8",)),
            Interface(name="eth0", addresses=("192.168.0.2/24",)),
            Interface(name="cali1", addresses=()),
        ),
        routes=(
            Route(destination="default", device="eth0", via="192.168.0.1"),
            Route(destination="10.0.0.9/32", device="cali1"),
        ),
    )
    ns = Netns(node, ManualClock())
    ns.restore("*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o cali1 -j MASQUERADE\nCOMMIT\n")
    out = ns.send(Packet(src="198.51.100.1", dst="10.0.0.9", sport=40000, dport=53, protocol="udp", in_interface="eth0"),
                  random.Random(0))  # fmt: skip
    assert (out.verdict, out.packet.src) == ("ACCEPT", "192.168.0.2")


def test_enumerate_finds_a_free_port_when_one_exists() -> None:
    """enumerate searches the whole range once (from offset 0): with ports 2000-2189 of
    2000-2199 mapped, a flow from outside the range is accepted on 2190, as send() and the
    kernel accept it (128 tries from offset 0, and the shrinking rounds after them, also from
    0, would never leave 2000-2127)."""
    ns = netns("*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o eth0 -p udp -j SNAT --to-source 192.168.0.2:2000-2199\nCOMMIT\n")
    rng = random.Random(0)
    for i in range(190):  # each keeps its own port (inside the range, free)
        assert ns.send(_pod(2000 + i), rng).packet.sport == 2000 + i
    outs = ns.enumerate(_pod(50000))
    assert [(o.verdict, o.packet.sport) for _, o in outs] == [("ACCEPT", 2190)]
    assert ns.send(_pod(50000), rng).packet.sport in range(2190, 2200)


def test_martian_sources_are_dropped_at_input_routing() -> None:
    """ip_route_input_slow refuses a multicast, limited-broadcast or 0.0.0.0/8 source (after
    PREROUTING, whose rules still count the packet)."""
    ns = netns("*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -p tcp\nCOMMIT\n")
    rng = random.Random(0)
    for src in ("0.0.0.0", "0.1.2.3", "255.255.255.255", "224.0.0.5"):
        out = ns.send(Packet(src=src, dst="192.168.0.2", sport=1, dport=80, in_interface="eth0"), rng)
        assert (out.verdict, out.reason.split(" (")[0]) == ("DROP", "martian source"), src
    assert "[4:240] -A PREROUTING -p tcp" in ns.save(counters=True)
    ok = ns.send(Packet(src="203.0.113.1", dst="192.168.0.2", sport=1, dport=80, in_interface="eth0"), rng)
    assert ok.verdict == "ACCEPT"
