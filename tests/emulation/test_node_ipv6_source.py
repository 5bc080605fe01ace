"""IPv6 MASQUERADE source selection in :class:`emulation.Node` follows ``ipv6_dev_get_saddr``.

Found by ``tests/kernel/test_iptables_ipv6.py``: on a node whose pod veths carry only a
link-local gateway (as Calico routes IPv6 pods), the kernel masquerades traffic leaving a pod
veth to a global address of another interface (RFC 6724 over all interfaces, longest matching
prefix), while the emulator used to take the veth's first address, ``fe80::1``.
"""

from __future__ import annotations

from emulation import Interface, ManualClock, Node, Packet, Route
from emulation.addr import parse_address
from emulation.netfilter import Netns, Ruleset


def _node(*extra: Interface) -> Node:
    return Node(
        interfaces=(
            Interface(name="eth0", addresses=("fd00:ff::1/64",)),
            Interface(name="eth1", addresses=("fd00:1::2/64",)),
            Interface(name="vp1", addresses=("fe80::1/64",)),
            *extra,
        ),
        routes=(Route(destination="fd00:10:180::1/128", device="vp1"),),
    )


def _v6(text: str) -> int:
    return parse_address(text)[1]


def test_link_local_only_device_takes_a_global_address_of_another_interface() -> None:
    """A global destination out of a link-local-only veth gets the global address sharing the
    longest prefix with it (fd00:1::2 shares 27 bits with fd00:10:180::1, fd00:ff::1 24)."""
    assert _node().source_address("vp1", 6, None, _v6("fd00:10:180::1")) == "fd00:1::2"


def test_the_out_device_wins_among_global_addresses() -> None:
    """Rule 5: a global address on the out interface beats a longer prefix elsewhere."""
    node = _node(Interface(name="vp2", addresses=("fe80::1/64", "fd00:10:180::ff/128")))
    assert node.source_address("vp2", 6, None, _v6("fd00:1::9")) == "fd00:10:180::ff"


def test_a_link_local_destination_only_uses_the_out_device() -> None:
    """Link-local destinations choose among the out interface's addresses only."""
    assert _node().source_address("vp1", 6, None, _v6("fe80::9")) == "fe80::1"


def test_the_prefix_is_counted_at_most_to_the_candidate_prefix_length() -> None:
    """Rule 8 caps the shared prefix at the candidate's prefix length: a /48 that contains the
    destination ties with a /64 that shares 48 bits of it, and the first candidate stays."""
    node = Node(
        interfaces=(
            Interface(name="a", addresses=("fd00:1::1/48",)),
            Interface(name="b", addresses=("fd00:1:0:ffff::1/64",)),
        )
    )
    assert node.source_address("c", 6, None, _v6("fd00:1::9")) == "fd00:1::1"


def test_ipv4_is_unchanged() -> None:
    """IPv4 still takes the out interface's address in the next hop's subnet."""
    node = Node(interfaces=(Interface(name="eth0", addresses=("10.0.0.1/24", "10.1.0.1/24")),))
    assert node.source_address("eth0", 4, "10.1.0.9", 0) == "10.1.0.1"


def test_masquerade_out_of_a_link_local_veth_in_the_evaluator() -> None:
    """End to end: a forwarded packet masqueraded out of vp1 leaves from fd00:1::2."""
    netns = Netns(_node(), ManualClock(), ruleset=Ruleset(6))
    netns.restore("*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o vp1 -j MASQUERADE\nCOMMIT\n")
    ((_, outcome),) = netns.enumerate(
        Packet(src="fd00:ff::2", dst="fd00:10:180::1", sport=4000, dport=80, in_interface="eth0")
    )
    assert outcome.verdict == "ACCEPT" and outcome.masquerade
    assert outcome.packet.src == "fd00:1::2"
