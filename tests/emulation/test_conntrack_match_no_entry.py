# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""``-m conntrack`` on packets with no conntrack entry (INVALID, UNTRACKED) and with one.

The kernel's match is ``conntrack_mt`` (net/netfilter/xt_conntrack.c; revisions 1-3 call it from
``conntrack_mt_v1/v2/v3``). It looks at ``--ctstate`` first, then stops when ``nf_ct_get`` gave
no entry::

    if (ct) statebit = XT_CONNTRACK_STATE_BIT(ctinfo);
    else if (ctinfo == IP_CT_UNTRACKED) statebit = XT_CONNTRACK_STATE_UNTRACKED;
    else statebit = XT_CONNTRACK_STATE_INVALID;
    if (info->match_flags & XT_CONNTRACK_STATE) {
        if (ct != NULL) { ... statebit |= XT_CONNTRACK_STATE_SNAT / _DNAT ... }
        if (!!(state_mask & statebit) ^ !(info->invert_flags & XT_CONNTRACK_STATE))
            return false;
    }
    if (ct == NULL)
        return info->match_flags & XT_CONNTRACK_STATE;
    if ((info->match_flags & XT_CONNTRACK_DIRECTION) &&
        (CTINFO2DIR(ctinfo) == IP_CT_DIR_ORIGINAL) ^ !(info->invert_flags & XT_CONNTRACK_DIRECTION))
        return false;
    /* --ctorigsrc ... --ctrepldst, then ct_proto_port_check_v3 (ports), --ctstatus, --ctexpire */

An untracked packet has ``ct == NULL`` too (``xt_ct_target``: ``nf_ct_set(skb, NULL,
IP_CT_UNTRACKED)``). So without an entry only ``--ctstate`` counts: every other option, negated
or not, is skipped, and the match holds exactly when ``--ctstate`` is given and holds.

The packets: a TCP segment that is not a SYN, with no entry and ``nf_conntrack_tcp_loose`` off
(``tcp_new`` refuses it, so ``nf_conntrack_in`` leaves ``skb->_nfct`` 0: INVALID); a UDP
datagram made UNTRACKED by ``-t raw -j CT --notrack``; a UDP datagram of a new flow (NEW, an
entry, ORIGINAL). ``tests/kernel/test_iptables_conntrack_no_entry.py`` checks the same rules
against Linux.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulation.clock import ManualClock
from emulation.errors import NetfilterError
from emulation.netfilter import Netns, load
from emulation.netfilter.accel.deps import NOTHING, match_deps
from emulation.netfilter.context import Ctx, Dynamic
from emulation.netfilter.matches import Conntrack
from emulation.packet import Packet
from tests.emulation.helpers import NODE_IP, make_node, pkt

CLIENT = "203.0.113.2"
RAW = "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{}\nCOMMIT\n"
MANGLE = "*mangle\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n{}\nCOMMIT\n"
FILTER = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n{}\nCOMMIT\n"
FILTER_HEAD = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
#: Makes the UDP datagrams to port 9001 UNTRACKED.
NOTRACK_9001 = "-A PREROUTING -p udp -m udp --dport 9001 -j CT --notrack"

#: The three packets, by kind: no entry (INVALID, UNTRACKED) and a new flow's (an entry).
PACKETS: dict[str, Packet] = {
    "invalid": pkt(protocol="tcp", sport=40002, dport=9002, syn=False, length=40),
    "untracked": pkt(protocol="udp", sport=40001, dport=9001, length=44),
    "entry": pkt(protocol="udp", sport=40003, dport=9003, length=44),
}

