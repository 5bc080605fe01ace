# ruff: noqa: E501  (nft rulesets are kept whole, as nft prints them)
"""Packets through the nftables model: hooks, NAT, sets and maps, numgen, counters, trace."""

from __future__ import annotations

import random
from collections import Counter

from emulation import Interface, ManualClock, Node, Packet, Route
from emulation.nftables import Netns, load
from tests.emulation.nftables.rulesets import flows_ruleset

PA, PB, REMOTE, PORT = "10.180.0.1", "10.180.0.2", "10.180.1.1", 8080
RULES = flows_ruleset(pa=PA, pb=PB, remote=REMOTE, port=PORT, nodeport_ip="203.0.113.1")


def node() -> Node:
    """A node with an external side (eth0), a second node (eth1) and two pod veths."""
    return Node(
        interfaces=(
            Interface(name="eth0", addresses=("203.0.113.1/24",)),
            Interface(name="eth1", addresses=("192.168.0.2/24",)),
            Interface(name="vp1", addresses=("169.254.1.1/32",)),
            Interface(name="vp2", addresses=("169.254.1.1/32",)),
            Interface(name="vp3", addresses=("169.254.1.1/32",)),
        ),
        routes=(
            Route(destination=f"{PA}/32", device="vp1"),
            Route(destination=f"{PB}/32", device="vp2"),
            Route(destination="10.0.0.2/32", device="vp3"),
            Route(destination="default", device="eth1", via="192.168.0.3"),
        ),
    )


def netns(rules: str = RULES) -> Netns:
    """A Netns with ``rules`` loaded."""
    return Netns(node(), ManualClock(), ruleset=load(rules))


def tcp(src: str, dst: str, dport: int, iif: str | None, sport: int = 40000) -> Packet:
    """A TCP SYN."""
    return Packet(src=src, dst=dst, sport=sport, dport=dport, in_interface=iif)


def test_clusterip_from_a_pod_goes_to_either_endpoint_unmasqueraded() -> None:
    """numgen mod 2 gives each endpoint 1/2; pod traffic keeps its source."""
    outcomes = netns().enumerate(tcp("10.0.0.2", "172.30.0.41", 80, "vp3"))
    assert sorted((p, o.destination, o.packet.src, o.masquerade) for p, o in outcomes) == [
        (0.5, f"{PA}:{PORT}", "10.0.0.2", False),
        (0.5, f"{PB}:{PORT}", "10.0.0.2", False),
    ]


def test_clusterip_from_outside_is_masqueraded_to_the_out_interface_address() -> None:
    """An external client's source becomes the pod veth's address (masquerade fully-random)."""
    for _, o in netns().enumerate(tcp("203.0.113.2", "172.30.0.41", 80, "eth0")):
        assert (o.verdict, o.masquerade, o.packet.src, o.out_interface in ("vp1", "vp2")) == (
            "ACCEPT",
            True,
            "169.254.1.1",
            True,
        )


def test_service_without_endpoints_rejects_and_unallocated_clusterip_drops() -> None:
    """no-endpoint-services sends to reject-chain; an unknown port REJECTs; an unallocated IP DROPs."""
    ns = netns()
    assert ns.send(tcp("203.0.113.2", "172.30.0.43", 80, "eth0"), random.Random(1)).verdict == "REJECT"
    assert ns.send(tcp("203.0.113.2", "172.30.0.41", 81, "eth0"), random.Random(1)).verdict == "REJECT"
    assert ns.send(tcp("203.0.113.2", "172.30.0.99", 80, "eth0"), random.Random(1)).verdict == "DROP"


def test_nodeport_is_masqueraded_and_dnatted() -> None:
    """tcp . 3001 in service-nodeports reaches an endpoint through the external chain."""
    outcomes = netns().enumerate(tcp("203.0.113.2", "203.0.113.1", 3001, "eth0"))
    assert {o.destination for _, o in outcomes} == {f"{PA}:{PORT}", f"{PB}:{PORT}"}
    assert all(o.masquerade for _, o in outcomes)


def test_locally_generated_packet_uses_nat_output() -> None:
    """A packet from the node itself is DNATed in nat-output and masqueraded (node source)."""
    outcomes = netns().enumerate(tcp("192.168.0.2", "172.30.0.44", 80, None))
    assert [(p, o.destination, o.masquerade) for p, o in outcomes] == [(1.0, f"{REMOTE}:{PORT}", True)]


