# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Source port choice of source NAT, as the kernel's get_unique_tuple (net/netfilter/nf_nat_core.c).

Each case is one the kernel decides by the conntrack table: a flow keeps its source port only
when no other entry holds the reply tuple it would get, MASQUERADE ``--random-fully`` always
draws one, and a client that was remapped once keeps its public port for other destinations.
"""

from __future__ import annotations

import random

import pytest

from emulation.netfilter import Netns
from emulation.netfilter.nat import choose_source_port
from emulation.packet import Packet
from tests.emulation.helpers import KUBE_NAT, netns

MASQ = "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o eth0 -j MASQUERADE{flags}\nCOMMIT\n"
# Two ClusterIPs whose only endpoint is the same pod port, without masquerade.
TWO_VIPS = """*nat
:PREROUTING ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -d 172.30.0.1/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.1.1:8080
-A PREROUTING -d 172.30.0.2/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.0.1.1:8080
COMMIT
"""


def _from_pod(ns: Netns, src: str, sport: int, dst: str = "8.8.8.8", rng: random.Random | None = None) -> Packet:
    out = ns.send(Packet(src=src, dst=dst, sport=sport, dport=53, protocol="udp", in_interface="cni0"),
                  rng or random.Random(1))  # fmt: skip
    assert out.verdict == "ACCEPT", out.reason
    return out.packet


def test_masquerade_keeps_the_port_while_its_reply_tuple_is_free() -> None:
    ns = netns(MASQ.format(flags=""))
    assert _from_pod(ns, "10.0.1.5", 40000).sport == 40000
    assert _from_pod(ns, "10.0.1.6", 40001).sport == 40001


@pytest.mark.parametrize("cache", [True, False])
def test_two_pods_masqueraded_to_one_address_get_distinct_ports(cache: bool) -> None:
    """The second pod's flow would get the first's reply tuple: it gets another port in
    1024-65535, and replies to each port reach their own pod."""
    ns = netns(MASQ.format(flags=""))
    ns.cache_flows = cache
    for i in range(3):  # warm the flow cache: the paths are recorded from a destination's second packet
        _from_pod(ns, "10.0.1.9", 30000 + i)
    first = _from_pod(ns, "10.0.1.5", 40000)
    second = _from_pod(ns, "10.0.1.6", 40000)
    assert first.sport == 40000
    assert second.src == first.src == "192.168.0.2"
    assert second.sport != 40000 and 1024 <= second.sport <= 65535
    for packet, pod, port in ((first, "10.0.1.5", 40000), (second, "10.0.1.6", 40000)):
        reply = Packet(src="8.8.8.8", dst=packet.src, sport=53, dport=packet.sport, protocol="udp", in_interface="eth0")
        back = ns.send(reply, random.Random(2))
        assert (back.packet.dst, back.packet.dport) == (pod, port)


def test_low_ports_stay_low() -> None:
    """A remapped port below 512 stays in 1-511, one in 512-1023 in 600-1023 (nf_nat_l4proto_unique_tuple)."""
    ns = netns(MASQ.format(flags=" --random-fully"))
    rng = random.Random(3)
    low = {_from_pod(ns, "10.0.1.5", 123, rng=rng).sport for _ in range(1)} | {
        _from_pod(ns, f"10.0.2.{i}", 123, rng=rng).sport for i in range(1, 30)}
    mid = {_from_pod(ns, f"10.0.3.{i}", 800, rng=rng).sport for i in range(1, 30)}
    assert all(1 <= p <= 511 for p in low) and len(low) > 20
    assert all(600 <= p <= 1023 for p in mid) and len(mid) > 20


def test_random_fully_draws_every_port() -> None:
    """--random-fully (NF_NAT_RANGE_PROTO_RANDOM_FULLY) skips keeping the port even when free."""
    ns = netns(MASQ.format(flags=" --random-fully"))
    rng = random.Random(4)
    ports = [_from_pod(ns, "10.0.1.5", 40000 + i, rng=rng).sport for i in range(50)]
    assert sum(p == 40000 + i for i, p in enumerate(ports)) <= 1
    assert all(1024 <= p <= 65535 for p in ports) and len(set(ports)) == 50


def test_kube_proxy_masquerade_with_random_fully_changes_the_client_port() -> None:
    """kube-proxy's KUBE-POSTROUTING masquerades with --random-fully: an external client's
    port is replaced, and the reply still finds its way back."""
    ns = netns(KUBE_NAT)
    rng = random.Random(5)
    out = ns.send(Packet(src="203.0.113.7", dst="172.30.0.41", sport=45000, dport=80, in_interface="eth0"), rng)
    assert out.masquerade and out.snat and out.packet.src == "10.0.0.1"
    assert out.packet.sport != 45000
    p = out.packet
    reply = Packet(src=p.dst, dst=p.src, sport=p.dport, dport=p.sport, in_interface="cni0", syn=False)
    back = ns.send(reply, rng)
    assert (back.packet.src, back.packet.sport, back.packet.dst, back.packet.dport) == (
        "172.30.0.41", 80, "203.0.113.7", 45000)  # fmt: skip


@pytest.mark.parametrize("cache", [True, False])
def test_a_null_binding_remaps_a_clashing_source_port(cache: bool) -> None:
    """Without any SNAT rule: one client port to two ClusterIPs of one pod port would give
    both flows the reply tuple pod:8080 -> client:port. The second is remapped at POSTROUTING
    (nf_nat_alloc_null_binding), and its reply is translated back to the client's port."""
    ns = netns(TWO_VIPS)
    ns.cache_flows = cache
    rng = random.Random(6)

    def send(vip: str, sport: int) -> Packet:
        out = ns.send(Packet(src="203.0.113.7", dst=vip, sport=sport, dport=80, in_interface="eth0"), rng)
        assert out.verdict == "ACCEPT"
        return out.packet

    for i in range(3):
        send("172.30.0.2", 20000 + i)
    first, second = send("172.30.0.1", 45000), send("172.30.0.2", 45000)
    assert (first.src, first.sport) == ("203.0.113.7", 45000)
    assert second.src == "203.0.113.7" and second.sport != 45000 and second.sport >= 1024
    reply = Packet(src="10.0.1.1", dst="203.0.113.7", sport=8080, dport=second.sport, in_interface="cni0", syn=False)
    back = ns.send(reply, rng)
    assert (back.packet.src, back.packet.dport) == ("172.30.0.2", 45000)