# fmt: off
#: ``(options, matches INVALID, matches UNTRACKED, matches the new flow's packet)``: what
#: ``conntrack_mt`` returns. The new flow's entry: original (203.0.113.2, 40003 -> 192.168.0.2,
#: 9003), reply (192.168.0.2, 9003 -> 203.0.113.2, 40003), no NAT, direction ORIGINAL.
CASES: list[tuple[str, bool, bool, bool]] = [
    # --ctstate alone: the state bit, whether or not there is an entry.
    ("--ctstate INVALID", True, False, False),
    ("--ctstate UNTRACKED", False, True, False),
    ("--ctstate INVALID,UNTRACKED", True, True, False),
    ("! --ctstate INVALID", False, True, True),
    ("! --ctstate NEW", True, True, False),
    # SNAT/DNAT bits come from ct->status, only "if (ct != NULL)".
    ("--ctstate SNAT,DNAT", False, False, False),
    ("! --ctstate SNAT,DNAT", True, True, True),
    # Without --ctstate, "if (ct == NULL) return info->match_flags & XT_CONNTRACK_STATE": false.
    ("--ctdir ORIGINAL", False, False, True),
    ("--ctdir REPLY", False, False, False),
    ("--ctorigsrc 203.0.113.2", False, False, True),
    ("! --ctorigsrc 203.0.113.2", False, False, False),
    ("! --ctorigsrc 10.0.0.0/8", False, False, True),
    ("--ctorigdst 192.168.0.2", False, False, True),
    ("! --ctorigdst 10.0.0.0/8", False, False, True),
    ("--ctreplsrc 192.168.0.2", False, False, True),
    ("! --ctreplsrc 10.0.0.0/8", False, False, True),
    ("--ctrepldst 203.0.113.2", False, False, True),
    ("! --ctrepldst 10.0.0.0/8", False, False, True),
    ("--ctorigsrcport 40000:40010", False, False, True),
    ("! --ctorigsrcport 1", False, False, True),
    ("--ctorigdstport 9000:9010", False, False, True),
    ("! --ctorigdstport 1:1000", False, False, True),
    ("--ctreplsrcport 9003", False, False, True),
    ("! --ctreplsrcport 1", False, False, True),
    ("--ctrepldstport 40003", False, False, True),
    ("! --ctrepldstport 1", False, False, True),
    # With --ctstate holding and no entry, the rest is skipped: these hold, negated or not.
    ("--ctstate INVALID,UNTRACKED --ctdir REPLY", True, True, False),
    ("--ctstate INVALID,UNTRACKED --ctorigsrc 10.9.9.9", True, True, False),
    ("--ctstate INVALID,UNTRACKED,NEW ! --ctorigsrc 203.0.113.2", True, True, False),
    ("! --ctstate ESTABLISHED --ctorigdstport 1 --ctdir REPLY", True, True, False),
    ("--ctstate NEW --ctdir ORIGINAL --ctorigdstport 9003", False, False, True),
]
# fmt: on
KINDS = ("invalid", "untracked", "entry")


def _netns(rules: str) -> Netns:
    """The test node with ``nf_conntrack_tcp_loose`` off, and ``rules`` restored."""
    ns = Netns(replace(make_node(), tcp_loose=False), ManualClock())
    ns.restore(rules)
    return ns


def _count(ns: Netns, table: str, chain: str, index: int) -> int:
    """Packets counted by rule ``index`` (1-based) of ``table``/``chain``."""
    found = ns.ruleset.chain(table, chain)
    assert found is not None
    return ns.counters.rule(found.rules[index - 1])[0]


@pytest.mark.parametrize("trace", [False, True], ids=["walked", "traced"])
@pytest.mark.parametrize(("options", "invalid", "untracked", "entry"), CASES, ids=[c[0] for c in CASES])
def test_conntrack_match_gives_the_kernels_result(
    options: str, invalid: bool, untracked: bool, entry: bool, trace: bool
) -> None:
    """A filter INPUT rule ``-m conntrack OPTIONS`` counts each packet exactly when ``conntrack_mt`` holds for it."""
    ns = _netns(
        RAW.format(NOTRACK_9001)
        + FILTER.format(f"-A INPUT -m conntrack {options}\n-A INPUT -m conntrack {options}")
    )
    want = dict(zip(KINDS, (invalid, untracked, entry), strict=True))
    got = {}
    for kind in KINDS:
        before = _count(ns, "filter", "INPUT", 1)
        out = ns.send(PACKETS[kind], random.Random(1), trace=trace)
        assert out.ctstate == {"invalid": "INVALID", "untracked": "UNTRACKED", "entry": "NEW"}[kind]
        got[kind] = _count(ns, "filter", "INPUT", 1) - before == 1
    assert got == want
    # The second, identical rule is met after the chain was compiled: the same counts.
    assert _count(ns, "filter", "INPUT", 2) == _count(ns, "filter", "INPUT", 1)


