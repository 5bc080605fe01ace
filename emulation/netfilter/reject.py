"""What a REJECT sends back, and that packet's way through the node.

Theory of operation
-------------------
A REJECT (``reject_tg`` in net/ipv4/netfilter/ipt_REJECT.c, ``reject_tg6`` in
net/ipv6/netfilter/ip6t_REJECT.c) drops the packet, but first answers its sender with a packet of
the node's own: an ICMP destination unreachable (``nf_send_unreach`` -> ``icmp_send`` ->
``__icmp_send``, net/ipv4/netfilter/nf_reject_ipv4.c and net/ipv4/icmp.c), an ICMPv6 one
(``nf_send_unreach6`` -> ``icmpv6_send`` -> ``icmp6_send``, net/ipv6/netfilter/nf_reject_ipv6.c
and net/ipv6/icmp.c), with the code of :data:`~emulation.netfilter.targets.REJECT_WITH`, or for
``tcp-reset`` a TCP RST (``nf_send_reset``, ``nf_send_reset6``). :func:`answer_to` builds it:

- Destination: the refused packet's source, as the REJECT saw the packet (after any DNAT).
- Source. ICMP: the refused packet's destination when that is the node's own address
  (``__icmp_send``: ``saddr = iph->daddr`` when the route has ``RTCF_LOCAL``; ``icmp6_send``:
  ``ipv6_chk_addr``); otherwise the one routing picks towards the sender (``saddr = 0``, since
  ``icmp_errors_use_inbound_ifaddr`` is 0 by default, and ``icmp_route_lookup`` takes the output
  route's preferred source: :meth:`~emulation.node.Node.source_address`, or for a sender on the
  node the local route's ``src``: the address itself, 127.0.0.1 for the rest of 127.0.0.0/8).
  RST: always the refused packet's destination, ports swapped (``nf_reject_iphdr_put``,
  ``nf_reject_ip6hdr_put``).
- Length. ICMP: a 20-byte IP header, the 8-byte ICMP header and as much of the refused datagram
  as keeps the error within 576 bytes (``room`` in ``__icmp_send``; RFC 1812 4.3.2.3). ICMPv6: 40
  + 8 + up to 1232 bytes of it (``IPV6_MIN_MTU - sizeof(struct ipv6hdr) - sizeof(struct
  icmp6hdr)`` in ``icmp6_send``). RST: 40 (IPv6: 60) bytes, a bare TCP header.
- Mark 0 (``IP4_REPLY_MARK``/``IP6_REPLY_MARK`` reflect the mark only with ``fwmark_reflect``,
  off by default).
- Nothing is sent for a refused ICMP error or RST (``icmp_pointers[type].error``,
  ``is_ineligible``; "No RST for RST"), to a broadcast or multicast destination (``rt_flags &
  (RTCF_BROADCAST | RTCF_MULTICAST)``; ``IPV6_ADDR_MULTICAST``), to an IPv6 sender that is ``::``
  or multicast, for tcp-reset of a packet that is not TCP, or when there is no route back.

Its conntrack state. ``icmp_glue_bits`` (``icmpv6_getfrag``) and ``nf_send_reset`` call
``nf_ct_attach``: the answer carries the refused packet's entry, confirmed or not, as RELATED in
the other direction (``nf_conntrack_attach``, net/netfilter/nf_conntrack_core.c). Conntrack then
leaves it alone (``nf_conntrack_in``: an attached entry is "previously seen"), so does ``-j CT
--notrack`` (``xt_ct_target``: ``skb->_nfct != 0``), and nothing confirms or refreshes the entry
(``nf_conntrack_confirm`` skips ``IP_CT_RELATED_REPLY``). So ``--ctstate RELATED`` (and SNAT or
DNAT when the entry is translated) matches it, ``NEW`` and ``INVALID`` do not, and ``--ctdir`` is
the reverse of the refused packet's (``conntrack_mt`` in net/netfilter/xt_conntrack.c: the state
bit of ``IP_CT_RELATED_REPLY`` is RELATED's). A refused packet with no entry (INVALID) lends none:
conntrack finds none for the answer either (``nf_conntrack_inet_error`` for an error quoting a
packet without one, ``tcp_new`` refusing a RST), so it is INVALID, or UNTRACKED after a NOTRACK in
raw. An UNTRACKED refused packet lends "RELATED, no entry", which is INVALID and which NOTRACK
cannot change. (On Linux 6.18: a port unreachable for a new UDP flow matched ``--ctstate
RELATED`` and ``--ctdir REPLY`` in OUTPUT and over ``lo`` in INPUT, not INVALID or NEW.)

NAT. The nat chains never see an ICMP error with an entry: ``nf_nat_ipv4_fn`` hands RELATED ICMP
to ``nf_nat_icmp_reply_translation``, which translates it as the entry asks: where a manip of
the answer's direction is set (``statusbit``), its source (POSTROUTING, INPUT) or destination
(OUTPUT, PREROUTING) becomes that of the inverted tuple of the other direction; the source of
an error for a DNATed flow, say, becomes the address the client spoke to. A RST goes through
``nf_nat_packet`` the same way, except that a flow not yet confirmed has no source mapping, so
nat POSTROUTING walks its rules for the RST (``nf_nat_inet_fn``: ``IP_CT_RELATED_REPLY`` falls
through to ``IP_CT_NEW``). NAT targets met there are counted but not applied.

Its path, as ``ip_local_out`` sends it, runs the stages of the declared hook order
(:data:`~emulation.netfilter.hooks.STAGES`): OUTPUT (raw, conntrack, mangle, nat, filter,
security), POSTROUTING (mangle, nat); an answer to the node itself then comes back over ``lo``
through PREROUTING (raw, conntrack, mangle, nat) and INPUT (mangle, filter, security, nat). At
each nat stage the entry's translation above is applied instead of the nat chains. It is
counted by every rule it matches and may be dropped; that changes nothing for the refused packet.

Not modelled: the ICMP rate limits (per destination, ``icmp_ratelimit``: a burst of 6, then one
a second; and the global ``icmp_msgs_per_sec``): every answer is sent, as on a node with
``net.ipv4.icmp_ratelimit=0`` and ``net.ipv6.icmp.ratelimit=0`` sending fewer than 50 at once.
The answer's ICMP type and its RST flag are invisible to ``--icmp-type`` and ``--tcp-flags`` (the
emulated ICMP packet is an echo request and a non-SYN segment an ACK). Interface MTUs below 576
bytes, IP options, ``icmp_errors_use_inbound_ifaddr`` and ``fwmark_reflect`` are not modelled, nor
a route back over an interface without an address of the family (no answer here). A CONNMARK on
the answer's path does not write back to the entry. A refused TCP segment other than a SYN is
taken for one without RST (the packet model has no TCP flags but SYN), so it gets its RST.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from emulation.addr import format_address, parse_address
from emulation.conntrack import ConntrackTable
from emulation.netfilter.context import Ctx, Dynamic, SetLookup, TraceStep
from emulation.netfilter.counters import Counters, commit_walk
from emulation.netfilter.hooks import CONNTRACK, NAT, SOURCE_NAT_HOOKS, STAGES, Hook
from emulation.netfilter.outcome import Outcome
from emulation.netfilter.rules import Rule, Ruleset
from emulation.netfilter.targets import Reject
from emulation.netfilter.traverse import ChainWalk, run_chain
from emulation.netfilter.verdicts import CtState, Verdict
from emulation.node import Node, RouteResult
from emulation.packet import Packet

__all__ = [
    "ICMP_ERROR",
    "TCP_RESET",
    "Answer",
    "Rejected",
    "RuleOf",
    "answer_to",
    "rejected",
    "rejected_new_flow",
    "send_answers",
]

#: ``rule_of(uid)``: the rule of the current ruleset with that uid, or ``None``.
RuleOf = Callable[[int], "Rule | None"]

#: The kinds of answer.
ICMP_ERROR, TCP_RESET = "icmp-error", "tcp-reset"
#: ``ICMP_DEST_UNREACH`` and ``ICMPV6_DEST_UNREACH``.
_DEST_UNREACH = {4: 3, 6: 1}
#: Bytes of the refused datagram an error quotes at most: ``576 - sizeof(struct iphdr) -
#: sizeof(struct icmphdr)``; ``IPV6_MIN_MTU - sizeof(struct ipv6hdr) - sizeof(struct icmp6hdr)``.
_QUOTED_MAX = {4: 576 - 20 - 8, 6: 1280 - 40 - 8}
#: IP and ICMP headers of an error; IP and TCP headers of a RST (no options, no payload).
_ICMP_HEADERS = {4: 20 + 8, 6: 40 + 8}
_RST_BYTES = {4: 20 + 20, 6: 40 + 20}

#: The conntrack an answer carries: the refused packet's entry (RELATED); "RELATED without an
#: entry" (lent by an UNTRACKED packet); nothing (conntrack looks and finds none); UNTRACKED.
_ENTRY, _NULL, _NONE, _UNTRACKED = "entry", "null", "none", "untracked"

#: A conntrack tuple as ``(src, sport, dst, dport)``.
Tuple4 = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """A packet a REJECT refused, as the REJECT saw it, and its conntrack entry.

    Attributes:
        packet: its header at the REJECT (after any DNAT; ``length`` in bytes).
        with_: the rule's ``--reject-with`` (a canonical name of ``REJECT_WITH``).
        ctstate: its state: NEW, ESTABLISHED, RELATED, INVALID or UNTRACKED.
        confirmed: its entry is in the table (rather than made for this packet and never confirmed).
        reply: it went in the entry's reply direction.
        ct_orig, ct_reply: the entry's tuples as ``(src, sport, dst, dport)``; ``None`` without one.
        dnat, snat: the entry's destination / source is translated.
        ctmark: the entry's mark.
        kind: ``""``, or :data:`ICMP_ERROR` / :data:`TCP_RESET` when it is itself an answer.
    """

    packet: Packet
    with_: str
    ctstate: CtState
    confirmed: bool = False
    reply: bool = False
    ct_orig: Tuple4 | None = None
    ct_reply: Tuple4 | None = None
    dnat: bool = False
    snat: bool = False
    ctmark: int = 0
    kind: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """The packet the kernel sends for a REJECT (see the module docstring).

    Attributes:
        packet: as generated on the node: ``in_interface`` ``None``, mark 0, ``length`` in bytes;
            ``protocol`` ``icmp`` (ICMPv6 for IPv6; ports 0) or ``tcp`` (a RST; ``syn`` False).
        kind: :data:`ICMP_ERROR` or :data:`TCP_RESET`.
        icmp_type, icmp_code: of an error (a destination unreachable); ``None`` for a RST.
        route: the routing decision towards its destination.
        refused: what it answers.
    """

    packet: Packet
    kind: str
    icmp_type: int | None
    icmp_code: int | None
    route: RouteResult
    refused: Rejected

    def describe(self) -> str:
        """``ICMP 3/3 192.168.0.2 > 203.0.113.2, 88 bytes`` or ``TCP RST a:p > b:q, 40 bytes``."""
        p = self.packet
        if self.kind == TCP_RESET:
            return f"TCP RST {_hostport(p.src, p.sport)} > {_hostport(p.dst, p.dport)}, {p.length} bytes"
        name = "ICMP" if p.version == 4 else "ICMPv6"
        return f"{name} {self.icmp_type}/{self.icmp_code} {p.src} > {p.dst}, {p.length} bytes"


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _unanswerable(node: Node, version: int, src: int, dst: int) -> bool:
    """Whether the kernel sends nothing for a packet between these addresses: a broadcast or
    multicast destination, or a source that is no single host (``icmp6_send`` refuses ``::`` and
    multicast; IPv4 drops such sources as martians before any rule, ``ip_route_input_slow``)."""
    if version == 6:
        return dst >> 120 == 0xFF or src >> 120 == 0xFF or src == 0
    return src == 0 or any(node.address_type(4, a) in ("BROADCAST", "MULTICAST") for a in (src, dst))


def _local_source(node: Node, version: int, value: int, text: str) -> str:
    """The ``src`` of the local route to an address of the node: itself when an interface
    holds it, else (the rest of 127.0.0.0/8) 127.0.0.1."""
    for iface in node.interfaces:
        for cidr in iface.addresses:
            if parse_address(cidr.partition("/")[0]) == (version, value):
                return text
    return "127.0.0.1" if version == 4 else text


def answer_to(node: Node, refused: Rejected) -> Answer | None:
    """The packet the kernel sends for ``refused``, or ``None`` when it sends nothing."""
    p = refused.packet
    code = Reject(refused.with_).icmp_code
    if refused.kind == ICMP_ERROR or (refused.kind == TCP_RESET and code is None):
        return None  # no error for an error, no RST for a RST
    if code is None and p.protocol != "tcp":
        return None  # nf_reject_ip_tcphdr_get: not TCP
    version, src = parse_address(p.src)
    dst = parse_address(p.dst)[1]
    if _unanswerable(node, version, src, dst):
        return None
    route = node.route(version, src)
    if route.kind not in ("local", "unicast"):
        return None
    if code is None:
        rst = Packet(src=p.dst, dst=p.src, sport=p.dport, dport=p.sport, protocol="tcp",
                     length=_RST_BYTES[version], syn=False)  # fmt: skip
        return Answer(packet=rst, kind=TCP_RESET, icmp_type=None, icmp_code=None, route=route,
                      refused=refused)  # fmt: skip
    if node.is_local(version, dst):
        source: str | None = p.dst
    elif route.kind == "local":
        source = _local_source(node, version, src, p.src)
    else:
        source = node.source_address(route.device or "lo", version, route.nexthop, src)
    if source is None:
        return None
    error = Packet(src=source, dst=p.src, protocol="icmp", syn=False,
                   length=_ICMP_HEADERS[version] + min(p.length, _QUOTED_MAX[version]))  # fmt: skip
    return Answer(packet=error, kind=ICMP_ERROR, icmp_type=_DEST_UNREACH[version], icmp_code=code,
                  route=route, refused=refused)  # fmt: skip


# --- the refused packet ------------------------------------------------------------------------


def rejected(
    packet: Packet, outcome: Outcome, ctx: Ctx, conntrack: ConntrackTable, rule_of: RuleOf
) -> Rejected | None:
    """What the REJECT that decided ``outcome`` refused, from the walk's context ``ctx``:
    ``packet`` as the rule saw it; ``None`` when no REJECT rule decided it."""
    target = _reject_target(rule_of, ctx.hits[-1] if ctx.hits else None)
    if target is None:
        return None
    key = (ctx.version, parse_address(packet.src)[1], packet.sport, parse_address(packet.dst)[1],
           packet.dport, packet.protocol)  # fmt: skip
    confirmed = ctx.ct_orig is not None and conntrack.lookup(key) is not None
    return _from_ctx(outcome.packet, target.with_, ctx, confirmed=confirmed)


def rejected_new_flow(
    packet: Packet, outcome: Outcome, last_hit: int | None, ctmark: int, rule_of: RuleOf
) -> Rejected | None:
    """What the REJECT that decided a new flow's ``outcome`` refused, from what its path left:
    the uid of the last rule it matched (the REJECT's) and its ctmark. ``None`` when no REJECT
    rule decided it."""
    target = _reject_target(rule_of, last_hit)
    if target is None:
        return None
    final, state = outcome.packet, outcome.ctstate
    if state in (CtState.INVALID, CtState.UNTRACKED):
        return Rejected(packet=final, with_=target.with_, ctstate=state)
    return Rejected(
        packet=final,
        with_=target.with_,
        ctstate=state,
        ct_orig=(parse_address(packet.src)[1], packet.sport, parse_address(packet.dst)[1], packet.dport),
        ct_reply=(parse_address(final.dst)[1], final.dport, parse_address(final.src)[1], final.sport),
        dnat=outcome.dnat,
        snat=outcome.snat,
        ctmark=ctmark,
    )


def _from_ctx(final: Packet, with_: str, ctx: Ctx, *, confirmed: bool, kind: str = "") -> Rejected:
    """The refused packet ``final`` of a walk that ended in ``ctx``."""
    if ctx.ctstate in (CtState.INVALID, CtState.UNTRACKED) or ctx.ct_orig is None:
        return Rejected(packet=final, with_=with_, ctstate=ctx.ctstate, kind=kind)
    return Rejected(packet=final, with_=with_, ctstate=ctx.ctstate, confirmed=confirmed,
                    reply=ctx.ct_dir_reply, ct_orig=ctx.ct_orig, ct_reply=ctx.ct_reply, dnat=ctx.ct_dnat,
                    snat=ctx.ct_snat, ctmark=ctx.ctmark, kind=kind)  # fmt: skip


def _reject_target(rule_of: RuleOf, uid: int | None) -> Reject | None:
    """The REJECT target of rule ``uid``, if that rule's target is a REJECT."""
    rule = None if uid is None else rule_of(uid)
    return rule.target if rule is not None and isinstance(rule.target, Reject) else None


# --- the answer's path -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class _Env:
    """What an answer's walk reads besides the answer: the sending Netns's state."""

    node: Node
    ruleset: Ruleset
    now: float
    dyn: Dynamic
    oracle: Callable[[float], bool]
    set_lookup: SetLookup | None
    tracing: bool
    walk: ChainWalk | None
    rule_of: RuleOf


class _Walk:
    """One answer's way through the hooks (see the module docstring)."""

    def __init__(self, env: _Env, answer: Answer) -> None:
        self.env, self.answer = env, answer
        p, refused = answer.packet, answer.refused
        version, src = parse_address(p.src)
        ctx = self.ctx = Ctx(node=env.node, version=version, src=src, dst=parse_address(p.dst)[1],
                             sport=p.sport, dport=p.dport, proto=p.protocol, iif=None, mark=0,
                             length=p.length, syn=False, now=env.now, dyn=env.dyn, oracle=env.oracle,
                             set_lookup=env.set_lookup, tracing=env.tracing)  # fmt: skip
        ctx.oif = answer.route.device
        self.routed = ctx.dst  # the destination OUTPUT's routing decision was made for
        ctx.ctstate = CtState.INVALID  # until conntrack has seen it (unless an entry came attached)
        if refused.ctstate == CtState.UNTRACKED:
            self.nfct = _NULL
        elif refused.ct_orig is None or refused.ct_reply is None:
            self.nfct = _NONE
        else:
            self.nfct = _ENTRY
            ctx.ctstate = CtState.RELATED
            ctx.ct_orig, ctx.ct_reply, ctx.ct_dir_reply = refused.ct_orig, refused.ct_reply, not refused.reply
            ctx.ct_dnat, ctx.ct_snat, ctx.ctmark = refused.dnat, refused.snat, refused.ctmark

    def run(self) -> Verdict:
        """The answer's verdict: ACCEPT (sent out, or delivered over ``lo``), DROP or REJECT."""
        ctx, route = self.ctx, self.answer.route
        v = self._hook(Hook.OUTPUT)
        if v != Verdict.ACCEPT:
            return v
        if ctx.dst != self.routed:  # nf_nat_ipv4_local_fn routes it again
            route = self.env.node.route(ctx.version, ctx.dst)
            if route.kind not in ("local", "unicast"):
                return Verdict.DROP
            ctx.oif = route.device
        v = self._hook(Hook.POSTROUTING)
        if v != Verdict.ACCEPT or route.kind != "local":
            return v
        ctx.iif, ctx.oif = "lo", None
        v = self._hook(Hook.PREROUTING)
        if v != Verdict.ACCEPT:
            return v
        return self._hook(Hook.INPUT)

    def _hook(self, hook: Hook) -> Verdict:
        """Run ``hook``'s stages (:data:`~emulation.netfilter.hooks.STAGES`) for the answer."""
        ctx = self.ctx
        ctx.hook = hook
        tables = self.env.ruleset.tables
        for stage in STAGES[hook]:
            if stage == CONNTRACK:
                self._conntrack()
                continue
            if stage == NAT:
                v = self._nat(hook)
            else:
                table = tables.get(stage)
                chain = None if table is None else table.chains.get(hook)
                if table is None or chain is None:
                    continue
                v = run_chain(ctx, table, chain, self.env.walk)
            if v != Verdict.ACCEPT:
                return v
        return Verdict.ACCEPT

    def _nat(self, hook: Hook) -> Verdict:
        """The nat stage: the entry's translation of the answer (the nat chains never see it),
        except that a RST of a flow not yet confirmed has no source mapping, so nat
        POSTROUTING walks its rules for it first (their NAT targets are counted, not applied)."""
        source = hook in SOURCE_NAT_HOOKS
        if not source:
            self.routed = self.ctx.dst
        elif (
            hook == Hook.POSTROUTING
            and self.answer.kind == TCP_RESET
            and self.nfct == _ENTRY
            and not self.answer.refused.confirmed
        ):
            table = self.env.ruleset.tables.get(NAT)
            chain = None if table is None else table.chains.get(hook)
            if table is not None and chain is not None:
                v = run_chain(self.ctx, table, chain, self.env.walk)
                if v != Verdict.ACCEPT:
                    return v
        self._translate(source=source)
        return Verdict.ACCEPT

    def _conntrack(self) -> None:
        """The conntrack hook. An attached entry, or "RELATED without an entry", is left as it
        is (a NOTRACK before it changed nothing); with none, conntrack finds none (INVALID)
        unless raw made the answer UNTRACKED. A RST's "RELATED without an entry" is cleared
        here (``nf_conntrack_in`` drops the entry it made, as ``tcp_new`` refuses a RST)."""
        ctx = self.ctx
        if self.nfct == _NULL and self.answer.kind == TCP_RESET:
            self.nfct = _NONE
        elif self.nfct == _NONE and ctx.notrack:
            self.nfct, ctx.ctstate = _UNTRACKED, CtState.UNTRACKED
        ctx.notrack = False

    def _translate(self, *, source: bool) -> None:
        """``nf_nat_icmp_reply_translation`` (``nf_nat_packet`` for a RST) at a manip of the
        source (POSTROUTING, INPUT) or of the destination (OUTPUT, PREROUTING): done when the
        entry has that manip for the answer's direction (``statusbit``), to the inverted tuple
        of the other direction."""
        ctx = self.ctx
        if self.nfct != _ENTRY or ctx.ct_orig is None or ctx.ct_reply is None:
            return
        original = not ctx.ct_dir_reply
        # statusbit: IPS_SRC_NAT for a source manip, IPS_DST_NAT otherwise; swapped for a reply.
        if not (ctx.ct_snat if source == original else ctx.ct_dnat):
            return
        other = ctx.ct_reply if original else ctx.ct_orig  # tuplehash[!dir], (src, sport, dst, dport)
        ports = self.answer.kind == TCP_RESET
        if source:  # the inverted tuple's source is the other direction's destination
            ctx.src = other[2]
            ctx.sport = other[3] if ports else ctx.sport
        else:
            ctx.dst = other[0]
            ctx.dport = other[1] if ports else ctx.dport

    def header(self) -> Packet:
        """The answer as it is now (addresses and ports after any translation)."""
        ctx, p = self.ctx, self.answer.packet
        src = p.src if parse_address(p.src)[1] == ctx.src else format_address(ctx.version, ctx.src)
        dst = p.dst if parse_address(p.dst)[1] == ctx.dst else format_address(ctx.version, ctx.dst)
        return Packet(src=src, dst=dst, sport=ctx.sport, dport=ctx.dport, protocol=p.protocol, mark=ctx.mark,
                      length=p.length, syn=False)  # fmt: skip


# --- sending ------------------------------------------------------------------------------------


def _steps(answer: Answer, ctx: Ctx) -> Iterator[TraceStep]:
    """The answer's trace: a step naming it (result ``answer``), then its own steps with
    ``answer:`` before their result (``answer:match``, ``answer:policy`` ...)."""
    yield TraceStep(hook="OUTPUT", table="", chain="", index=0, line=0,
                    rule=f"REJECT --reject-with {answer.refused.with_} answered: {answer.describe()}",
                    result="answer", target="")  # fmt: skip
    for step in ctx.trace:
        yield replace(step, result=f"answer:{step.result}")


def send_answers(
    outcome: Outcome,
    refused: Rejected | None,
    *,
    node: Node,
    ruleset: Ruleset,
    counters: Counters,
    dyn: Dynamic,
    now: float,
    oracle: Callable[[float], bool],
    set_lookup: SetLookup | None,
    tracing: bool,
    walk: ChainWalk | None,
    rule_of: RuleOf,
) -> Outcome:
    """Send the answer to ``refused`` through the node, counting it (and the answer to that
    answer, when a REJECT refuses it in turn: an ICMP error for a RST). Chains are walked with
    ``walk`` (``None``: the plain walk); ``rule_of`` finds a rule of ``ruleset`` by uid.

    Returns:
        ``outcome`` itself; with ``tracing``, a copy whose trace goes on with the answers' steps
        (see :func:`_steps`).
    """
    env = _Env(node=node, ruleset=ruleset, now=now, dyn=dyn, oracle=oracle, set_lookup=set_lookup,
               tracing=tracing, walk=walk, rule_of=rule_of)  # fmt: skip
    steps: list[TraceStep] = []
    while refused is not None:
        answer = answer_to(node, refused)
        if answer is None:
            break
        way = _Walk(env, answer)
        verdict = way.run()
        commit_walk(way.ctx, counters, dyn)
        if tracing:
            steps += _steps(answer, way.ctx)
        refused = None
        if verdict == Verdict.REJECT:
            ctx = way.ctx
            target = _reject_target(rule_of, ctx.hits[-1] if ctx.hits else None)
            if target is not None:
                refused = _from_ctx(way.header(), target.with_, ctx, confirmed=answer.refused.confirmed,
                                    kind=answer.kind)  # fmt: skip
    if not steps:
        return outcome
    return replace(outcome, trace=(*outcome.trace, *steps))
