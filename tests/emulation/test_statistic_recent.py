"""statistic (random and nth) in both modes, and recent lists over time."""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

from emulation.clock import ManualClock
from tests.emulation.helpers import KUBE_NAT, RNG, filter_input, netns, pkt


def test_enumerate_kube_proxy_chain_gives_one_third_each() -> None:
    """kube-proxy's 1/3, 1/2, 1 chain sends a new flow to each endpoint with probability 1/3."""
    outcomes = netns(KUBE_NAT).enumerate(pkt(dst="172.30.0.41"))
    by_dst: dict[str, float] = {}
    for p, o in outcomes:
        by_dst[o.destination] = by_dst.get(o.destination, 0.0) + p
    assert sorted(by_dst) == ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"]
    assert abs(sum(by_dst.values()) - 1.0) < 1e-9
    for p in by_dst.values():
        assert abs(p - 1 / 3) < 1e-9


def test_enumerate_uses_the_kernels_31_bit_probability() -> None:
    """The random branch has exactly lround(p * 2**31) / 2**31, the kernel's effective probability."""
    outcomes = netns(filter_input("-m statistic --mode random --probability 0.3333333333")).enumerate(pkt())
    accept = sum(p for p, o in outcomes if o.verdict == "ACCEPT")
    assert Fraction(accept) == Fraction(round(0.3333333333 * 2**31), 2**31)


def test_enumerate_changes_nothing() -> None:
    """Enumerating leaves counters and conntrack untouched."""
    ns = netns(KUBE_NAT)
    before = ns.save(counters=True)
    ns.enumerate(pkt(dst="172.30.0.41"))
    assert ns.save(counters=True) == before
    assert ns.conntrack.entries() == []


def test_sample_mode_is_roughly_uniform_and_seeded() -> None:
    """Sampling 3000 flows with a seeded generator spreads them evenly and is reproducible."""

    def run(seed: int) -> Counter[str]:
        ns, rng = netns(KUBE_NAT), random.Random(seed)
        return Counter(ns.send(pkt(dst="172.30.0.41", sport=1000 + i), rng).destination for i in range(3000))

    counts = run(1)
    assert counts == run(1)
    assert all(900 < n < 1100 for n in counts.values())


def test_nth_matches_every_nth_packet() -> None:
    """--every 3 --packet 1 matches the 2nd, 5th, 8th ... packet the rule sees."""
    ns = netns(filter_input("-m statistic --mode nth --every 3 --packet 1"))
    verdicts = [ns.send(pkt(sport=1000 + i), RNG).verdict for i in range(7)]
    assert verdicts == ["DROP", "ACCEPT", "DROP", "DROP", "ACCEPT", "DROP", "DROP"]


AFFINITY = """*filter
:INPUT DROP [0:0]
:SEEN - [0:0]
-A INPUT -m recent --name AFF --rcheck --seconds 10 --reap -j SEEN
-A INPUT -p tcp --dport 80 -m recent --name AFF --set -j ACCEPT
-A SEEN -j ACCEPT
COMMIT
"""


def test_recent_set_then_rcheck_within_seconds() -> None:
    """After --set, --rcheck --seconds 10 matches for 10 s and then no longer."""
    clock = ManualClock()
    ns = netns(AFFINITY, clock=clock)
    assert ns.send(pkt(), RNG).verdict == "ACCEPT"
    clock.advance(5)
    assert ns.send(pkt(dport=22, sport=1), RNG).verdict == "ACCEPT"  # via SEEN
    clock.advance(6)
    assert ns.send(pkt(dport=22, sport=2), RNG).verdict == "DROP"


def test_recent_reap_removes_the_stale_entry() -> None:
    """--reap drops the least recently seen address once it is older than --seconds."""
    clock = ManualClock()
    ns = netns(AFFINITY, clock=clock)
    ns.send(pkt(), RNG)
    clock.advance(11)
    ns.send(pkt(dport=22, sport=3), RNG)
    assert ns.dynamic.recent["AFF"] == {}


def test_recent_update_and_hitcount() -> None:
    """--update --hitcount 3 matches once three stamps are within the window."""
    text = filter_input("-m recent --name H --update --seconds 60 --hitcount 3").replace(
        "-A INPUT", "-A INPUT -m recent --name H --set\n-A INPUT", 1
    )
    ns = netns(text)
    verdicts = [ns.send(pkt(sport=i + 1), RNG).verdict for i in range(4)]
    assert verdicts == ["DROP", "DROP", "ACCEPT", "ACCEPT"]


def test_recent_rdest_and_mask() -> None:
    """--rdest with --mask 255.255.255.0 keys the list by the destination's /24."""
    text = filter_input("-m recent --name D --rcheck --rdest --mask 255.255.255.0").replace(
        "-A INPUT",
        "-A INPUT -d 192.168.0.2 -m recent --name D --set --rdest --mask 255.255.255.0 -j LOG\n-A INPUT",
        1,
    )
    ns = netns(text)
    assert ns.send(pkt(), RNG).verdict == "ACCEPT"
    assert ns.send(pkt(dst="192.168.0.255"), RNG).verdict == "ACCEPT"