def test_state_match_counts_untracked_and_invalid_by_state_alone() -> None:
    """``-m state`` is ``state_mt``: INVALID (``ct == NULL``), UNTRACKED (``IP_CT_UNTRACKED``) or the entry's state bit."""
    ns = _netns(RAW.format(NOTRACK_9001) + FILTER.format(
        "-A INPUT -m state --state INVALID\n-A INPUT -m state --state UNTRACKED\n-A INPUT -m state ! --state INVALID"))  # fmt: skip
    counts = []
    for kind in KINDS:
        ns.send(PACKETS[kind], random.Random(1))
        counts.append([_count(ns, "filter", "INPUT", i) for i in (1, 2, 3)])
    assert counts == [[1, 0, 0], [1, 1, 1], [1, 1, 2]]


def test_in_raw_a_packet_has_no_entry_yet() -> None:
    """raw PREROUTING runs before conntrack (``skb->_nfct`` is 0): a new flow's packet is INVALID there, and UNTRACKED right after ``CT --notrack``."""
    ns = _netns(RAW.format(
        "-A PREROUTING -p udp -m conntrack --ctstate INVALID\n"
        "-A PREROUTING -p udp -m conntrack --ctstate NEW\n"
        "-A PREROUTING -p udp -m conntrack --ctdir ORIGINAL\n"
        "-A PREROUTING -p udp -m conntrack ! --ctorigsrc 10.0.0.0/8\n"
        f"{NOTRACK_9001}\n"
        "-A PREROUTING -p udp -m conntrack --ctstate UNTRACKED\n"
        "-A PREROUTING -p udp -m conntrack --ctstate INVALID"
    ) + MANGLE.format("-A PREROUTING -p udp -m conntrack --ctstate NEW --ctdir ORIGINAL"))  # fmt: skip
    ns.send(PACKETS["entry"], random.Random(1))
    ns.send(PACKETS["untracked"], random.Random(1))
    raw = [_count(ns, "raw", "PREROUTING", i) for i in range(1, 8)]
    # Both are INVALID until the notrack rule (index 5, which only 9001 meets); then UNTRACKED for 9001.
    assert raw == [2, 0, 0, 0, 1, 1, 1]
    assert _count(ns, "mangle", "PREROUTING", 1) == 1


def test_raw_output_sees_the_nodes_reply_without_its_entry() -> None:
    """The node's reply of an established flow is INVALID in raw OUTPUT (before conntrack), then ESTABLISHED and REPLY."""
    ns = _netns(RAW.format(
        "-A OUTPUT -p udp -m conntrack --ctstate INVALID\n-A OUTPUT -p udp -m conntrack --ctdir REPLY"
    ) + MANGLE.format(
        "-A OUTPUT -p udp -m conntrack --ctstate ESTABLISHED --ctdir REPLY --ctorigsrc 203.0.113.2 --ctreplsrcport 9003\n"
        "-A OUTPUT -p udp -m conntrack --ctdir ORIGINAL"
    ))  # fmt: skip
    assert ns.send(PACKETS["entry"], random.Random(1)).verdict == "ACCEPT"
    reply = Packet(src=NODE_IP, dst=CLIENT, sport=9003, dport=40003, protocol="udp", length=44)
    assert ns.send(reply, random.Random(1)).ctstate == "ESTABLISHED"
    assert [_count(ns, "raw", "OUTPUT", i) for i in (1, 2)] == [1, 0]
    assert [_count(ns, "mangle", "OUTPUT", i) for i in (1, 2)] == [1, 0]


def test_an_icmp_error_carrying_the_refused_flows_entry_is_checked_against_it() -> None:
    """A REJECT's error is RELATED with the refused packet's entry (``nf_ct_attach``): its tuples and the REPLY direction are tested."""
    ns = _netns(FILTER.format(
        "-A INPUT -p udp --dport 9003 -j REJECT\n"
        "-A OUTPUT -p icmp -m conntrack --ctstate RELATED --ctdir REPLY --ctorigsrc 203.0.113.2 --ctorigdstport 9003\n"
        "-A OUTPUT -p icmp -m conntrack --ctdir ORIGINAL\n"
        "-A OUTPUT -p icmp -m conntrack ! --ctrepldst 203.0.113.2"
    ))  # fmt: skip
    assert ns.send(PACKETS["entry"], random.Random(1)).verdict == "REJECT"
    assert [_count(ns, "filter", "OUTPUT", i) for i in (1, 2, 3)] == [1, 0, 0]