def test_a_remapped_client_keeps_its_public_port_for_other_destinations() -> None:
    """find_appropriate_src: once a client's port was remapped, its next flow from the same
    port to another destination reuses the mapping when that is free."""
    ns = netns(MASQ.format(flags=""))
    _from_pod(ns, "10.0.1.5", 40000, dst="8.8.8.8")
    remapped = _from_pod(ns, "10.0.1.6", 40000, dst="8.8.8.8").sport
    assert remapped != 40000
    assert _from_pod(ns, "10.0.1.6", 40000, dst="9.9.9.9").sport == remapped
    assert _from_pod(ns, "10.0.1.7", 40000, dst="9.9.9.9").sport == 40000  # another client: its own


def test_one_port_to_source_is_kept_and_a_clash_is_dropped() -> None:
    """SNAT --to-source ADDR:PORT keeps that one port even when taken; the flow's entry then
    cannot be confirmed (its reply tuple is another's) and the packet is dropped."""
    rules = "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o eth0 -p udp -j SNAT --to-source 192.168.0.2:5000\nCOMMIT\n"
    ns = netns(rules)
    rng = random.Random(8)
    first = ns.send(Packet(src="10.0.1.5", dst="8.8.8.8", sport=1, dport=53, protocol="udp", in_interface="cni0"), rng)
    second = ns.send(Packet(src="10.0.1.6", dst="8.8.8.8", sport=2, dport=53, protocol="udp", in_interface="cni0"), rng)
    assert (first.verdict, first.packet.sport) == ("ACCEPT", 5000)
    assert second.verdict == "DROP" and "conntrack" in second.reason
    assert len(ns.conntrack.entries()) == 1


