# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""The flow cache: replayed paths give exactly what walking the rules gives.

STYLE §14: every optimiser gets an equivalence property. With the cache on, new flows whose
path was recorded are replayed; the outcomes, rule and policy counters, conntrack entries,
``recent``/``nth`` state and the random stream must be those of the walk with the cache off.
The packets are sent in families that share most fields (same service, other source ports,
other clients in the same or a nearby prefix) so that most of them are replayed.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from emulation.clock import ManualClock
from emulation.netfilter import Netns, load
from emulation.packet import Packet
from tests.emulation.helpers import KUBE_NAT, make_node, pkt
from tests.emulation.strategies import KubeRuleset, kube_rulesets, packets_for

_CLIENTS = ["203.0.113.2", "203.0.113.3", "198.51.100.7", "10.0.1.1", "10.0.1.2", "10.0.7.7", "10.0.200.9"]


def _variants(packet: Packet, draw: st.DrawFn) -> list[Packet]:
    """The packet, then others of its family: new source ports and, for outside traffic, clients."""
    out = [packet]
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        changed = replace(packet, sport=draw(st.integers(min_value=1, max_value=65535)))
        if packet.in_interface is not None and draw(st.booleans()):
            changed = replace(changed, src=draw(st.sampled_from(_CLIENTS)))
        out.append(changed)
    return out


@st.composite
def _families(draw: st.DrawFn) -> tuple[KubeRuleset, list[Packet]]:
    rules = draw(kube_rulesets())
    packets: list[Packet] = []
    for p in draw(st.lists(packets_for(rules), min_size=1, max_size=8)):
        packets += _variants(p, draw)
    return rules, packets


def _conntrack(ns: Netns) -> list[str]:
    return sorted(e.describe() for e in ns.conntrack.entries())


def _dynamic(ns: Netns) -> tuple[object, dict[int, int]]:
    position = {rule.uid: i for i, (_, rule) in enumerate(ns.ruleset.rules())}
    return ns.dynamic.recent, {position[uid]: n for uid, n in ns.dynamic.nth.items()}


@settings(max_examples=80, deadline=None)
@given(
    case=_families(),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    step=st.sampled_from([0.0, 0.5, 7.0]),
)
def test_replayed_flows_equal_walked_flows(
    case: tuple[KubeRuleset, list[Packet]], seed: int, step: float
) -> None:
    """Cache on or off: the same outcomes, counters, conntrack, ``recent``/``nth`` state and draws."""
    rules, packets = case
    clock = ManualClock()
    cached, walked = (Netns(make_node(), clock, ruleset=load(rules.text)) for _ in range(2))
    walked.cache_flows = False
    rng_cached, rng_walked = random.Random(seed), random.Random(seed)
    for packet in packets:
        assert cached.send(packet, rng_cached) == walked.send(packet, rng_walked), packet
        clock.advance(step)
    assert cached.save(counters=True) == walked.save(counters=True)
    assert _conntrack(cached) == _conntrack(walked)
    assert _dynamic(cached) == _dynamic(walked)
    assert rng_cached.random() == rng_walked.random()  # the same number of draws


@settings(max_examples=40, deadline=None)
@given(case=_families())
def test_enumerate_with_the_cache_equals_enumerate_without(case: tuple[KubeRuleset, list[Packet]]) -> None:
    """Every outcome and its probability, whether the branches are replayed or walked."""
    rules, packets = case
    ns = Netns(make_node(), ManualClock(), ruleset=load(rules.text))
    for packet in packets:
        ns.cache_flows = True
        replayed = ns.enumerate(packet)
        ns.cache_flows = False
        assert replayed == ns.enumerate(packet)


# --- what the cache keys on --------------------------------------------------------------------

_ONE_SERVICE = KUBE_NAT


def _by_position(ns: Netns) -> dict[int, tuple[int, int]]:
    """Live rule counters by rule position (uids differ between two loads of the same text)."""
    return {i: ns.counters.rule(rule) for i, (_, rule) in enumerate(ns.ruleset.rules())}


def _flows(ns: Netns) -> int:
    """Segments the cache holds."""
    return 0 if ns.flow_cache is None else ns.flow_cache.segments


def test_clients_outside_the_compared_prefixes_share_a_path() -> None:
    """``! -s 10.0.0.0/8`` and ``-s <pod>/32`` fail on the first bit for 203.0.113.x and 198.51.100.x.

    So a second client, or a second source port, is replayed rather than recorded again.
    """
    ns = Netns(make_node(), ManualClock(), ruleset=load(_ONE_SERVICE))
    rng = random.Random(3)
    for i in range(200):
        client = "203.0.113.7" if i % 2 else "198.51.100.9"
        out = ns.send(pkt(src=client, dst="172.30.0.41", dport=80, sport=2000 + i), rng)
        assert out.dnat and out.masquerade
    # Whatever the clients: one segment up to the endpoint draws (1/3, then 1/2) and one per
    # endpoint after them.
    assert ns.flow_cache is not None and ns.flow_cache.recorded < 10
    assert _flows(ns) == 4


