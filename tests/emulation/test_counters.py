# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Per-rule and policy counters, as iptables-save -c prints them."""

from __future__ import annotations

import random

from emulation.clock import ManualClock
from emulation.netfilter import Netns, load
from tests.emulation.helpers import KUBE_NAT, RNG, make_node, netns, pkt

_MANGLE = "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"


def test_counters_count_packets_and_bytes_of_matching_rules() -> None:
    """Each matched rule counts one packet and its length; the policy counts fall-through packets."""
    ns = netns("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p udp -j ACCEPT\n-A INPUT -p tcp\nCOMMIT\n")
    ns.send(pkt(length=100), RNG)
    ns.send(pkt(length=50, sport=2), RNG)
    ns.send(pkt(protocol="udp", length=70), RNG)
    lines = ns.save(counters=True).splitlines()
    assert ":INPUT ACCEPT [2:150]" in lines
    assert "[1:70] -A INPUT -p udp -j ACCEPT" in lines
    assert "[2:150] -A INPUT -p tcp" in lines


def test_nat_rules_count_only_the_first_packet_of_a_flow() -> None:
    """nat rules see one packet per flow, as in the kernel."""
    ns = netns(KUBE_NAT)
    for _ in range(3):
        ns.send(pkt(dst="172.30.0.41", syn=False), RNG)
    assert "[1:60] -A PREROUTING" in ns.save(counters=True)


def test_noflush_restore_keeps_counters_of_untouched_chains() -> None:
    """Rules of chains a --noflush restore does not mention keep their counts."""
    ns = netns(KUBE_NAT)
    ns.send(pkt(dst="172.30.0.41"), RNG)
    ns.restore("*nat\n:KUBE-SVC-AAA - [0:0]\n-A KUBE-SVC-AAA -j KUBE-SEP-1\nCOMMIT\n", noflush=True)
    text = ns.save(counters=True)
    assert "[1:60] -A PREROUTING" in text
    assert "[0:0] -A KUBE-SVC-AAA -j KUBE-SEP-1" in text


def _policy_line(save: str) -> str:
    return next(line for line in save.splitlines() if line.startswith(":PREROUTING"))


def test_a_restore_restarts_the_policy_counters_of_the_tables_it_replaces() -> None:
    """iptables-restore of a table sets its built-in chains' counters to what it declares:
    ``[0:0]`` without ``-c``, the saved values with it (kernel, iptables 1.8 nf_tables)."""
    ns = Netns(make_node(), ManualClock(), ruleset=load(_MANGLE))
    rng = random.Random(1)
    for i in range(10):
        ns.send(pkt(sport=1000 + i, length=60), rng)
    saved = ns.save(counters=True)
    assert _policy_line(saved) == ":PREROUTING ACCEPT [10:600]"
    ns.restore(saved, counters=True)
    assert ns.save(counters=True) == saved  # not [20:1200]
    ns.restore(_MANGLE)
    assert _policy_line(ns.save(counters=True)) == ":PREROUTING ACCEPT [0:0]"


def test_a_noflush_restore_keeps_the_live_policy_counters() -> None:
    """``--noflush`` keeps a built-in chain's live policy counter."""
    ns = Netns(make_node(), ManualClock(), ruleset=load(_MANGLE))
    ns.send(pkt(), random.Random(1))
    ns.restore(_MANGLE, noflush=True)
    assert _policy_line(ns.save(counters=True)) == ":PREROUTING ACCEPT [1:60]"
