# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Parsing iptables-save / iptables-restore text and printing it back."""

from __future__ import annotations

import random

import pytest

from emulation.clock import ManualClock
from emulation.errors import NetfilterError
from emulation.netfilter import Netns, Ruleset, apply_restore, load, save
from emulation.netfilter.matches import UnknownMatch
from emulation.netfilter.targets import UnknownTarget
from emulation.netfilter.tokens import quote, split_words
from tests.emulation.helpers import KUBE_NAT, make_node, pkt


def test_save_parse_save_is_identical() -> None:
    """A saved ruleset parses back into one that saves to the same text."""
    once = save(load(KUBE_NAT))
    assert save(load(once)) == once


def test_save_with_counters_round_trips() -> None:
    """``iptables-save -c`` output keeps its counters through load and save."""
    text = "*filter\n:INPUT ACCEPT [5:300]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n[7:420] -A INPUT -j ACCEPT\nCOMMIT\n"
    assert save(load(text), counters=True) == text


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        (
            "-m tcp -p tcp -d 172.30.0.41 --dport 80 -j ACCEPT",
            "-d 172.30.0.41/32 -p tcp -m tcp --dport 80 -j ACCEPT",
        ),
        ("-p udp --dport 53 -j ACCEPT", "-p udp -m udp --dport 53 -j ACCEPT"),
        ("-d 127.0.0.0/8 ! -s 127.0.0.0/8 -j DROP", "! -s 127.0.0.0/8 -d 127.0.0.0/8 -j DROP"),
        ("-s 1.2.3.4/255.255.0.0 -j DROP", "-s 1.2.0.0/16 -j DROP"),
        ("-j MARK --or-mark 0x4000", "-j MARK --set-xmark 0x4000/0x4000"),
        ("-j MARK --xor-mark 0x4000", "-j MARK --set-xmark 0x4000/0x0"),
        ("-j MARK --and-mark 0x10", "-j MARK --set-xmark 0x0/0xffffffef"),
        ("-j MARK --set-mark 0x10", "-j MARK --set-xmark 0x10/0xffffffff"),
        (
            "-m statistic --mode random --probability 0.3333333333 -j ACCEPT",
            "-m statistic --mode random --probability 0.33333333349 -j ACCEPT",
        ),
        (
            "-m recent --name X --rcheck --seconds 10800 --reap -j ACCEPT",
            "-m recent --rcheck --seconds 10800 --reap --name X --mask 255.255.255.255 --rsource -j ACCEPT",
        ),
        ("-m comment --comment ns1/svc1:p80 -j ACCEPT", '-m comment --comment "ns1/svc1:p80" -j ACCEPT'),
        (
            "-m conntrack --ctstate DNAT,RELATED,ESTABLISHED -j ACCEPT",
            "-m conntrack --ctstate RELATED,ESTABLISHED,DNAT -j ACCEPT",
        ),
        ("-p tcp -j REJECT", "-p tcp -j REJECT --reject-with icmp-port-unreachable"),
        (
            "-m multiport -p udp --dports 53,1000:2000 -j ACCEPT",
            "-p udp -m multiport --dports 53,1000:2000 -j ACCEPT",
        ),
    ],
)
def test_rules_print_in_iptables_save_form(given: str, canonical: str) -> None:
    """Each rule is printed the way iptables-save 1.8 prints it (checked against the kernel)."""
    rs = load(f"*filter\n:INPUT ACCEPT [0:0]\n-A INPUT {given}\nCOMMIT\n")
    assert save(rs).splitlines()[4] == f"-A INPUT {canonical}"


def test_quoting_follows_the_restore_tokenizer() -> None:
    """Only double quotes group words, and a backslash escapes inside them."""
    assert split_words('-m comment --comment "a \\"b\\" c" x') == [
        "-m",
        "comment",
        "--comment",
        'a "b" c',
        "x",
    ]
    assert split_words("'a b'") == ["'a", "b'"]


