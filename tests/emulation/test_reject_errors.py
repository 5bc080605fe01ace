# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""The answer a REJECT sends (an ICMP error or a TCP RST) and what the node's rules count of it.

The expected counts are what Linux 6.18 counted for the same rules and packets (see
:mod:`emulation.netfilter.reject`), unless a test says otherwise.
"""

from __future__ import annotations

import random

import pytest

from emulation.clock import ManualClock
from emulation.errors import NetfilterError
from emulation.netfilter import Netns, load
from emulation.netfilter.reject import ICMP_ERROR, TCP_RESET, Rejected, answer_to
from emulation.packet import Packet
from tests.emulation.helpers import NODE_IP, make_node, netns, pkt

FILTER = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{}\nCOMMIT\n"
NAT = "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n{}\nCOMMIT\n"
RAW = "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{}\nCOMMIT\n"
MANGLE = "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n{}\nCOMMIT\n"
UDP_9999 = "-A INPUT -p udp --dport 9999 -j REJECT"


def _rules(*tables: str) -> str:
    return "".join(tables)


def _count(ns: Netns, table: str, chain: str, index: int) -> tuple[int, int]:
    """``(packets, bytes)`` of rule ``index`` (1-based) of ``table``/``chain``."""
    rule = ns.ruleset.chain(table, chain).rules[index - 1]  # type: ignore[union-attr]
    return ns.counters.rule(rule)


def _udp(**kw: object) -> Packet:
    """A 128-byte UDP datagram to the node's port 9999, from 203.0.113.2 on eth0 by default."""
    kw.setdefault("dport", 9999)
    kw.setdefault("protocol", "udp")
    kw.setdefault("length", 128)
    return pkt(**kw)  # type: ignore[arg-type]


def _refused(packet: Packet, with_: str = "icmp-port-unreachable", **kw: object) -> Rejected:
    return Rejected(packet=packet, with_=with_, ctstate="NEW", **kw)  # type: ignore[arg-type]


# --- the answer packet ---------------------------------------------------------------------------


def test_an_error_comes_from_the_refused_destination_when_it_is_the_nodes() -> None:
    """A refused packet to the node's own address: the error goes from that address to the sender."""
    answer = answer_to(make_node(), _refused(_udp()))
    assert answer is not None
    p = answer.packet
    assert (answer.kind, answer.icmp_type, answer.icmp_code) == (ICMP_ERROR, 3, 3)
    assert (p.src, p.dst, p.protocol, p.in_interface, p.mark, p.length) == (
        NODE_IP,
        "203.0.113.2",
        "icmp",
        None,
        0,
        156,
    )


def test_an_error_to_a_forwarded_packet_comes_from_the_address_towards_its_sender() -> None:
    """A refused packet that was passing through: the error's source is the node's address routing picks for the way back."""
    answer = answer_to(make_node(), _refused(_udp(src="10.0.1.5", dst="8.8.8.8", in_interface="cni0")))
    assert answer is not None
    assert (answer.packet.src, answer.packet.dst, answer.route.device) == ("10.0.0.1", "10.0.1.5", "cni0")


def test_an_error_to_the_node_itself_comes_from_its_own_address() -> None:
    """A packet the node sent elsewhere: the error goes from the node's sending address to itself, over lo."""
    answer = answer_to(make_node(), _refused(_udp(src=NODE_IP, dst="172.30.0.60", in_interface=None)))
    assert answer is not None
    assert (answer.packet.src, answer.packet.dst, answer.route.kind) == (NODE_IP, NODE_IP, "local")


@pytest.mark.parametrize(("length", "error"), [(1, 29), (100, 128), (548, 576), (549, 576), (1500, 576)])
def test_an_ipv4_error_quotes_the_datagram_up_to_576_bytes(length: int, error: int) -> None:
    """20 bytes of IP header, 8 of ICMP header and as much of the refused datagram as fits in 576 bytes."""
    answer = answer_to(make_node(), _refused(_udp(length=length)))
    assert answer is not None and answer.packet.length == error


@pytest.mark.parametrize(("length", "error"), [(148, 196), (1232, 1280), (1500, 1280)])
def test_an_ipv6_error_quotes_the_datagram_up_to_1280_bytes(length: int, error: int) -> None:
    """40 bytes of IPv6 header, 8 of ICMPv6 header and as much of the refused datagram as fits the minimum MTU."""
    refused = _refused(_udp(src="2001:db8::9", dst="2001:db8::1", length=length), "icmp6-port-unreachable")
    answer = answer_to(make_node(), refused)
    assert answer is not None
    assert (answer.packet.src, answer.packet.dst, answer.icmp_type, answer.icmp_code, answer.packet.length) == (
        "2001:db8::1", "2001:db8::9", 1, 4, error)  # fmt: skip


