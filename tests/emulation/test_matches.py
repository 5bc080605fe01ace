"""Each match module, table-driven: a filter INPUT rule accepts what it matches, the policy drops the rest."""

from __future__ import annotations

import pytest

from emulation.packet import Packet
from tests.emulation.helpers import RNG, filter_input, netns, pkt

CASES: list[tuple[str, Packet, str]] = [
    ("-s 203.0.113.0/24", pkt(), "ACCEPT"),
    ("! -s 203.0.113.0/24", pkt(), "DROP"),
    ("-d 192.168.0.2", pkt(), "ACCEPT"),
    ("-d 192.168.0.3", pkt(), "DROP"),
    ("-p udp", pkt(protocol="udp"), "ACCEPT"),
    ("-p udp", pkt(), "DROP"),
    ("! -p udp", pkt(), "ACCEPT"),
    ("-i eth+", pkt(), "ACCEPT"),
    ("-i cni0", pkt(), "DROP"),
    ("! -i cni0", pkt(), "ACCEPT"),
    ("-p tcp --dport 80", pkt(), "ACCEPT"),
    ("-p tcp --dport 79", pkt(), "DROP"),
    ("-p tcp --dport 70:90", pkt(), "ACCEPT"),
    ("-p tcp ! --dport 70:90", pkt(), "DROP"),
    ("-p tcp -m tcp --sport 40000", pkt(), "ACCEPT"),
    ("-p tcp -m tcp --syn", pkt(), "ACCEPT"),
    ("-p tcp -m tcp --syn", pkt(syn=False), "DROP"),
    ("-p udp -m udp --dport 53", pkt(protocol="udp", dport=53), "ACCEPT"),
    ("-p sctp -m sctp --dport 80", pkt(protocol="sctp"), "ACCEPT"),
    ("-p tcp -m multiport --dports 22,70:90", pkt(), "ACCEPT"),
    ("-p tcp -m multiport --dports 22,443", pkt(), "DROP"),
    ("-p tcp -m multiport ! --dports 22,443", pkt(), "ACCEPT"),
    ("-p tcp -m multiport --ports 40000", pkt(), "ACCEPT"),
    ('-m comment --comment "any text"', pkt(), "ACCEPT"),
    ("-m mark --mark 0x4000/0x4000", pkt(mark=0x4001), "ACCEPT"),
    ("-m mark --mark 0x4000/0x4000", pkt(mark=0x1), "DROP"),
    ("-m mark ! --mark 0x1", pkt(mark=0x1), "DROP"),
    ("-m addrtype --dst-type LOCAL", pkt(), "ACCEPT"),
    ("-m addrtype --src-type LOCAL", pkt(), "DROP"),
    ("-m addrtype ! --src-type LOCAL", pkt(), "ACCEPT"),
    ("-m addrtype --dst-type LOCAL --limit-iface-in", pkt(), "ACCEPT"),
    ("-m addrtype --dst-type LOCAL --limit-iface-in", pkt(dst="10.0.0.1"), "DROP"),
    ("-m addrtype --dst-type BROADCAST", pkt(dst="192.168.0.255"), "ACCEPT"),
    ("-m conntrack --ctstate NEW", pkt(), "ACCEPT"),
    ("-m conntrack --ctstate ESTABLISHED", pkt(), "DROP"),
    ("-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT", pkt(), "ACCEPT"),
    ("-m state --state NEW", pkt(), "ACCEPT"),
    ("-m conntrack --ctstate NEW --ctorigdst 192.168.0.2 --ctorigdstport 80", pkt(), "ACCEPT"),
    ("-m conntrack --ctdir REPLY", pkt(), "DROP"),
    ("-m nfacct --nfacct-name localhost_nps_accepted_pkts", pkt(), "ACCEPT"),
    ("-m statistic --mode random --probability 1", pkt(), "ACCEPT"),
    ("-m statistic --mode random --probability 0", pkt(), "DROP"),
    ("-m statistic --mode nth --every 2 --packet 0", pkt(), "ACCEPT"),
    ("-m statistic --mode nth --every 2 --packet 1", pkt(), "DROP"),
    ("-m physdev --physdev-is-bridged", pkt(), "DROP"),
    ("-m set --match-set S src", pkt(), "DROP"),
]


@pytest.mark.parametrize(("spec", "packet", "verdict"), CASES, ids=[f"{c[0]}|{c[2]}" for c in CASES])
def test_match(spec: str, packet: Packet, verdict: str) -> None:
    """The rule's match holds exactly when the kernel's would (for the first packet of a flow)."""
    ns = netns(filter_input(spec))
    assert ns.send(packet, RNG).verdict == verdict


def test_unknown_match_is_traced_and_flags_uncertainty() -> None:
    """An unknown match never silently matches: the trace says unknown and the outcome is uncertain."""
    ns = netns(filter_input("-m physdev --physdev-is-bridged"))
    outcome = ns.send(pkt(), RNG, trace=True)
    assert outcome.uncertain
    assert [s.result for s in outcome.trace if s.index] == ["unknown"]


def test_set_match_uses_the_lookup() -> None:
    """``-m set`` asks the pluggable lookup with one (ip, port, protocol) per flag."""
    seen: list[tuple[str, tuple[tuple[str, int, str], ...]]] = []

    def lookup(name: str, keys: tuple[tuple[str, int, str], ...]) -> bool | None:
        seen.append((name, keys))
        return name == "KUBE-CLUSTER-IP"

    ns = netns(filter_input("-m set --match-set KUBE-CLUSTER-IP dst,dst"))
    ns.set_lookup = lookup
    assert ns.send(pkt(), RNG).verdict == "ACCEPT"
    assert seen == [("KUBE-CLUSTER-IP", (("192.168.0.2", 80, "tcp"), ("192.168.0.2", 80, "tcp")))]


def test_missing_set_is_unknown() -> None:
    """A lookup answering None (no such set) makes the match unknown, not false."""
    ns = netns(filter_input("-m set --match-set NOPE src"))
    ns.set_lookup = lambda name, keys: None
    outcome = ns.send(pkt(), RNG)
    assert outcome.uncertain and outcome.verdict == "DROP"


def test_ipv6_source_match() -> None:
    """IPv6 prefixes match IPv6 packets in an ip6tables ruleset."""
    from emulation.netfilter import Ruleset

    ns = netns()
    ns.ruleset = Ruleset(version=6)
    ns.restore(filter_input("-s 2001:db8:1::/48"))
    assert ns.send(pkt(src="2001:db8:1::5", dst="2001:db8::1"), RNG).verdict == "ACCEPT"
    assert ns.send(pkt(src="2001:db8:2::5", dst="2001:db8::1"), RNG).verdict == "DROP"