def test_later_packets_of_a_flow_keep_its_endpoint() -> None:
    """The translation is decided on the first packet; the rest follow conntrack."""
    ns = netns()
    first = ns.send(tcp("10.0.0.2", "172.30.0.41", 80, "vp3"), random.Random(3))
    back = Packet(
        src=first.packet.dst,
        dst="10.0.0.2",
        sport=PORT,
        dport=40000,
        in_interface=first.out_interface,
        syn=False,
    )
    reply = ns.send(back, random.Random(0))
    assert (reply.packet.src, reply.packet.sport, reply.ctstate) == ("172.30.0.41", 80, "ESTABLISHED")
    for seed in range(5):
        again = ns.send(tcp("10.0.0.2", "172.30.0.41", 80, "vp3"), random.Random(seed))
        assert again.destination == first.destination


def test_enumerate_changes_nothing_and_send_counts() -> None:
    """enumerate leaves counters and conntrack alone; send counts the rules it passes."""
    ns = netns()
    before = ns.list_ruleset()
    ns.enumerate(tcp("203.0.113.2", "172.30.0.42", 53, "eth0"))
    assert ns.list_ruleset() == before and ns.conntrack.entries() == []
    udp = Packet(
        src="203.0.113.2",
        dst="172.30.0.42",
        sport=5000,
        dport=53,
        protocol="udp",
        in_interface="eth0",
        length=44,
    )
    ns.send(udp, random.Random(0))
    listing = ns.list_ruleset()
    assert "counter packets 1 bytes 44 jump services" in listing
    assert f"meta l4proto udp counter packets 1 bytes 44 dnat to {PA}:{PORT}" in listing


def test_numgen_samples_uniformly() -> None:
    """In sample mode numgen random mod 2 picks each endpoint about half the time."""
    ns = netns()
    rng = random.Random(11)
    seen = Counter(
        ns.send(tcp("10.0.0.2", "172.30.0.41", 80, "vp3", sport=20000 + i), rng).destination
        for i in range(400)
    )
    assert set(seen) == {f"{PA}:{PORT}", f"{PB}:{PORT}"}
    assert 150 <= seen[f"{PA}:{PORT}"] <= 250


def test_trace_shows_rules_and_map_lookups() -> None:
    """A traced packet lists the vmap lookup (in the chain of its rule, with its line) and the rules it met, in order."""
    o = netns().send(tcp("10.0.0.2", "172.30.0.41", 80, "vp3"), random.Random(0), trace=True)
    steps = [(s.chain, s.result) for s in o.trace]
    assert ("services", "lookup:hit") in steps
    lookup = next(s for s in o.trace if s.result == "lookup:hit")
    rule = next(s for s in o.trace if s.chain == "services" and s.result == "match")
    assert lookup.line == rule.line > 0
    assert steps.index(("services", "match")) < steps.index(("service-1-ns1/svc1/tcp/p80", "match"))
    assert o.trace[0].hook == "PREROUTING"


TWO_TABLES = """\
table inet cni {
  chain early { type filter hook forward priority -5; policy accept;
    ip daddr 10.180.0.2 drop
  }
  chain late { type filter hook forward priority 10; policy accept;
    ip daddr 10.180.0.1 drop
  }
}
table ip kube-proxy {
  chain filter-forward { type filter hook forward priority filter; policy accept;
    ip daddr 10.180.0.1 accept
  }
}
"""


def test_base_chains_of_different_tables_run_in_priority_order() -> None:
    """At one hook: -5 (cni) before 0 (kube-proxy) before 10 (cni); accept only ends its own chain."""
    ns = netns(TWO_TABLES)
    to_b = ns.send(tcp("10.0.0.2", PB, PORT, "vp3"), random.Random(0), trace=True)
    assert (to_b.verdict, to_b.reason) == ("DROP", "inet cni early")
    to_a = ns.send(tcp("10.0.0.2", PA, PORT, "vp3"), random.Random(0), trace=True)
    assert (to_a.verdict, to_a.reason) == ("DROP", "inet cni late")
    assert [s.chain for s in to_a.trace if s.index] == ["early", "filter-forward", "late"]


GOTO = """\
table ip t {
  chain base { type filter hook forward priority 0; policy accept;
    jump a
    drop
  }
  chain a {
    goto b
    accept
  }
  chain b {
    return
  }
}
"""


def test_goto_returns_to_the_callers_caller() -> None:
    """``return`` in a chain reached by goto goes back past the goto to base, which drops."""
    o = netns(GOTO).send(tcp("10.0.0.2", PA, PORT, "vp3"), random.Random(0), trace=True)
    assert o.verdict == "DROP"
    assert [(s.chain, s.index) for s in o.trace if s.result == "match"] == [
        ("base", 1),
        ("a", 1),
        ("b", 1),
        ("base", 2),
    ]


AFFINITY = """\
table ip t {
  set seen { type ipv4_addr; flags dynamic,timeout; timeout 10s; }
  chain base { type filter hook forward priority 0; policy accept;
    ip saddr @seen drop
    update @seen { ip saddr }
  }
}
"""