@pytest.mark.parametrize(
    ("with_", "code"),
    [("icmp-net-unreachable", 0), ("icmp-host-unreachable", 1), ("icmp-proto-unreachable", 2),
     ("icmp-port-unreachable", 3), ("icmp-net-prohibited", 9), ("icmp-host-prohibited", 10),
     ("icmp-admin-prohibited", 13)],
)  # fmt: skip
def test_each_icmp_reject_type_sends_its_code(with_: str, code: int) -> None:
    """Each ``--reject-with`` sends a destination unreachable with ipt_REJECT's code for it."""
    answer = answer_to(make_node(), _refused(_udp(), with_))
    assert answer is not None and (answer.icmp_type, answer.icmp_code) == (3, code)


def test_a_tcp_reset_swaps_addresses_and_ports() -> None:
    """tcp-reset answers with a bare 40-byte RST from the refused destination (ports swapped)."""
    answer = answer_to(make_node(), _refused(pkt(dst="172.30.0.9", dport=80), "tcp-reset"))
    assert answer is not None
    p = answer.packet
    assert (answer.kind, p.src, p.sport, p.dst, p.dport, p.protocol, p.syn, p.length) == (
        TCP_RESET, "172.30.0.9", 80, "203.0.113.2", 40000, "tcp", False, 40)  # fmt: skip


@pytest.mark.parametrize(
    ("refused", "with_"),
    [
        (_udp(dst="192.168.0.255"), "icmp-port-unreachable"),  # a subnet broadcast
        (_udp(dst="239.1.1.1"), "icmp-port-unreachable"),  # multicast
        (_udp(src="0.0.0.0"), "icmp-port-unreachable"),  # no single sender
        (_udp(), "tcp-reset"),  # not TCP
        (_udp(src="2001:db8::9", dst="ff02::1"), "icmp6-port-unreachable"),
    ],
)
def test_some_refused_packets_get_no_answer(refused: Packet, with_: str) -> None:
    """Broadcast or multicast destinations, a sender that is no single host, tcp-reset of UDP: nothing is sent."""
    assert answer_to(make_node(), _refused(refused, with_)) is None


def test_no_error_answers_an_error_and_no_rst_a_rst() -> None:
    """An ICMP error is never answered; a RST gets no RST, but may get an ICMP error."""
    node = make_node()
    error = Packet(src="203.0.113.2", dst=NODE_IP, protocol="icmp", in_interface="eth0", length=156)
    rst = pkt(syn=False, length=40)
    assert answer_to(node, _refused(error, kind=ICMP_ERROR)) is None
    assert answer_to(node, _refused(rst, "tcp-reset", kind=TCP_RESET)) is None
    assert answer_to(node, _refused(rst, kind=TCP_RESET)) is not None


# --- what the rules count ------------------------------------------------------------------------


def test_the_error_is_counted_in_output_with_its_bytes() -> None:
    """The port unreachable for a 128-byte datagram crosses raw, mangle and filter OUTPUT and mangle POSTROUTING, 156 bytes."""
    ns = netns(_rules(RAW.format("-A OUTPUT -p icmp"), MANGLE.format("-A OUTPUT -p icmp\n-A POSTROUTING -p icmp"),
                      FILTER.format(f"{UDP_9999}\n-A OUTPUT -p icmp")))  # fmt: skip
    out = ns.send(_udp(), random.Random(1))
    assert out.verdict == "REJECT"
    assert [
        _count(ns, t, c, 1)
        for t, c in [("raw", "OUTPUT"), ("mangle", "OUTPUT"), ("mangle", "POSTROUTING"), ("filter", "OUTPUT")]
    ] == [(1, 156)] * 4
    assert _count(ns, "filter", "INPUT", 1) == (1, 128)


def test_the_error_is_related_to_the_refused_flow_in_the_reply_direction() -> None:
    """``--ctstate RELATED`` and ``--ctdir REPLY`` match the error; INVALID, NEW and UNTRACKED do not."""
    ns = netns(FILTER.format(UDP_9999 + "\n" + "\n".join(f"-A OUTPUT -p icmp -m conntrack {m}" for m in (
        "--ctstate RELATED", "--ctstate INVALID", "--ctstate NEW", "--ctstate UNTRACKED", "--ctdir REPLY", "--ctdir ORIGINAL"))))  # fmt: skip
    ns.send(_udp(), random.Random(1))
    assert [_count(ns, "filter", "OUTPUT", i)[0] for i in range(1, 7)] == [1, 0, 0, 0, 1, 0]