def test_a_pod_client_is_keyed_on_the_bits_that_tell_it_from_the_endpoints() -> None:
    """A pod's hairpin test reads its address up to where it differs from the endpoint's."""
    ns = Netns(make_node(), ManualClock(), ruleset=load(_ONE_SERVICE))
    walked = Netns(make_node(), ManualClock(), ruleset=load(_ONE_SERVICE))
    walked.cache_flows = False
    rng_a, rng_b = random.Random(5), random.Random(5)
    for i in range(300):
        src = f"10.0.{(i * 7) % 3}.{(i * 13) % 5 + 1}"
        p = pkt(src=src, dst="172.30.0.41", dport=80, sport=1000 + i, in_interface="cni0")
        assert ns.send(p, rng_a) == walked.send(p, rng_b)
    assert ns.save(counters=True) == walked.save(counters=True)


def test_replaced_rules_are_never_replayed() -> None:
    """A restore makes a new ruleset; paths recorded for the old one are dropped, counters kept."""
    ns = Netns(make_node(), ManualClock(), ruleset=load(_ONE_SERVICE))
    rng = random.Random(1)
    for i in range(20):
        assert ns.send(pkt(dst="172.30.0.41", dport=80, sport=100 + i), rng).dnat
    ns.restore(_ONE_SERVICE.replace("--to-destination 10.0.1.", "--to-destination 10.0.9."))
    out = ns.send(pkt(dst="172.30.0.41", dport=80, sport=999), rng)
    assert out.packet.dst.startswith("10.0.9.")


def test_counters_read_after_replays_are_exact() -> None:
    """Replayed packets are counted per segment and folded into the rule counters on every read."""
    cached = Netns(make_node(), ManualClock(), ruleset=load(_ONE_SERVICE))
    walked = Netns(make_node(), ManualClock(), ruleset=load(_ONE_SERVICE))
    walked.cache_flows = False
    rng_a, rng_b = random.Random(9), random.Random(9)
    for i in range(500):
        p = pkt(dst="172.30.0.41", dport=80, sport=1 + i, length=40 + i % 7)
        cached.send(p, rng_a)
        walked.send(p, rng_b)
        if i % 97 == 0:
            assert _by_position(cached) == _by_position(walked)
    assert _by_position(cached) == _by_position(walked)
    assert cached.counters.policies == walked.counters.policies
    assert cached.save(counters=True) == walked.save(counters=True)


def test_a_full_cache_is_emptied_and_refilled() -> None:
    """Past its limit the cache starts again; results and counters do not change."""
    cached = Netns(make_node(), ManualClock(), ruleset=load(_ONE_SERVICE))
    walked = Netns(make_node(), ManualClock(), ruleset=load(_ONE_SERVICE))
    walked.cache_flows = False
    rng_a, rng_b = random.Random(2), random.Random(2)
    cached.send(pkt(dst="172.30.0.41", dport=80, sport=1), rng_a)
    walked.send(pkt(dst="172.30.0.41", dport=80, sport=1), rng_b)
    cache = cached.flow_cache
    assert cache is not None
    cache.limit = 3
    for i in range(200):
        p = pkt(
            src=f"10.0.{i % 4}.{i % 9 + 1}", dst="172.30.0.41", dport=80, sport=2 + i, in_interface="cni0"
        )
        assert cached.send(p, rng_a) == walked.send(p, rng_b)
        assert cache.segments <= 3
    assert cached.save(counters=True) == walked.save(counters=True)


def test_a_stateful_rule_sends_its_packets_down_the_walk() -> None:
    """``recent`` (here: session affinity) is state; its packets are walked and stay exact."""
    first = '-A KUBE-SVC-AAA -m comment --comment "ns1/svc1:p80 -> 10.0.1.1:8080"'
    affinity = _ONE_SERVICE.replace(
        first,
        f"-A KUBE-SVC-AAA -m recent --name KUBE-SEP-1 --rcheck --seconds 10800 --reap -j KUBE-SEP-1\n{first}",
        1,
    )
    assert affinity != _ONE_SERVICE
    cached = Netns(make_node(), ManualClock(), ruleset=load(affinity))
    walked = Netns(make_node(), ManualClock(), ruleset=load(affinity))
    walked.cache_flows = False
    rng_a, rng_b = random.Random(4), random.Random(4)
    for i in range(50):
        p = pkt(dst="172.30.0.41", dport=80, sport=10 + i)
        assert cached.send(p, rng_a) == walked.send(p, rng_b)
    assert cached.save(counters=True) == walked.save(counters=True)


def test_an_address_written_back_unchanged_keeps_the_packets_text() -> None:
    """MASQUERADE to the address the packet already has: the walk keeps the packet's own text
    (here IPv6 in capitals), and so must a replay (it wrote the canonical text once)."""
    rules = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o eth0 -j MASQUERADE\nCOMMIT\n"
    cached = Netns(make_node(), ManualClock(), ruleset=load(rules, version=6))
    walked = Netns(make_node(), ManualClock(), ruleset=load(rules, version=6))
    walked.cache_flows = False
    rng = random.Random(1)
    for sport in range(1, 6):
        p = Packet(src="2001:DB8::1", dst="2001:db8::99", sport=sport, dport=80)
        a, b = cached.send(p, rng), walked.send(p, rng)
        assert a == b
        assert a.packet.src == "2001:DB8::1"
    assert cached.flow_cache is not None and cached.flow_cache.recorded == 1