def test_an_untracked_packets_error_has_no_entry() -> None:
    """The error about an UNTRACKED packet gets ``ct == NULL`` (``nf_conntrack_attach`` of no entry): INVALID, and ``--ctdir`` alone never holds."""
    ns = _netns(RAW.format(NOTRACK_9001) + FILTER.format(
        "-A INPUT -p udp --dport 9001 -j REJECT\n"
        "-A OUTPUT -p icmp -m conntrack --ctdir REPLY\n"
        "-A OUTPUT -p icmp -m conntrack --ctdir ORIGINAL\n"
        "-A OUTPUT -p icmp -m conntrack --ctstate INVALID --ctdir ORIGINAL"
    ))  # fmt: skip
    assert ns.send(PACKETS["untracked"], random.Random(1)).verdict == "REJECT"
    assert [_count(ns, "filter", "OUTPUT", i) for i in (1, 2, 3)] == [0, 0, 1]


@pytest.mark.parametrize(
    ("rule", "message"),
    [("-m conntrack ! --ctdir REPLY", "cannot be inverted"), ("-m conntrack", "at least one option")],
)
def test_iptables_refuses_what_it_cannot_express(rule: str, message: str) -> None:
    """``! --ctdir`` (no ``XTOPT_INVERT``) and a conntrack match without options (``conntrack_mt_check``) do not load."""
    with pytest.raises(NetfilterError, match=message):
        load(f"{FILTER_HEAD}-A INPUT {rule}\nCOMMIT\n")


def test_the_flow_cache_reads_what_it_did() -> None:
    """``--ctstate`` and ``--ctdir`` read only what the path decides; address and port checks read the packet's tuple."""
    rules = load(
        FILTER.format(
            "-A INPUT -m conntrack --ctstate INVALID --ctdir REPLY\n-A INPUT -m conntrack ! --ctorigsrc 10.0.0.0/8"
        )
    )
    (_, first), (_, second) = rules.rules()
    assert match_deps(first.matches[0]) is NOTHING
    assert match_deps(second.matches[0]) == (128, 3, ())


def test_replayed_paths_count_packets_without_an_entry_as_walked() -> None:
    """With the flow cache on, INVALID and UNTRACKED packets of many source ports are counted as the walk counts them."""
    rules = RAW.format(NOTRACK_9001) + FILTER.format(
        "\n".join(f"-A INPUT -m conntrack {c[0]}" for c in CASES)
    )
    cached, walked = _netns(rules), _netns(rules)
    walked.cache_flows = False
    for i in range(30):
        for kind in KINDS:
            p = replace(PACKETS[kind], sport=41000 + i)
            assert cached.send(p, random.Random(i)) == walked.send(p, random.Random(i))
    assert cached.save(counters=True) == walked.save(counters=True)


# --- the match against a transcription of conntrack_mt, on hand-made packet states ----------------

#: xt_conntrack.h: ``XT_CONNTRACK_STATE_BIT(ctinfo)`` is ``1 << (ctinfo % IP_CT_IS_REPLY + 1)``
#: (IP_CT_ESTABLISHED 0, IP_CT_RELATED 1, IP_CT_NEW 2); INVALID ``1 << 0``; SNAT, DNAT and
#: UNTRACKED ``1 << (IP_CT_NUMBER + 1, 2, 3)`` with IP_CT_NUMBER 5.
_STATE_BIT = {
    "INVALID": 1,
    "ESTABLISHED": 2,
    "RELATED": 4,
    "NEW": 8,
    "SNAT": 1 << 6,
    "DNAT": 1 << 7,
    "UNTRACKED": 1 << 8,
}


def _kernel(
    m: Conntrack,
    state: str,
    entry: bool,
    reply: bool,
    dnat: bool,
    snat: bool,
    orig: tuple[int, int, int, int],
    repl: tuple[int, int, int, int],
) -> bool:
    """``conntrack_mt`` over bit masks and XOR, statement by statement as in xt_conntrack.c."""
    from emulation.addr import parse_cidr
    from emulation.netfilter.matches.base import parse_port_range

    statebit = _STATE_BIT[state]
    if m.states:
        if entry:
            statebit |= (_STATE_BIT["SNAT"] if snat else 0) | (_STATE_BIT["DNAT"] if dnat else 0)
        mask = sum(_STATE_BIT[s] for s in m.states)
        if bool(mask & statebit) ^ (not m.states_neg):
            return False
    if not entry:
        return bool(m.states)
    if m.direction is not None and ((not reply) ^ (m.direction == "ORIGINAL")):
        return False
    for opt, neg, value in m.tuple_checks:
        tup = orig if opt.startswith("--ctorig") else repl
        name = opt.removeprefix("--ctorig").removeprefix("--ctrepl")
        got = tup[{"src": 0, "srcport": 1, "dst": 2, "dstport": 3}[name]]
        if name.endswith("port"):
            lo, hi = parse_port_range(value)
            hit = lo <= got <= hi
        else:
            hit = parse_cidr(value).contains(4, got)
        if hit ^ (not neg):
            return False
    return True


