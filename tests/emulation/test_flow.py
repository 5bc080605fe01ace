# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Hook order, routing after DNAT, conntrack reuse of NAT, replies and timeouts."""

from __future__ import annotations

import random

import pytest

from emulation.clock import ManualClock
from emulation.netfilter import Netns, load
from emulation.packet import Packet
from tests.emulation.helpers import KUBE_NAT, RNG, make_node, netns, pkt


def test_hook_order_for_a_forwarded_packet() -> None:
    """A forwarded packet meets raw, mangle, nat PREROUTING, then mangle, filter FORWARD, then mangle, nat POSTROUTING."""
    tables = {
        "raw": ("PREROUTING",),
        "mangle": ("PREROUTING", "FORWARD", "POSTROUTING", "INPUT"),
        "nat": ("PREROUTING", "POSTROUTING", "INPUT"),
        "filter": ("FORWARD", "INPUT"),
    }
    text = "".join(
        f"*{t}\n" + "".join(f":{c} ACCEPT [0:0]\n-A {c} -j LOG\n" for c in chains) + "COMMIT\n"
        for t, chains in tables.items()
    )
    out = netns(text).send(pkt(dst="10.0.1.1"), RNG, trace=True)
    seen = [(s.table, s.chain) for s in out.trace if s.index]
    assert seen == [
        ("raw", "PREROUTING"),
        ("mangle", "PREROUTING"),
        ("nat", "PREROUTING"),
        ("mangle", "FORWARD"),
        ("filter", "FORWARD"),
        ("mangle", "POSTROUTING"),
        ("nat", "POSTROUTING"),
    ]


def test_local_delivery_order() -> None:
    """A packet for the node goes mangle INPUT, filter INPUT, then nat INPUT."""
    text = (
        "*mangle\n:INPUT ACCEPT [0:0]\n-A INPUT -j LOG\nCOMMIT\n*nat\n:INPUT ACCEPT [0:0]\n-A INPUT -j LOG\nCOMMIT\n"
        "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j LOG\nCOMMIT\n"
    )
    out = netns(text).send(pkt(), RNG, trace=True)
    assert [s.table for s in out.trace if s.index] == ["mangle", "filter", "nat"]
    assert out.delivery == "local"


def test_locally_generated_packet_uses_output_and_masquerades() -> None:
    """A packet from the node to a ClusterIP goes through nat OUTPUT, is DNATed and masqueraded."""
    ns = netns(KUBE_NAT)
    out = ns.send(Packet(src="192.168.0.2", dst="172.30.0.41", sport=5000, dport=80), RNG)
    assert out.dnat and out.masquerade
    assert out.packet.dst.startswith("10.0.1.")
    assert out.packet.src == "10.0.0.1"  # cni0's address, toward the pod


def test_pod_source_is_not_masqueraded() -> None:
    """A pod (10.0.0.0/8) reaching a ClusterIP keeps its source address."""
    out = netns(KUBE_NAT).send(pkt(src="10.0.2.9", dst="172.30.0.41", in_interface="cni0"), RNG)
    assert out.dnat and not out.masquerade and out.packet.src == "10.0.2.9"


def test_hairpin_is_masqueraded() -> None:
    """An endpoint reaching itself through the service is masqueraded (KUBE-SEP hairpin rule)."""
    ns = netns(KUBE_NAT)
    outcomes = ns.enumerate(pkt(src="10.0.1.1", dst="172.30.0.41", in_interface="cni0"))
    hairpin = [o for _, o in outcomes if o.packet.dst == "10.0.1.1"]
    assert hairpin and hairpin[0].masquerade
    assert not any(o.masquerade for _, o in outcomes if o.packet.dst != "10.0.1.1")


def test_nat_is_decided_once_per_flow() -> None:
    """Every packet of a flow goes to the endpoint its first packet was sent to, without the nat table."""
    ns = netns(KUBE_NAT)
    first = ns.send(pkt(dst="172.30.0.41"), RNG)
    for seed in range(20):
        import random

        later = ns.send(pkt(dst="172.30.0.41", syn=False), random.Random(seed), trace=True)
        assert later.packet.dst == first.packet.dst
        assert not any(s.table == "nat" for s in later.trace)


def test_reply_is_translated_back() -> None:
    """The endpoint's reply to a masqueraded client leaves with the service address as source."""
    ns = netns(KUBE_NAT)
    first = ns.send(pkt(dst="172.30.0.41"), RNG)
    reply = Packet(
        src=first.packet.dst,
        dst=first.packet.src,
        sport=first.packet.dport,
        dport=first.packet.sport,
        in_interface="cni0",
        syn=False,
    )
    back = ns.send(reply, RNG)
    assert (back.packet.src, back.packet.sport, back.packet.dst, back.packet.dport) == (
        "172.30.0.41",
        80,
        "203.0.113.2",
        40000,
    )
    assert back.ctstate == "ESTABLISHED"
    assert ns.send(pkt(dst="172.30.0.41", syn=False), RNG).ctstate == "ESTABLISHED"


def test_original_direction_stays_new_until_a_reply() -> None:
    """A second packet before any reply is still NEW (as nf_conntrack reports it)."""
    ns = netns(KUBE_NAT)
    ns.send(pkt(protocol="udp", dport=53), RNG)
    assert ns.send(pkt(protocol="udp", dport=53), RNG).ctstate == "NEW"


def test_udp_entry_times_out_after_30_seconds() -> None:
    """An unreplied UDP flow is forgotten after 30 s, so NAT is decided afresh."""
    clock = ManualClock()
    ns = netns(KUBE_NAT, clock=clock)
    ns.send(pkt(protocol="udp", dport=53), RNG)
    clock.advance(29.9)
    assert len(ns.conntrack.entries()) == 1
    clock.advance(0.2)
    assert ns.conntrack.entries() == []


def test_tcp_established_lasts_five_days() -> None:
    """A replied TCP flow lives 432000 s from its last packet."""
    clock = ManualClock()
    ns = netns("", clock=clock)
    ns.send(pkt(), RNG)
    ns.send(Packet(src="192.168.0.2", dst="203.0.113.2", sport=80, dport=40000, syn=False), RNG)
    clock.advance(431999)
    assert len(ns.conntrack.entries()) == 1
    clock.advance(2)
    assert ns.conntrack.entries() == []


def test_martian_localhost_destination_is_dropped_without_route_localnet() -> None:
    """A packet for 127.0.0.1 arriving on eth0 is dropped unless route_localnet is set."""
    out = netns().send(pkt(dst="127.0.0.1"), RNG)
    assert out.verdict == "DROP" and "martian" in out.reason


def test_no_route_drops() -> None:
    """Without a matching route (IPv6 here has a default, so use an unroutable v4 node) a packet is dropped."""
    from emulation.clock import ManualClock as Clock
    from emulation.netfilter import Netns
    from emulation.node import Interface, Node

    ns = Netns(Node(interfaces=(Interface(name="eth0", addresses=("192.168.0.2/24",)),)), Clock())
    out = ns.send(pkt(dst="8.8.8.8"), RNG)
    assert (out.verdict, out.reason) == ("DROP", "route: unreachable")


def test_a_packet_of_the_other_family_is_refused() -> None:
    """One Netns holds one family's rules; an IPv4 packet to ip6tables rules is an error, not ACCEPT."""
    ns = Netns(make_node(), ManualClock(), ruleset=load("*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n", version=6))
    with pytest.raises(ValueError, match="IPv4 packet sent to IPv6 rules"):
        ns.send(pkt(), random.Random(1))
    with pytest.raises(ValueError, match="one family"):
        ns.enumerate(pkt())


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
