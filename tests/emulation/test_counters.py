"""Per-rule and policy counters, as iptables-save -c prints them."""

from __future__ import annotations

from tests.emulation.helpers import KUBE_NAT, RNG, netns, pkt


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