_ADDRS = [0xCB007102, 0xC0A80002, 0x0A000001]  # 203.0.113.2, 192.168.0.2, 10.0.0.1
_TUPLE_OPTS = {"--ctorigsrc": ["203.0.113.2", "10.0.0.0/8"], "--ctorigdst": ["192.168.0.2"], "--ctreplsrc": ["10.0.0.0/8"],
               "--ctrepldst": ["203.0.113.2"], "--ctorigsrcport": ["40000:40010"], "--ctorigdstport": ["80"],
               "--ctreplsrcport": ["1:100"], "--ctrepldstport": ["40003"]}  # fmt: skip


@st.composite
def _matches(draw: st.DrawFn) -> Conntrack:
    states = draw(st.frozensets(st.sampled_from(sorted(_STATE_BIT)), max_size=3))
    opts = draw(st.lists(st.sampled_from(sorted(_TUPLE_OPTS)), unique=True, max_size=3))
    checks = tuple((o, draw(st.booleans()), draw(st.sampled_from(_TUPLE_OPTS[o]))) for o in sorted(opts))
    direction = draw(st.sampled_from([None, "ORIGINAL", "REPLY"]))
    if not states and not checks and direction is None:
        states = frozenset({"INVALID"})
    return Conntrack(
        states=states,
        states_neg=bool(states) and draw(st.booleans()),
        tuple_checks=checks,
        direction=direction,
    )


@settings(max_examples=300, deadline=None)
@given(
    m=_matches(),
    state=st.sampled_from(["INVALID", "UNTRACKED", "NEW", "ESTABLISHED", "RELATED", "before conntrack"]),
    notrack=st.booleans(),
    reply=st.booleans(),
    dnat=st.booleans(),
    snat=st.booleans(),
    orig=st.tuples(
        st.sampled_from(_ADDRS),
        st.sampled_from([80, 40003]),
        st.sampled_from(_ADDRS),
        st.sampled_from([80, 9003]),
    ),
    repl=st.tuples(
        st.sampled_from(_ADDRS),
        st.sampled_from([80, 40003]),
        st.sampled_from(_ADDRS),
        st.sampled_from([80, 40003]),
    ),
)
def test_match_and_its_compiled_form_equal_conntrack_mt(
    m: Conntrack,
    state: str,
    notrack: bool,
    reply: bool,
    dnat: bool,
    snat: bool,
    orig: tuple[int, int, int, int],
    repl: tuple[int, int, int, int],
) -> None:
    """For any options and packet state, ``test`` and ``compile`` give what the transcribed ``conntrack_mt`` gives."""
    ctx = Ctx(node=make_node(), version=4, src=orig[0], dst=orig[2], sport=orig[1], dport=orig[3], proto="udp",
              iif="eth0", mark=0, length=44, syn=True, now=0.0, dyn=Dynamic(), oracle=lambda p: False,
              set_lookup=None, tracing=False)  # fmt: skip
    entry = state in ("NEW", "ESTABLISHED", "RELATED")
    ctx.notrack = notrack
    if state == "before conntrack":  # raw: ctstate is still the evaluator's initial NEW, no tuples
        kernel_state = "UNTRACKED" if notrack else "INVALID"
    else:
        ctx.ctstate = kernel_state = state
    if entry:
        ctx.ct_orig, ctx.ct_reply, ctx.ct_dir_reply, ctx.ct_dnat, ctx.ct_snat = orig, repl, reply, dnat, snat
    want = _kernel(m, kernel_state, entry, reply, dnat, snat, orig, repl)
    assert m.test(ctx, 0) is want
    pred = m.compile(0)
    assert pred is not None and pred(ctx) is want
