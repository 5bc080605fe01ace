"""``fib saddr . iif oif``: the reverse-path lookup firewalld's rpfilter writes (``nft_fib4_eval``)."""

from __future__ import annotations

import random

import pytest

from emulation import Interface, ManualClock, Node, Packet, Route
from emulation.nftables import Netns, NftablesError, list_ruleset, load

RPFILTER = """\
table inet rpfilter {
\tchain prerouting {
\t\ttype filter hook prerouting priority filter + 10; policy accept;
\t\tfib saddr . iif oif missing counter packets 0 bytes 0 drop
\t\tfib saddr . mark . iif oif exists counter packets 0 bytes 0 accept
\t}
}
"""


def _netns() -> Netns:
    node = Node(interfaces=(Interface(name="eth0", addresses=("10.99.1.1/24",)),
                            Interface(name="eth1", addresses=("10.99.2.1/24",))),
                routes=(Route(destination="10.99.1.0/24", device="eth0"),
                        Route(destination="10.99.2.0/24", device="eth1")))
    return Netns(node, ManualClock(), ruleset=load(RPFILTER))


def _send(src: str, iif: str) -> str:
    packet = Packet(src=src, dst="10.99.2.1", sport=40000, dport=80, protocol="tcp", in_interface=iif)
    return str(_netns().send(packet, random.Random(0)).verdict)


def test_source_routed_back_out_of_its_input_interface_passes() -> None:
    """A source whose route leaves by the interface it came in on: oif exists, the packet goes on."""
    assert _send("10.99.2.2", "eth1") == "ACCEPT"


def test_spoofed_source_from_the_wrong_interface_is_dropped() -> None:
    """A source routed out of eth0 arriving on eth1: oif missing, dropped (strict reverse path)."""
    assert _send("10.99.1.5", "eth1") == "DROP"


def test_unroutable_and_local_sources_find_no_interface() -> None:
    """No route back, or a source that is one of the node's own addresses: missing."""
    assert _send("192.0.2.9", "eth1") == "DROP"
    assert _send("10.99.1.1", "eth1") == "DROP"


def test_listing_keeps_the_reverse_path_expressions() -> None:
    """Both forms list back as nft prints them."""
    assert list_ruleset(load(RPFILTER)) == RPFILTER


def test_reverse_path_needs_its_comparison_word() -> None:
    """oif compares with missing or exists only; anything else is an error naming the line."""
    with pytest.raises(NftablesError, match="line 4"):
        load(RPFILTER.replace("oif missing", "oif sometimes"))
