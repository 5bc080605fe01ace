"""Equivalence properties for the optimisers: the indexed walk, the parse caches and the fast tokenizer.

STYLE §14: every optimiser gets an equivalence property. The compiled, indexed evaluator must
give the same outcomes, counters, conntrack entries and random stream as the plain walk that
tests every rule as written; the cached rule parser must build the same rules (or raise the same
errors) as an uncached parse; the fast word splitter must split like iptables' tokenizer.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulation.addr import format_address, parse_address
from emulation.clock import ManualClock
from emulation.errors import NetfilterError
from emulation.netfilter import Netns, Outcome, load, rulespec
from emulation.netfilter.tokens import split_words
from emulation.packet import Packet
from tests.benchmarks.bench_netfilter import kube_ruleset
from tests.emulation.helpers import make_node
from tests.emulation.strategies import KubeRuleset, kube_rulesets, packets_for


def _same_except_trace(a: Outcome, b: Outcome) -> bool:
    return replace(a, trace=()) == replace(b, trace=())


def _dynamic(ns: Netns) -> tuple[object, dict[int, int]]:
    """``recent`` lists, and ``nth`` counters by rule position (uids differ between loads)."""
    position = {rule.uid: i for i, (_, rule) in enumerate(ns.ruleset.rules())}
    return ns.dynamic.recent, {position[uid]: n for uid, n in ns.dynamic.nth.items()}


@st.composite
def _ruleset_and_packets(draw: st.DrawFn) -> tuple[KubeRuleset, list[Packet]]:
    rules = draw(kube_rulesets())
    return rules, draw(st.lists(packets_for(rules), min_size=1, max_size=25))


@settings(max_examples=60, deadline=None)
@given(case=_ruleset_and_packets(), seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_indexed_walk_equals_plain_walk(case: tuple[KubeRuleset, list[Packet]], seed: int) -> None:
    """Sampling a packet sequence indexed or rule by rule gives the same outcomes, counters and state."""
    rules, packets = case
    clock = ManualClock()
    fast, plain = (Netns(make_node(), clock, ruleset=load(rules.text)) for _ in range(2))
    plain.indexed = False
    rng_fast, rng_plain = random.Random(seed), random.Random(seed)
    for packet in packets:
        a, b = fast.send(packet, rng_fast), plain.send(packet, rng_plain)
        assert a == b
        clock.advance(1.0)
    assert fast.save(counters=True) == plain.save(counters=True)
    assert [e.describe() for e in fast.conntrack.entries()] == [
        e.describe() for e in plain.conntrack.entries()
    ]
    assert _dynamic(fast) == _dynamic(plain)
    assert rng_fast.random() == rng_plain.random()  # the same number of draws


@settings(max_examples=40, deadline=None)
@given(case=_ruleset_and_packets())
def test_indexed_enumerate_equals_plain_enumerate(case: tuple[KubeRuleset, list[Packet]]) -> None:
    """Every outcome and its probability are the same with and without the index."""
    rules, packets = case
    ns = Netns(make_node(), ManualClock(), ruleset=load(rules.text))
    for packet in packets:
        ns.indexed = True
        fast = ns.enumerate(packet)
        ns.indexed = False
        assert fast == ns.enumerate(packet)


@settings(max_examples=40, deadline=None)
@given(case=_ruleset_and_packets(), seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_tracing_changes_nothing_but_the_trace(case: tuple[KubeRuleset, list[Packet]], seed: int) -> None:
    """A traced packet (plain walk, every rule listed) ends as the same untraced packet does."""
    rules, packets = case
    clock = ManualClock()
    fast, traced = (Netns(make_node(), clock, ruleset=load(rules.text)) for _ in range(2))
    rng_fast, rng_traced = random.Random(seed), random.Random(seed)
    for packet in packets:
        a, b = fast.send(packet, rng_fast), traced.send(packet, rng_traced, trace=True)
        assert _same_except_trace(a, b)
        assert a.trace == () and b.trace
    assert fast.save(counters=True) == traced.save(counters=True)


def test_traced_walk_lists_every_rule_of_an_indexed_chain() -> None:
    """With tracing on, KUBE-SERVICES is walked rule by rule up to the match, as the kernel does."""
    text = kube_ruleset(40, 2)
    ns = Netns(make_node(), ManualClock(), ruleset=load(text))
    chain = ns.ruleset.chain("nat", "KUBE-SERVICES")
    assert chain is not None and ns.accelerator.index(chain) is not None
    out = ns.send(
        Packet(src="203.0.113.2", dst="172.30.0.30", sport=5, dport=80, in_interface="eth0"),
        random.Random(1),
        trace=True,
    )
    steps = [s.index for s in out.trace if s.chain == "KUBE-SERVICES"]
    assert steps == list(range(1, 31))


# --- the parser's caches -------------------------------------------------------------------------

_OPTION_WORDS = [
    "-s",
    "-d",
    "-p",
    "-i",
    "!",
    "-m",
    "tcp",
    "udp",
    "comment",
    "--comment",
    "--dport",
    "--sport",
    "statistic",
    "--mode",
    "random",
    "--probability",
    "-j",
    "-g",
    "ACCEPT",
    "DNAT",
    "MARK",
    "--to-destination",
    "--or-mark",
    "KUBE-X",
    "mark",
    "--mark",
    "physdev",
    "--physdev-is-in",
    "multiport",
    "--dports",
    "recent",
    "--set",
    "--name",
    "-c",
    "LOG",
    "--log-prefix",
    "-x",
]
_VALUES = [
    "10.0.0.1",
    "10.0.0.0/8",
    "fd00::1",
    "80",
    "1:2",
    "0x4000/0x4000",
    "0.5",
    "eth0",
    "tcp",
    "10.0.0.1:8080",
    "a b",
    "",
    "99999",
    "foo",
    "1,2",
]


@st.composite
def _rule_word_pairs(draw: st.DrawFn) -> tuple[list[str], list[str]]:
    """Two rules of one shape: the same option words, possibly different values."""
    shape = draw(st.lists(st.sampled_from([*_OPTION_WORDS, None]), max_size=10))
    first = [w if w is not None else draw(st.sampled_from(_VALUES)) for w in shape]
    second = [w if w is not None else draw(st.sampled_from(_VALUES)) for w in shape]
    return first, second


def _parse(words: list[str]) -> str:
    try:
        rule = rulespec.parse_rule(
            "C", words, table="nat", version=4, strict=False, is_chain=lambda n: n == "KUBE-X"
        )
    except NetfilterError as e:
        return f"error: {e}"
    return rule.text()


@settings(max_examples=400, deadline=None)
@given(pair=_rule_word_pairs())
def test_cached_plan_parses_like_a_fresh_parse(pair: tuple[list[str], list[str]]) -> None:
    """A rule parsed with the plan cached from another rule of its shape equals its uncached parse."""
    first, second = pair
    rulespec._plans.clear()
    _parse(first)
    cached = _parse(second)
    rulespec._plans.clear()
    assert cached == _parse(second)


def _reference_split(line: str) -> list[str]:
    """The character-by-character tokenizer iptables-restore uses (add_param_to_argv)."""
    words: list[str] = []
    buf: list[str] = []
    in_word = quoted = escaped = False
    for ch in line:
        if quoted:
            if escaped:
                buf.append(ch)
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
                words.append("".join(buf))
                buf, in_word = [], False
            else:
                buf.append(ch)
            continue
        if ch == '"':
            quoted, in_word = True, True
        elif ch in " \t\r\n":
            if in_word:
                words.append("".join(buf))
                buf, in_word = [], False
        else:
            buf.append(ch)
            in_word = True
    if quoted:
        raise NetfilterError("unterminated double quote")
    if in_word:
        words.append("".join(buf))
    return words


@settings(max_examples=1000)
@given(line=st.text(alphabet=st.sampled_from(list(' \t\r\n"\\ab-!\x0b\x1f\xa0é')), max_size=30))
def test_split_words_equals_the_reference_tokenizer(line: str) -> None:
    """The fast word splitter gives the reference tokenizer's words, or the same error."""
    try:
        expected: list[str] | str = _reference_split(line)
    except NetfilterError as e:
        expected = str(e)
    try:
        got: list[str] | str = split_words(line)
    except NetfilterError as e:
        got = str(e)
    assert got == expected


@settings(max_examples=1000)
@given(
    text=st.one_of(
        st.ip_addresses(v=4).map(str),
        st.lists(
            st.sampled_from(["0", "00", "1", "01", "255", "256", "999", "", "+1", "١"]),
            min_size=3,
            max_size=5,
        ).map(".".join),
    )
)
def test_parse_address_equals_ipaddress(text: str) -> None:
    """The fast IPv4 path accepts, rejects and formats addresses exactly as ipaddress does."""
    try:
        expected = ipaddress.ip_address(text)
    except ValueError:
        with pytest.raises(NetfilterError):
            parse_address(text)
        return
    assert parse_address(text) == (expected.version, int(expected))
    assert format_address(expected.version, int(expected)) == str(expected)