def test_nat_never_walks_its_rules_for_the_error_and_no_entry_is_left() -> None:
    """No nat chain counts the error (nor its policy), and conntrack holds no entry afterwards."""
    ns = netns(
        _rules(
            NAT.format("-A OUTPUT -p icmp\n-A POSTROUTING -p icmp\n-A INPUT -p icmp"), FILTER.format(UDP_9999)
        )
    )
    ns.send(_udp(), random.Random(1))
    assert [_count(ns, "nat", c, 1) for c in ("OUTPUT", "POSTROUTING", "INPUT")] == [(0, 0)] * 3
    assert ns.counters.policies.get(("nat", "POSTROUTING")) is None
    assert list(ns.conntrack.entries()) == []


def test_the_error_to_the_node_itself_comes_back_through_input() -> None:
    """A datagram the node sends and its OUTPUT refuses: the error crosses OUTPUT, then lo's PREROUTING and INPUT."""
    ns = netns(_rules(MANGLE.format("-A PREROUTING -p icmp"), FILTER.format(
        "-A OUTPUT -p udp --dport 9998 -j REJECT\n-A OUTPUT -p icmp\n-A INPUT -p icmp -i lo -m conntrack --ctstate RELATED")))  # fmt: skip
    out = ns.send(_udp(src=NODE_IP, dst="203.0.113.2", dport=9998, in_interface=None), random.Random(1))
    assert out.verdict == "REJECT"
    assert [
        _count(ns, t, c, i)
        for t, c, i in [("filter", "OUTPUT", 2), ("mangle", "PREROUTING", 1), ("filter", "INPUT", 1)]
    ] == [(1, 156)] * 3


def test_the_error_for_a_dnatted_flow_comes_back_from_the_address_the_node_spoke_to() -> None:
    """nat's translation of RELATED ICMP makes the error's source the original destination before INPUT (not before POSTROUTING)."""
    ns = netns(_rules(
        NAT.format("-A OUTPUT -d 10.99.0.1 -p udp -j DNAT --to-destination 203.0.113.2:9000"),
        MANGLE.format("-A POSTROUTING -p icmp -s 192.168.0.2\n-A POSTROUTING -p icmp -s 10.99.0.1\n-A PREROUTING -p icmp -s 10.99.0.1"),
        FILTER.format("-A OUTPUT -p udp -d 203.0.113.2 --dport 9000 -j REJECT\n-A INPUT -p icmp -s 10.99.0.1 -m conntrack --ctstate RELATED,DNAT --ctdir REPLY"),
    ))  # fmt: skip
    ns.send(_udp(src=NODE_IP, dst="10.99.0.1", dport=53, in_interface=None), random.Random(1))
    assert [_count(ns, "mangle", "POSTROUTING", i)[0] for i in (1, 2)] == [1, 0]
    assert [_count(ns, t, c, 1)[0] for t, c in [("mangle", "PREROUTING"), ("filter", "INPUT")]] == [1, 1]


def test_notrack_cannot_untrack_an_error_that_carries_an_entry() -> None:
    """A raw ``CT --notrack`` for ICMP counts the error but leaves it RELATED."""
    ns = netns(_rules(RAW.format("-A OUTPUT -p icmp -j CT --notrack"),
                      FILTER.format(UDP_9999 + "\n-A OUTPUT -p icmp -m conntrack --ctstate RELATED\n-A OUTPUT -p icmp -m conntrack --ctstate UNTRACKED")))  # fmt: skip
    ns.send(_udp(), random.Random(1))
    assert (
        _count(ns, "raw", "OUTPUT", 1)[0],
        _count(ns, "filter", "OUTPUT", 1)[0],
        _count(ns, "filter", "OUTPUT", 2)[0],
    ) == (1, 1, 0)


def test_an_untracked_packets_error_is_invalid() -> None:
    """A packet made UNTRACKED in raw lends its error "RELATED without an entry": INVALID."""
    ns = netns(_rules(RAW.format("-A PREROUTING -p udp --dport 9999 -j CT --notrack"),
                      FILTER.format(UDP_9999 + "\n-A OUTPUT -p icmp -m conntrack --ctstate RELATED\n-A OUTPUT -p icmp -m conntrack --ctstate INVALID")))  # fmt: skip
    ns.send(_udp(), random.Random(1))
    assert (_count(ns, "filter", "OUTPUT", 1)[0], _count(ns, "filter", "OUTPUT", 2)[0]) == (0, 1)