def test_dynamic_set_update_matches_later_packets_until_it_expires() -> None:
    """``update @set { ip saddr }`` adds the source; it matches until its timeout passes."""
    clock = ManualClock()
    ns = Netns(node(), clock, ruleset=load(AFFINITY))
    rng = random.Random(0)
    assert ns.send(tcp("10.0.0.2", PA, PORT, "vp3", sport=1), rng).verdict == "ACCEPT"
    assert ns.send(tcp("10.0.0.2", PA, PORT, "vp3", sport=2), rng).verdict == "DROP"
    clock.advance(10.5)
    assert ns.send(tcp("10.0.0.2", PA, PORT, "vp3", sport=3), rng).verdict == "ACCEPT"


def test_unknown_statement_is_uncertain_and_does_not_match() -> None:
    """A lenient Unknown statement never matches silently: the rule is skipped, the outcome uncertain."""
    rules = (
        "table ip t {\n chain c { type filter hook forward priority 0; policy accept;\n"
        '  osf name "Linux" drop\n }\n}\n'
    )
    o = Netns(node(), ManualClock(), ruleset=load(rules, strict=False)).send(
        tcp("10.0.0.2", PA, PORT, "vp3"), random.Random(0)
    )
    assert (o.verdict, o.uncertain) == ("ACCEPT", True)


def test_ipv6_packet_skips_ip_tables_and_ip_matches_in_inet() -> None:
    """An IPv6 packet meets ip6 and inet tables only, and ``ip daddr`` does not match it."""
    rules = (
        "table ip t4 {\n chain c { type filter hook input priority 0; policy drop;\n }\n}\n"
        "table inet t {\n chain c { type filter hook input priority 0; policy accept;\n"
        "  ip daddr 10.0.0.1 drop\n }\n}\n"
    )
    n6 = Node(interfaces=(Interface(name="eth0", addresses=("fd00::1/64",)),))
    ns = Netns(n6, ManualClock(), ruleset=load(rules))
    o = ns.send(
        Packet(src="fd00::2", dst="fd00::1", sport=1, dport=80, in_interface="eth0"), random.Random(0)
    )
    assert (o.verdict, o.delivery) == ("ACCEPT", "local")


NAT_MAPS = """\
table ip t {
  map m { type ipv4_addr . inet_service : ipv4_addr . inet_service; elements = { 172.30.0.1 . 80 : 10.180.0.1 . 8080 } }
  set hits { type ipv4_addr; counter; elements = { 10.0.0.2 } }
  chain pre { type nat hook prerouting priority dstnat; policy accept;
    ip saddr @hits ip daddr 172.30.0.9 drop
    dnat ip to ip daddr . tcp dport map @m
    dnat to ip daddr map { 172.30.0.2 : 10.180.0.2 }
  }
}
"""


def test_dnat_through_named_and_anonymous_maps() -> None:
    """``dnat ip to ip daddr . tcp dport map @m`` takes address and port; an anonymous map the address."""
    ns = netns(NAT_MAPS)
    assert ns.send(tcp("10.0.0.2", "172.30.0.1", 80, "vp3"), random.Random(0)).destination == f"{PA}:{PORT}"
    assert ns.send(tcp("10.0.0.2", "172.30.0.2", 8080, "vp3"), random.Random(0)).destination == f"{PB}:{PORT}"
    missed = ns.send(tcp("10.0.0.2", "172.30.0.1", 81, "vp3"), random.Random(0))
    assert (missed.dnat, missed.out_interface) == (False, "eth1")  # no element: the rule breaks


def test_per_element_counters_count_lookups() -> None:
    """A set with ``counter`` counts each element's hits and lists them."""
    ns = netns(NAT_MAPS)
    for i in range(3):
        ns.send(tcp("10.0.0.2", "172.30.0.9", 80, "vp3", sport=100 + i), random.Random(0))
    assert "elements = { 10.0.0.2 counter packets 3 bytes 180 }" in ns.list_ruleset()


def test_counters_survive_a_transaction_but_not_a_recreated_table() -> None:
    """A rule that stays keeps its count; a table deleted and made again starts from 0."""
    ns = netns()
    udp = Packet(
        src="203.0.113.2",
        dst="172.30.0.42",
        sport=5000,
        dport=53,
        protocol="udp",
        in_interface="eth0",
        length=44,
    )
    ns.send(udp, random.Random(0))
    ns.apply("add element ip kube-proxy cluster-ips { 172.30.0.45 }\n")
    assert "counter packets 1 bytes 44 jump services" in ns.list_ruleset()
    ns.apply("delete table ip kube-proxy\n" + RULES)
    assert "counter packets 1 " not in ns.list_ruleset()
