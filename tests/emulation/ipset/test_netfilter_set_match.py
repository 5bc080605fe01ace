"""The ipset model plugged into the netfilter model's `-m set` match through `set_lookup`."""

from __future__ import annotations

import random

from emulation.clock import ManualClock
from emulation.ipset import load_save
from emulation.netfilter import Netns
from emulation.packet import Packet
from tests.emulation.helpers import make_node

RULES = """*filter
:INPUT DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
COMMIT
"""
SETS = """create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
add KUBE-CLUSTER-IP 192.168.0.2,tcp:443
"""


def test_set_match_uses_the_ipset_model() -> None:
    """A packet to a member ip,port is accepted; another port falls to the DROP policy."""
    sets = load_save(SETS)
    ns = Netns(make_node(), ManualClock(), set_lookup=sets.lookup)
    ns.restore(RULES)
    hit = Packet(src="192.168.0.9", dst="192.168.0.2", sport=1000, dport=443, in_interface="eth0")
    miss = Packet(src="192.168.0.9", dst="192.168.0.2", sport=1000, dport=444, in_interface="eth0")
    assert ns.send(hit, random.Random(1)).verdict == "ACCEPT"
    assert ns.send(miss, random.Random(1)).verdict == "DROP"