def test_an_invalid_packets_error_has_no_entry_and_notrack_untracks_it() -> None:
    """A TCP ACK with no entry (``tcp_loose`` off) is INVALID; its error finds no entry, so raw's NOTRACK makes it UNTRACKED."""
    from dataclasses import replace

    ns = Netns(replace(make_node(), tcp_loose=False), ManualClock())
    ns.restore(_rules(RAW.format("-A OUTPUT -p icmp -j CT --notrack"),
                      FILTER.format("-A INPUT -p tcp --dport 9994 -j REJECT\n-A OUTPUT -p icmp -m conntrack --ctstate UNTRACKED")))  # fmt: skip
    out = ns.send(pkt(dport=9994, syn=False, length=40), random.Random(1))
    assert out.ctstate == "INVALID"
    assert _count(ns, "filter", "OUTPUT", 1) == (1, 68)


def test_a_connmark_restored_on_the_error_is_the_refused_flows() -> None:
    """The error carries the refused flow's entry: CONNMARK --restore-mark gives it that entry's mark."""
    ns = netns(_rules(MANGLE.format("-A PREROUTING -p udp --dport 9999 -j CONNMARK --set-mark 0x5\n-A OUTPUT -p icmp -j CONNMARK --restore-mark"),
                      FILTER.format(UDP_9999 + "\n-A OUTPUT -p icmp -m mark --mark 0x5")))  # fmt: skip
    ns.send(_udp(), random.Random(1))
    assert _count(ns, "filter", "OUTPUT", 1) == (1, 156)


def test_a_tcp_reset_walks_nat_postrouting_for_a_new_flow() -> None:
    """The RST for a refused SYN is RELATED, 40 bytes, and (the flow having no source mapping yet) walks nat POSTROUTING, not nat OUTPUT."""
    ns = netns(_rules(NAT.format("-A OUTPUT -p tcp\n-A POSTROUTING -p tcp"),
                      FILTER.format("-A INPUT -p tcp --dport 9996 -j REJECT --reject-with tcp-reset\n-A OUTPUT -p tcp -m conntrack --ctstate RELATED")))  # fmt: skip
    ns.send(pkt(dport=9996), random.Random(1))
    assert [_count(ns, "nat", c, 1) for c in ("OUTPUT", "POSTROUTING")] == [(0, 0), (1, 40)]
    assert _count(ns, "filter", "OUTPUT", 1) == (1, 40)


def test_an_error_answers_a_refused_rst() -> None:
    """A RST that OUTPUT refuses gets an ICMP error (68 bytes) back to the node, RELATED in the original direction."""
    ns = netns(FILTER.format(
        "-A INPUT -p tcp --dport 9996 -j REJECT --reject-with tcp-reset\n-A INPUT -p icmp -m conntrack --ctstate RELATED --ctdir ORIGINAL\n"
        "-A OUTPUT -p tcp --sport 9996 -j REJECT\n-A OUTPUT -p icmp -s 192.168.0.2 -d 192.168.0.2"))  # fmt: skip
    ns.send(pkt(dport=9996), random.Random(1))
    assert [_count(ns, "filter", c, i) for c, i in [("OUTPUT", 1), ("OUTPUT", 2), ("INPUT", 2)]] == [
        (1, 40),
        (1, 68),
        (1, 68),
    ]


def test_an_error_refused_by_output_gets_no_answer_and_leaves_the_outcome() -> None:
    """OUTPUT may refuse the error itself: it is counted once, nothing answers it, and the packet's outcome is still its REJECT."""
    ns = netns(FILTER.format(UDP_9999 + "\n-A OUTPUT -p icmp -j REJECT"))
    out = ns.send(_udp(), random.Random(1))
    assert (out.verdict, out.reason) == ("REJECT", "INPUT")
    assert _count(ns, "filter", "OUTPUT", 1) == (1, 156)


# --- tracing, enumerate, the flow cache ----------------------------------------------------------


