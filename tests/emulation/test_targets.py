# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Targets: verdicts, NAT, marks, jumps and gotos."""

from __future__ import annotations

import random

import pytest

from emulation.clock import ManualClock
from emulation.netfilter import Netns
from emulation.node import Interface, Node, Route
from emulation.packet import Packet
from tests.emulation.helpers import RNG, netns, pkt


def nat_prerouting(rule: str) -> str:
    return f"*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n-A PREROUTING {rule}\nCOMMIT\n"


@pytest.mark.parametrize(
    ("target", "verdict"),
    [
        ("ACCEPT", "ACCEPT"),
        ("DROP", "DROP"),
        ("REJECT", "REJECT"),
        ("REJECT --reject-with tcp-reset", "REJECT"),
        ("LOG --log-prefix x", "ACCEPT"),
        ("RETURN", "ACCEPT"),
    ],
)
def test_filter_verdicts(target: str, verdict: str) -> None:
    """ACCEPT, DROP and REJECT end the packet; LOG continues; RETURN in a built-in chain means policy."""
    ns = netns(f"*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp -j {target}\nCOMMIT\n")
    assert ns.send(pkt(), RNG).verdict == verdict


def test_dnat_rewrites_destination_and_routing_follows() -> None:
    """DNAT in nat PREROUTING changes the destination, and routing then forwards the packet."""
    ns = netns(nat_prerouting("-p tcp -d 192.168.0.2 --dport 80 -j DNAT --to-destination 10.0.1.1:8080"))
    out = ns.send(pkt(), RNG)
    assert (out.delivery, out.out_interface, out.destination, out.dnat) == (
        "forward",
        "cni0",
        "10.0.1.1:8080",
        True,
    )


def test_dnat_to_local_address_is_delivered_locally() -> None:
    """A DNAT to one of the node's own addresses goes to INPUT, not FORWARD."""
    ns = netns(nat_prerouting("-p tcp -j DNAT --to-destination 10.0.0.1"))
    out = ns.send(pkt(dst="172.30.0.1"), RNG)
    assert (out.delivery, out.destination) == ("local", "10.0.0.1:80")


def test_snat_in_postrouting() -> None:
    """SNAT rewrites the source of a forwarded packet."""
    text = (
        "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n"
        "-A POSTROUTING -o eth0 -p tcp -j SNAT --to-source 192.168.0.2:1000\nCOMMIT\n"
    )
    out = netns(text).send(pkt(src="10.0.1.5", dst="8.8.8.8", in_interface="cni0"), RNG)
    assert (out.packet.src, out.packet.sport, out.snat, out.masquerade) == ("192.168.0.2", 1000, True, False)


def test_masquerade_uses_out_interface_address() -> None:
    """MASQUERADE picks the outgoing interface's address (keeping the port)."""
    text = "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING ! -o cni0 -j MASQUERADE\nCOMMIT\n"
    out = netns(text).send(pkt(src="10.0.1.5", dst="8.8.8.8", in_interface="cni0"), RNG)
    assert (out.packet.src, out.packet.sport, out.masquerade, out.out_interface) == (
        "192.168.0.2",
        40000,
        True,
        "eth0",
    )


def test_masquerade_to_ports() -> None:
    """MASQUERADE --to-ports: a source port outside the range gets one inside it (from a random
    offset, nf_nat_l4proto_unique_tuple); one inside it is kept (get_unique_tuple step 2)."""
    text = (
        "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -p tcp -j MASQUERADE --to-ports 2000-3000\nCOMMIT\n"
    )
    ns = netns(text)
    ports = {ns.send(pkt(src="10.0.1.5", dst="8.8.8.8", sport=40000 + i, in_interface="cni0"), RNG).packet.sport
             for i in range(20)}  # fmt: skip
    assert all(2000 <= p <= 3000 for p in ports) and len(ports) > 1
    kept = ns.send(pkt(src="10.0.1.5", dst="8.8.8.8", sport=2500, in_interface="cni0"), RNG)
    assert kept.packet.sport == 2500


def test_redirect_goes_to_the_in_interface_address() -> None:
    """REDIRECT sends an arriving packet to the in-interface's primary address and the given port."""
    out = netns(nat_prerouting("-p tcp -j REDIRECT --to-ports 15001")).send(pkt(dst="1.1.1.1"), RNG)
    assert (out.delivery, out.destination) == ("local", "192.168.0.2:15001")


@pytest.mark.parametrize(
    ("mark_args", "start", "end"),
    [
        ("--set-xmark 0x4000/0xffffffff", 0x1, 0x4000),
        ("--or-mark 0x4000", 0x1, 0x4001),
        ("--and-mark 0x1", 0x4001, 0x1),
        ("--xor-mark 0x4000", 0x4001, 0x1),
        ("--set-mark 0x2/0x3", 0x5, 0x6),
    ],
)
def test_mark_target(mark_args: str, start: int, end: int) -> None:
    """MARK sets, ors, ands and xors the packet mark as ``(mark & ~mask) ^ value``."""
    text = f"*mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j MARK {mark_args}\nCOMMIT\n"
    assert netns(text).send(pkt(mark=start), RNG).packet.mark == end


def test_connmark_save_and_restore() -> None:
    """CONNMARK --save-mark stores the packet mark in the flow; --restore-mark brings it back later."""
    text = (
        "*mangle\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -m conntrack --ctstate NEW -j MARK --set-mark 0x7\n"
        "-A PREROUTING -m conntrack --ctstate NEW -j CONNMARK --save-mark\n"
        "-A PREROUTING -m conntrack --ctstate ESTABLISHED -j CONNMARK --restore-mark\nCOMMIT\n"
    )
    ns = netns(text)
    first = ns.send(pkt(), RNG)
    assert first.packet.mark == 0x7
    ns.send(pkt(src="192.168.0.2", dst="203.0.113.2", sport=80, dport=40000, in_interface=None), RNG)
    assert ns.send(pkt(syn=False), RNG).packet.mark == 0x7


def test_jump_returns_and_goto_does_not() -> None:
    """After a jump the caller continues; after a goto the caller's caller does."""
    text = (
        "*filter\n:INPUT DROP [0:0]\n:A - [0:0]\n:B - [0:0]\n"
        "-A INPUT -j A\n-A INPUT -j ACCEPT\n-A A -g B\n-A A -j DROP\n-A B -j RETURN\nCOMMIT\n"
    )
    out = netns(text).send(pkt(), RNG, trace=True)
    assert out.verdict == "ACCEPT"
    assert [(s.chain, s.index) for s in out.trace] == [("INPUT", 1), ("A", 1), ("B", 1), ("INPUT", 2)]


def test_notrack_makes_the_packet_untracked() -> None:
    """CT --notrack in raw leaves the packet UNTRACKED and skips nat."""
    text = "*raw\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j CT --notrack\nCOMMIT\n" + nat_prerouting(
        "-j DNAT --to-destination 10.0.1.1"
    )
    out = netns(text).send(pkt(), RNG)
    assert (out.ctstate, out.dnat) == ("UNTRACKED", False)


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
