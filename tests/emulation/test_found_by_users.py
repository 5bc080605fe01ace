# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Bugs a fresh user found in the emulator, each checked against the kernel's behaviour."""

from __future__ import annotations

import math
import random

import pytest

from emulation.clock import ManualClock
from emulation.netfilter import Netns, load
from tests.emulation.helpers import make_node, pkt

_MANGLE = "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"


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
    ns = Netns(make_node(), ManualClock(), ruleset=load(_MANGLE))
    ns.send(pkt(), random.Random(1))
    ns.restore(_MANGLE, noflush=True)
    assert _policy_line(ns.save(counters=True)) == ":PREROUTING ACCEPT [1:60]"


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


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -1.0])
def test_the_manual_clock_moves_only_forward_by_a_finite_amount(seconds: float) -> None:
    clock = ManualClock()
    with pytest.raises(ValueError):
        clock.advance(seconds)
    assert clock.now() == 0.0


def test_a_packet_of_the_other_family_is_refused() -> None:
    """One Netns holds one family's rules; an IPv4 packet to ip6tables rules is an error, not ACCEPT."""
    ns = Netns(make_node(), ManualClock(), ruleset=load(_MANGLE, version=6))
    with pytest.raises(ValueError, match="IPv4 packet sent to IPv6 rules"):
        ns.send(pkt(), random.Random(1))
    with pytest.raises(ValueError, match="one family"):
        ns.enumerate(pkt())


def test_an_unmodelled_option_of_a_modelled_match_makes_the_match_unknown() -> None:
    """A real dump with ``-m conntrack --ctstatus`` loads (the match is unknown, as unmodelled
    modules are) instead of failing the whole dump; strict mode names the option."""
    from emulation.errors import NetfilterError
    from emulation.netfilter.matches import UnknownMatch

    dump = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A INPUT -m conntrack --ctstate NEW --ctstatus DNAT -j DROP\n-A INPUT -p udp -j ACCEPT\nCOMMIT\n"
    ruleset = load(dump)
    rule = ruleset.rules()[0][1]
    assert isinstance(rule.matches[0], UnknownMatch) and rule.matches[0].name == "conntrack"
    ns = Netns(make_node(), ManualClock(), ruleset=ruleset)
    out = ns.send(pkt(dst="192.168.0.2", dport=53, protocol="udp"), random.Random(1), trace=True)
    assert out.uncertain and out.verdict == "ACCEPT"
    assert any(step.result == "unknown" for step in out.trace)
    with pytest.raises(NetfilterError, match="--ctstatus"):
        load(dump, strict=True)


def test_a_conntrack_address_of_the_other_family_is_refused_and_a_host_prints_bare() -> None:
    """iptables refuses ``--ctorigsrc fd00::1`` in an IPv4 rule (it would silently never match,
    and ``!`` of it would match everything), and saves a host as ``10.0.0.2``, not ``/32``."""
    from emulation.errors import NetfilterError

    rule = "-A FORWARD -m conntrack ! --ctorigsrc {} -j DROP"
    head = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
    with pytest.raises(NetfilterError, match="not an IPv4 address"):
        load(head + rule.format("fd00::1") + "\nCOMMIT\n")
    with pytest.raises(NetfilterError, match="not an IPv6 address"):
        load(head + rule.format("10.0.0.2") + "\nCOMMIT\n", version=6)
    saved = Netns(
        make_node(), ManualClock(), ruleset=load(head + rule.format("10.0.0.2") + "\nCOMMIT\n")
    ).save()
    assert "! --ctorigsrc 10.0.0.2 -j DROP" in saved


def test_a_clock_cannot_start_at_nan_or_infinity() -> None:
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError):
            ManualClock(bad)
    with pytest.raises(ValueError):
        ManualClock().advance(True)


def test_an_ipv6_route_is_an_ipv6_route() -> None:
    """``Route(destination="default", via="fd00::1")`` was an IPv4 route: every IPv6 packet
    was then unreachable."""
    from emulation.node import Route

    assert Route(destination="default", device="eth0", via="fd00::1").version == 6
    assert Route(destination="fd00::/8", device="eth0").version == 6
    assert Route(destination="default", device="eth0", via="192.168.0.1").version == 4
    with pytest.raises(ValueError):
        Route(destination="10.0.0.0/8", device="eth0", version=6)
    with pytest.raises(ValueError):
        Route(destination="10.0.0.0/8", device="eth0", via="fd00::1")