def test_a_traced_send_lists_the_answer_after_the_packets_own_steps() -> None:
    """The trace goes on with a step naming the answer, then its steps with ``answer:`` results."""
    ns = netns(FILTER.format(UDP_9999 + "\n-A OUTPUT -p icmp"))
    out = ns.send(_udp(), random.Random(1), trace=True)
    assert [(s.hook, s.chain, s.index, s.result) for s in out.trace] == [
        ("INPUT", "INPUT", 1, "match"),
        ("OUTPUT", "", 0, "answer"),
        ("OUTPUT", "OUTPUT", 1, "answer:match"),
        ("OUTPUT", "OUTPUT", 0, "answer:policy"),
    ]
    assert (
        out.trace[1].rule
        == "REJECT --reject-with icmp-port-unreachable answered: ICMP 3/3 192.168.0.2 > 203.0.113.2, 156 bytes"
    )
    assert ns.send(_udp(sport=40001), random.Random(1)).trace == ()


def test_enumerate_sends_no_answer() -> None:
    """``enumerate`` changes nothing, so no answer is counted."""
    ns = netns(FILTER.format(UDP_9999 + "\n-A OUTPUT -p icmp"))
    assert [o.verdict for _, o in ns.enumerate(_udp(), trace=True)] == ["REJECT"]
    assert _count(ns, "filter", "OUTPUT", 1) == (0, 0)


def test_answers_count_the_same_with_the_flow_cache_on_and_off() -> None:
    """Replayed and walked refusals send the same answers (the entry's mark included)."""
    text = _rules(
        MANGLE.format("-A PREROUTING -p udp --dport 9999 -j CONNMARK --set-mark 0x5\n-A OUTPUT -p icmp -j CONNMARK --restore-mark"),
        FILTER.format(UDP_9999 + "\n-A OUTPUT -p icmp -m mark --mark 0x5\n-A OUTPUT -p icmp -m conntrack --ctstate RELATED"),
    )  # fmt: skip
    cached, walked = (Netns(make_node(), ManualClock(), ruleset=load(text)) for _ in range(2))
    walked.cache_flows = False
    for sport in range(1000, 1010):
        assert cached.send(_udp(sport=sport), random.Random(sport)) == walked.send(
            _udp(sport=sport), random.Random(sport)
        )
    assert cached.flow_cache is not None and cached.flow_cache.recorded > 0
    assert cached.save(counters=True) == walked.save(counters=True)
    assert _count(cached, "filter", "OUTPUT", 1) == (10, 1560)


# --- the reject types ----------------------------------------------------------------------------


def test_reject_with_aliases_load_as_the_canonical_name() -> None:
    """``iptables-restore`` takes ``port-unreach`` and ``iptables-save`` prints ``icmp-port-unreachable``."""
    ns = netns(
        FILTER.format(
            "-A INPUT -j REJECT --reject-with port-unreach\n-A INPUT -p tcp -j REJECT --reject-with tcp-rst"
        )
    )
    assert (
        "-A INPUT -j REJECT --reject-with icmp-port-unreachable\n-A INPUT -p tcp -j REJECT --reject-with tcp-reset"
        in ns.save()
    )


def test_an_unknown_reject_type_fails_the_load() -> None:
    """A reject type of the other family (or none at all) is refused, as iptables-restore refuses it."""
    with pytest.raises(NetfilterError, match="icmp6-port-unreachable"):
        netns(FILTER.format("-A INPUT -j REJECT --reject-with icmp6-port-unreachable"))


def test_an_ipv6_error_and_rst_are_counted_as_linux_counts_them() -> None:
    """ip6tables: the error for a 148-byte datagram is 196 bytes and RELATED; a refused SYN's RST is 60 bytes and RELATED."""
    text = FILTER.format(
        "-A INPUT -p udp --dport 9999 -j REJECT\n-A INPUT -p tcp --dport 9996 -j REJECT --reject-with tcp-reset\n"
        "-A OUTPUT -p icmpv6 -m conntrack --ctstate RELATED\n-A OUTPUT -p icmpv6 -m conntrack --ctstate INVALID\n"
        "-A OUTPUT -p tcp -m conntrack --ctstate RELATED")  # fmt: skip
    ns = Netns(make_node(), ManualClock(), ruleset=load(text, version=6))
    src, dst = "2001:db8::9", "2001:db8::1"
    ns.send(pkt(src, dst, dport=9999, protocol="udp", length=148), random.Random(1))
    ns.send(pkt(src, dst, 40001, 9999, protocol="udp", length=148), random.Random(1))
    ns.send(pkt(src, dst, dport=9996, length=80), random.Random(1))
    assert [_count(ns, "filter", "OUTPUT", i) for i in (1, 2, 3)] == [(2, 392), (0, 0), (1, 60)]
