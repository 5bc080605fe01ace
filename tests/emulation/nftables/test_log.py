"""``log``: parsed with its options, listed as nft lists it, and without effect on the packet."""

from __future__ import annotations

import random

import pytest

from emulation import Interface, ManualClock, Node, Packet, Route
from emulation.nftables import Netns, NftablesError, load

RULES = """\
table inet f {
\tchain input {
\t\ttype filter hook input priority filter; policy drop;
\t\ttcp dport 22 log prefix "ssh: " level info accept
\t}
}
"""


def test_log_goes_on_to_the_rest_of_the_rule() -> None:
    """A logged packet is still accepted by the rule's verdict; others meet the drop policy."""
    node = Node(interfaces=(Interface(name="eth0", addresses=("10.99.0.1/24",)),),
                routes=(Route(destination="10.99.0.0/24", device="eth0"),))
    netns = Netns(node, ManualClock(), ruleset=load(RULES))

    def send(port: int) -> str:
        packet = Packet(src="10.99.0.2", dst="10.99.0.1", sport=40000, dport=port, protocol="tcp",
                        in_interface="eth0")
        return str(netns.send(packet, random.Random(0)).verdict)

    assert send(22) == "ACCEPT"
    assert send(80) == "DROP"


@pytest.mark.parametrize("bad", ['log prefix ssh accept', "log level loud accept", "log group x accept",
                                 "log level info group 2 accept", "log snaplen 64 accept"])
def test_malformed_log_options_are_errors_naming_the_line(bad: str) -> None:
    """An unquoted prefix, an unknown level, a non-numeric group, level with group, snaplen without
    group (nft refuses the last two too) are refused with their line."""
    with pytest.raises(NftablesError, match="line 4"):
        load(RULES.replace('tcp dport 22 log prefix "ssh: " level info accept', bad))