def test_quote_matches_xtables_save_string() -> None:
    """Values are bare when made of [A-Za-z0-9_-], else double-quoted with escapes."""
    assert quote("abc-1_2") == "abc-1_2"
    assert quote("a b") == '"a b"'
    assert quote("x'y") == '"x\\\'y"'


def test_strict_unknown_match_raises_naming_the_line() -> None:
    """Strict mode refuses an unmodelled module and names its line."""
    text = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m physdev --physdev-is-bridged -j ACCEPT\nCOMMIT\n"
    with pytest.raises(NetfilterError, match="line 3") as err:
        apply_restore(Ruleset(), text, strict=True)
    assert err.value.line == 3
    assert "physdev" in str(err.value)


def test_lenient_unknown_match_is_kept_as_unknown() -> None:
    """Lenient mode keeps an unmodelled module as an UnknownMatch that prints as given."""
    text = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m physdev --physdev-is-bridged -j ACCEPT\nCOMMIT\n"
    rs = apply_restore(Ruleset(), text)
    rule = rs.tables["filter"].chains["INPUT"].rules[0]
    assert isinstance(rule.matches[0], UnknownMatch)
    assert rule.text() == "-A INPUT -m physdev --physdev-is-bridged -j ACCEPT"


def test_lenient_unknown_target_is_kept_as_unknown() -> None:
    """An unmodelled target extension becomes an UnknownTarget in lenient mode."""
    text = "*mangle\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -p tcp -j TCPMSS --clamp-mss-to-pmtu\nCOMMIT\n"
    rule = apply_restore(Ruleset(), text).tables["mangle"].chains["POSTROUTING"].rules[0]
    assert isinstance(rule.target, UnknownTarget)
    with pytest.raises(NetfilterError, match="line 3"):
        apply_restore(Ruleset(), text, strict=True)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("-A INPUT -p tcp --bogus 1 -j ACCEPT", "unknown option"),
        ("-A INPUT -j KUBE-NOPE", "no such chain"),
        ("-A NOPE -j ACCEPT", "no chain 'NOPE'"),
        ("-A INPUT -s 300.1.1.1 -j ACCEPT", "invalid IP address"),
        ("-A INPUT -m statistic --mode random --probability 2 -j ACCEPT", "within 0..1"),
        ("-A INPUT -j DNAT --to-destination 1.2.3.4", "only valid in the nat table"),
        ('-A INPUT -m comment --comment "open', "unterminated"),
        ("-Q INPUT", "unknown command"),
    ],
)
def test_bad_input_names_the_line(body: str, message: str) -> None:
    """Every kind of bad rule raises NetfilterError with its line number and cause."""
    text = f"*filter\n:INPUT ACCEPT [0:0]\n{body}\nCOMMIT\n"
    with pytest.raises(NetfilterError, match=message) as err:
        apply_restore(Ruleset(), text)
    assert err.value.line == 3


def test_missing_commit_is_an_error() -> None:
    """A table without COMMIT is refused."""
    with pytest.raises(NetfilterError, match="COMMIT"):
        apply_restore(Ruleset(), "*filter\n:INPUT ACCEPT [0:0]\n")


def test_ipv6_ruleset_parses_bracketed_dnat() -> None:
    """An ip6tables ruleset takes IPv6 prefixes and ``[addr]:port`` DNAT targets."""
    text = "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -d fd00::1/128 -p tcp -j DNAT --to-destination [fd00::2]:80\nCOMMIT\n"
    rs = apply_restore(Ruleset(version=6), text)
    assert "-A PREROUTING -d fd00::1/128 -p tcp -j DNAT --to-destination [fd00::2]:80" in save(rs)


def test_an_unmodelled_option_of_a_modelled_match_makes_the_match_unknown() -> None:
    """A real dump with ``-m conntrack --ctstatus`` loads (the match is unknown, as unmodelled
    modules are) instead of failing the whole dump; strict mode names the option."""
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