def test_enumerate_takes_offset_zero_and_changes_nothing() -> None:
    """enumerate does not branch on port choices: --random-fully gives the range's first free port."""
    ns = netns(MASQ.format(flags=" --random-fully"))
    outs = ns.enumerate(Packet(src="10.0.1.5", dst="8.8.8.8", sport=40000, dport=53, protocol="udp", in_interface="cni0"))
    assert [(p, o.packet.sport) for p, o in outs] == [(1.0, 1024)]
    assert ns.conntrack.entries() == []


def test_choose_source_port_searches_a_full_range_in_shrinking_rounds() -> None:
    """With every port of --to-ports 100-299 taken: 128 tries from one offset, then rounds of
    64, 32, 16 and 8 from new offsets (a round of fewer than 16 is the last), then the last
    port tried, not free."""
    draws: list[int] = []

    def draw16() -> int:
        draws.append(len(draws))
        return 1000 * len(draws)

    tried: list[int] = []

    def taken(port: int) -> bool:
        tried.append(port)
        return True

    port, free = choose_source_port(proto="tcp", src=1, sport=50, addr=2, low=100, high=299, random=False,
                                    taken=taken, mappings=lambda: [], draw16=draw16)  # fmt: skip
    assert not free and len(draws) == 5
    assert len(tried) == 128 + 64 + 32 + 16 + 8
    assert tried[:2] == [100 + 1000 % 200, 100 + 1001 % 200] and port == tried[-1]


@pytest.mark.parametrize("rules", [KUBE_NAT, TWO_VIPS, MASQ.format(flags="")])
def test_the_flow_cache_chooses_the_ports_the_walk_chooses(rules: str) -> None:
    """Clashing flows (few clients, few ports) give the same outcomes, conntrack entries and
    random draws with the flow cache on and off."""
    runs = []
    for cache in (True, False):
        ns = netns(rules)
        ns.cache_flows = cache
        rng = random.Random(11)
        pick = random.Random(12)
        seen = []
        for _ in range(400):
            if "-o eth0" in rules:
                p = Packet(src=f"10.0.1.{pick.randrange(1, 4)}", dst=f"8.8.8.{pick.randrange(1, 3)}",
                           sport=40000 + pick.randrange(3), dport=53, protocol="udp", in_interface="cni0")  # fmt: skip
            else:
                p = Packet(src=f"203.0.113.{pick.randrange(1, 3)}", dst=pick.choice(("172.30.0.41", "172.30.0.1", "172.30.0.2")),
                           sport=45000 + pick.randrange(3), dport=80, in_interface="eth0")  # fmt: skip
            o = ns.send(p, rng)
            seen.append((o.verdict, o.reason, o.packet))
            ns.clock.advance(0.5)  # type: ignore[attr-defined]
        runs.append((seen, sorted(e.describe() for e in ns.conntrack.entries()), rng.random()))
    assert runs[0] == runs[1]
    remapped = [p for v, _, p in runs[0][0] if v == "ACCEPT" and p.sport not in (40000, 40001, 40002, 45000, 45001, 45002)]
    assert len(remapped) >= 5  # the clashes happened


def _pod(sport: int) -> Packet:
    return Packet(src="10.0.0.5", dst="198.51.100.1", sport=sport, dport=53, protocol="udp", in_interface="cni0", length=36)


def test_enumerate_finds_a_free_port_when_one_exists() -> None:
    """enumerate searches the whole range once (from offset 0): with ports 2000-2189 of
    2000-2199 mapped, a flow from outside the range is accepted on 2190, as send() and the
    kernel accept it (128 tries from offset 0, and the shrinking rounds after them, also from
    0, would never leave 2000-2127)."""
    ns = netns("*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -o eth0 -p udp -j SNAT --to-source 192.168.0.2:2000-2199\nCOMMIT\n")
    rng = random.Random(0)
    for i in range(190):  # each keeps its own port (inside the range, free)
        assert ns.send(_pod(2000 + i), rng).packet.sport == 2000 + i
    outs = ns.enumerate(_pod(50000))
    assert [(o.verdict, o.packet.sport) for _, o in outs] == [("ACCEPT", 2190)]
    assert ns.send(_pod(50000), rng).packet.sport in range(2190, 2200)
