"""A packet's way through the hooks of a node, in the kernel's order, with conntrack and NAT.

Arriving on an interface: raw PREROUTING, conntrack, mangle PREROUTING, nat PREROUTING (first
packet of a flow only; later ones reuse its translation), the routing decision on the
translated destination, then either INPUT (mangle, filter, security, nat for SNAT) for a local
destination, or FORWARD (mangle, filter, security) and POSTROUTING (mangle, nat). Generated
locally: route, raw/mangle/nat/filter/security OUTPUT, re-route if the destination or mark
changed, POSTROUTING; a local destination then loops through ``lo`` (raw and mangle
PREROUTING, then INPUT; nat is not consulted again). Hook priorities from
include/uapi/linux/netfilter_ipv4.h.

Two modes share one pure evaluation: :meth:`Netns.send` samples (statistic matches draw from
the caller's ``random.Random``; counters, ``recent`` lists, ``nth`` counters and conntrack are
updated) and :meth:`Netns.enumerate` returns every outcome with its probability (a
``statistic --mode random`` match branches; nothing is updated, not even counters).

Untraced, the first packet of a flow is looked up in the flow cache
(:mod:`emulation.netfilter.flowcache`) and, when a packet equal in the fields its path reads
went before, the recorded path is replayed instead of walked: the same draws, counters,
conntrack entry and outcome, without testing a rule.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from emulation.addr import format_address, parse_address, parse_cidr
from emulation.clock import Clock
from emulation.conntrack import ConntrackEntry, ConntrackTable, FlowKey, timeout_s
from emulation.netfilter import flowcache
from emulation.netfilter.context import Ctx, Dynamic, SetLookup, TraceStep, commit_walk
from emulation.netfilter.flowcache import FlowCache, FlowSet, Recorder, Segment, Summary
from emulation.netfilter.nat import PORTED, SourceRange, choose_source_port, port_range, search_ports
from emulation.netfilter.rules import Ruleset
from emulation.netfilter.ruleset import Counters, apply_restore, save
from emulation.netfilter.traverse import run_chain
from emulation.node import Node
from emulation.packet import Packet, unchecked_replace
from emulation.slots import maker

__all__ = ["Netns", "Outcome"]

_LOOPBACK4 = parse_cidr("127.0.0.0/8")


def _loopback(version: int, value: int) -> bool:
    """``_LOOPBACK4.contains(version, value)``, inlined: in 127.0.0.0/8."""
    return version == 4 and value >> 24 == 127


#: Values no packet has, given to the probe that summarizes a recorded path.
_MARK_SRC, _MARK_DST, _MARK_SPORT, _MARK_DPORT = -11, -13, -12, -14
#: Why a packet whose source mapping found no free reply tuple is dropped.
_TUPLE_TAKEN = "NAT: no source port leaves a free reply tuple (conntrack confirmation fails)"


def _zero() -> int:
    return 0


def _martian_source4(src: int, dst: int) -> bool:
    """An IPv4 source input routing refuses (ip_route_input_slow): multicast or the limited
    broadcast; or 0.0.0.0/8, unless sent to the limited broadcast or from and to 0.0.0.0."""
    if src >> 28 == 0xE or src == 0xFFFFFFFF:
        return True
    return src >> 24 == 0 and dst != 0xFFFFFFFF and not (src == 0 and dst == 0)


def _sampler(rand: Callable[[], float] | None) -> Callable[[float], bool]:
    """Sample mode's oracle: a draw of probability ``p`` holds when ``rand() < p``."""
    assert rand is not None, "an oracle or a generator is needed"
    return lambda p: rand() < p


def _no_draw(p: float) -> bool:
    raise AssertionError("a recorded path's effects draw no random numbers")


_PRE = ("mangle", "nat")
_IN = ("mangle", "filter", "security", "nat")
_FWD = ("mangle", "filter", "security")
_OUT = ("mangle", "nat", "filter", "security")
_POST = ("mangle", "nat")


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What happened to one packet.

    Attributes:
        verdict: ``ACCEPT``, ``DROP`` or ``REJECT``.
        delivery: ``local`` (delivered to a socket on the node), ``forward`` (sent out
            ``out_interface``) or ``none`` (dropped or rejected).
        packet: the packet as delivered or sent, after NAT (its ``mark`` is the final mark).
        ctstate: the conntrack state it had (NEW, ESTABLISHED, INVALID, UNTRACKED).
        dnat, snat: its destination / source was translated; ``masquerade``: by MASQUERADE.
        reason: a short human explanation (which chain or policy decided, or a routing cause).
        uncertain: an unknown match or target was met on the way, so this may be wrong.
        trace: every rule and policy met, when tracing was asked for (else empty).
    """

    verdict: str
    delivery: str
    out_interface: str | None
    packet: Packet
    ctstate: str
    dnat: bool
    snat: bool
    masquerade: bool
    reason: str
    uncertain: bool
    trace: tuple[TraceStep, ...] = ()

    @property
    def destination(self) -> str:
        """``ip:port`` (``[ip]:port`` for IPv6) the packet finally went to."""
        host = f"[{self.packet.dst}]" if ":" in self.packet.dst else self.packet.dst
        return f"{host}:{self.packet.dport}"


_make_outcome = maker(Outcome)


def _delivered(
    packet: Packet,
    version: int,
    src: int,
    dst: int,
    new_src: int,
    new_dst: int,
    sport: int,
    dport: int,
    mark: int,
    device: str | None,
    src_text: str | None = None,
    dst_text: str | None = None,
) -> Packet:
    """The packet as delivered or sent: ``packet`` itself when nothing changed; an address
    that ends as it began keeps the packet's own text (say, IPv6 in capitals). ``src_text``
    and ``dst_text``, when given, are the texts of ``new_src`` and ``new_dst``."""
    if (
        new_src == src
        and new_dst == dst
        and sport == packet.sport
        and dport == packet.dport
        and mark == packet.mark
        and device == packet.out_interface
    ):
        return packet
    return unchecked_replace(
        packet,
        src=packet.src if new_src == src else src_text or format_address(version, new_src),
        dst=packet.dst if new_dst == dst else dst_text or format_address(version, new_dst),
        sport=sport,
        dport=dport,
        mark=mark,
        out_interface=device,
    )


class _Chooser:
    """The oracle for statistic matches in enumerate mode: replays a prefix of choices."""

    def __init__(self, prefix: list[bool]) -> None:
        self.prefix = prefix
        self.taken: list[tuple[float, bool]] = []

    def __call__(self, p: float) -> bool:
        k = len(self.taken)
        choice = self.prefix[k] if k < len(self.prefix) else p > 0.0
        self.taken.append((p, choice))
        return choice


class Netns:
    """One node's netfilter state: rules, counters, ``recent`` lists, conntrack, clock.

    A thin mutable shell: :meth:`restore` swaps in a new immutable ruleset atomically, and
    :meth:`send` commits the effects of one evaluated packet.

    Args:
        node: addresses, interfaces, routes and sysctls.
        clock: seconds for conntrack and ``recent``.
        ruleset: initial rules (default: none, every policy ACCEPT).
        set_lookup: ipset membership for ``-m set`` (``None``: such matches are unknown).

    Attributes:
        indexed: when tracing is off, run chains compiled and indexed (the default); ``False``
            walks every rule as written, as a traced packet does. Both give the same outcomes,
            counters and state; the plain walk is the reference the index is tested against.
        cache_flows: when indexed and untraced, replay the recorded paths of new flows from
            the flow cache (the default); ``False`` walks every packet. Same results either way.
    """

    def __init__(
        self, node: Node, clock: Clock, *, ruleset: Ruleset | None = None, set_lookup: SetLookup | None = None
    ) -> None:
        self.node = node
        self.clock = clock
        self.ruleset = ruleset or Ruleset()
        self.set_lookup = set_lookup
        self._counters = Counters()
        self.dynamic = Dynamic()
        self.conntrack = ConntrackTable(clock)
        self.indexed = True
        self.cache_flows = True
        self._flows: FlowCache | None = None

    @property
    def flow_cache(self) -> FlowCache | None:
        """The flow cache of the current rules (``None`` before the first cached packet)."""
        return self._flows

    @property
    def counters(self) -> Counters:
        """Live rule and policy counters (packets counted by the flow cache folded in first)."""
        if self._flows is not None:
            self._flows.fold(self._counters)
        return self._counters

    @counters.setter
    def counters(self, value: Counters) -> None:
        if self._flows is not None:
            self._flows.fold(self._counters)
        self._counters = value

    # --- rules ---------------------------------------------------------------------------------

    def restore(
        self, text: str, *, noflush: bool = False, strict: bool = False, counters: bool = False
    ) -> None:
        """``iptables-restore``: atomic; on :class:`NetfilterError` nothing changes.

        Without ``noflush`` each table in ``text`` is replaced whole, so its built-in chains'
        policy counters restart from what ``text`` declares (``[0:0]`` unless ``counters``),
        as the kernel's do; the packets counted live so far in them are dropped.
        """
        old = self.ruleset
        new = apply_restore(old, text, noflush=noflush, strict=strict, counters=counters)
        if not noflush:
            live = self.counters.policies
            for table, chain in list(live):
                if new.tables.get(table) is not old.tables.get(table):
                    del live[(table, chain)]
        self.ruleset = new

    def save(self, *, counters: bool = False) -> str:
        """``iptables-save [-c]`` of the current state, with live counters."""
        return save(self.ruleset, counters=counters, live=self.counters)

    # --- packets -------------------------------------------------------------------------------

    def send(self, packet: Packet, rng: random.Random, *, trace: bool = False) -> Outcome:
        """Evaluate one packet, sampling random matches from ``rng``, and commit its effects.

        A packet a REJECT refuses is answered as the kernel answers it (an ICMP error or a TCP
        RST, :mod:`emulation.netfilter.reject`): the answer walks the node's OUTPUT hooks (and
        INPUT when it comes back to the node), its rules count it, and draws for it come from
        ``rng`` too; the returned outcome is the refused packet's all the same. With ``trace``,
        the answer's steps follow the packet's own: first one of result ``answer`` naming it,
        then its rules and policies with results ``answer:match``, ``answer:nomatch``,
        ``answer:unknown`` and ``answer:policy``.

        Raises:
            ValueError: the packet's family is not the rules' (``ruleset.version``), or its
                ``in_interface`` is not one of the node's.
        """
        rand = rng.random
        outcome, effects, commit = self._evaluate(packet, None, trace, rand)
        if isinstance(effects, list):  # replayed from the flow cache: count its segments
            nbytes = packet.length
            dirty = self._flows.dirty  # type: ignore[union-attr]
            for seg in effects:
                if not seg.packets:
                    dirty.append(seg)
                seg.packets += 1
                seg.bytes += nbytes
            if commit is not None:
                commit()
        else:
            commit_walk(effects, self._counters, self.dynamic)
            if commit is not None:
                commit()
        if outcome.verdict != "REJECT":
            return outcome
        from emulation.netfilter.reject import rejected, send_answers  # only refused packets need it

        return send_answers(
            outcome,
            rejected(packet, outcome, effects, self.ruleset, self.conntrack),
            node=self.node,
            ruleset=self.ruleset,
            counters=self._counters,
            dyn=self.dynamic,
            now=self.clock.now(),
            oracle=lambda p: rand() < p,
            set_lookup=self.set_lookup,
            tracing=trace,
            indexed=self.indexed,
        )

    def enumerate(self, packet: Packet, *, trace: bool = False) -> list[tuple[float, Outcome]]:
        """Every possible outcome of ``packet`` with its probability (summing to 1).

        A ``statistic --mode random`` match branches into ``p`` and ``1 - p`` (branches of
        probability 0 are left out); ``nth`` matches are decided by the current counters. No
        state changes: counters, ``recent`` lists, ``nth`` counters and conntrack stay as they are.
        """
        results: list[tuple[float, Outcome]] = []
        pending: list[list[bool]] = [[]]
        while pending:
            prefix = pending.pop()
            chooser = _Chooser(prefix)
            outcome, _, _ = self._evaluate(packet, chooser, trace)
            prob = 1.0
            for p, c in chooser.taken:
                prob *= p if c else 1.0 - p
            results.append((prob, outcome))
            for k in range(len(prefix), len(chooser.taken)):
                p, c = chooser.taken[k]
                if (1.0 - p if c else p) > 0.0:
                    pending.append([t[1] for t in chooser.taken[:k]] + [not c])
        return results

    # --- the path ------------------------------------------------------------------------------

    def _evaluate(
        self,
        packet: Packet,
        oracle: Callable[[float], bool] | None,
        tracing: bool,
        rand: Callable[[], float] | None = None,
    ) -> tuple[Outcome, Ctx | list[Segment], Callable[[], None] | None]:
        """One packet's outcome, what to count (the walk's context, or the flow cache segments
        it replayed) and what to commit to conntrack. ``rand``, in sample mode, is the random
        source behind ``oracle`` (a draw of probability ``p`` is ``rand() < p``)."""
        # In sample mode ``oracle`` may be None: a replay needs only ``rand``, and a walk's
        # context makes the oracle from it (see _ctx).
        version, src = parse_address(packet.src)
        _, dst = parse_address(packet.dst)
        if version != self.ruleset.version:
            raise ValueError(
                f"an IPv{version} packet sent to IPv{self.ruleset.version} rules: a Netns holds one family's "
                f"rules (iptables or ip6tables); use one Netns per family"
            )
        node = self.node
        flows = self._flows
        iif = packet.in_interface
        if iif is not None and (flows is None or flows.node is not node or iif not in flows.interfaces):
            if node.interface(iif) is None:
                raise ValueError(f"in_interface={iif!r} is not an interface of the node")
            if flows is not None and flows.node is node:
                flows.interfaces.add(iif)
        if tracing or not self.indexed or not self.cache_flows:
            ctx = self._ctx(packet, version, src, dst, oracle, tracing, rand)
            return _Path(self, ctx, packet, src, dst).run()
        sport, dport, proto = packet.sport, packet.dport, packet.protocol
        if self.conntrack.lookup((version, src, sport, dst, dport, proto)) is not None:
            # An established flow: walked.
            ctx = self._ctx(packet, version, src, dst, oracle, False, rand)
            return _Path(self, ctx, packet, src, dst).run()
        if flows is None or flows.ruleset is not self.ruleset or flows.node is not node:
            if flows is not None:
                flows.fold(self._counters)
            flows = self._flows = FlowCache(self.ruleset, node)
        base = (packet.in_interface, version, proto, packet.syn, packet.mark, dst)
        root = flows.roots.get(base)
        seg: Segment | None = root.find(src, sport, dport) if root is not None else None
        exits: list[int] = []  # per ladder passed: the draw that came out True, or ~len(ps)
        replayed: list[Segment] = []
        while seg is not None:
            if not seg.cacheable:
                break
            if seg.counts:
                replayed.append(seg)
            if seg.end is not None:
                summary = seg.summary
                if summary is None:
                    if seg.recorded is None:
                        break
                    summary = seg.summary = self._summarize(packet, version, seg.recorded)
                    seg.recorded = None
                    seg.ops = ()  # only its summary needed them (fewer objects for the collector)
                return self._replayed(packet, version, src, dst, summary, replayed, rand)
            child: FlowSet | Segment | None
            i = 0
            if rand is not None:  # sample mode: the oracle's own test, without its call
                for p in seg.ps:
                    if rand() < p:
                        child = seg.kids[i]
                        exits.append(i)
                        break
                    i += 1
                else:
                    child = seg.tail
                    exits.append(~i)
            else:
                assert oracle is not None
                for p in seg.ps:
                    if oracle(p):
                        child = seg.kids[i]
                        exits.append(i)
                        break
                    i += 1
                else:
                    child = seg.tail
                    exits.append(~i)
            seg = child.find(src, sport, dport) if type(child) is FlowSet else child  # type: ignore[assignment]
        # Not recorded yet (or uncacheable from here): walk it, redoing the draws already made.
        if exits:
            taken: list[bool] = []
            for i in exits:
                if i < 0:  # every draw of that ladder came out False
                    taken += [False] * ~i
                else:
                    taken += [False] * i
                    taken.append(True)
            made = iter(taken)
            fresh = oracle if oracle is not None else _sampler(rand)

            def resumed(p: float) -> bool:
                c = next(made, None)
                return fresh(p) if c is None else c

            ctx = self._ctx(packet, version, src, dst, resumed, False, rand)
        else:
            ctx = self._ctx(packet, version, src, dst, oracle, False, rand)
        ctx.compile_short = False
        path = _Path(self, ctx, packet, src, dst)
        path.known_new = True
        if seg is not None:  # an uncacheable marker: nothing to record
            return path.run()
        if root is None and flows.first_sight(base):
            # The first packet to a destination is walked only: most of a cold start's would
            # never be replayed, and recording costs about as much as the walk.
            return path.run()
        rec = ctx.rec = Recorder(ctx)
        walk_oracle = ctx.oracle

        def recording(p: float) -> bool:
            c = walk_oracle(p)
            rec.draw(p, c)
            return c

        ctx.oracle = recording
        result = path.run()
        ctx.rec = None
        if rec.done:  # an unknown match or target stopped the recording before it was met
            if flows.full(len(rec.segments)):
                flows.fold(self._counters)
                flows.clear()
            flows.graft(base, src, sport, dport, rec)
        return result

    def source_port(
        self,
        version: int,
        proto: str,
        src: int,
        sport: int,
        dst: int,
        dport: int,
        mapping: SourceRange,
        rand: Callable[[], float] | None,
    ) -> tuple[int, bool]:
        """The source port a new flow ``src:sport -> dst:dport`` gets when mapped to
        ``mapping`` (``address`` ``None``: its own), and whether its reply tuple is free;
        see :func:`~emulation.netfilter.nat.choose_source_port`. Random offsets come from
        ``rand`` (sample mode), or are 0 (``enumerate`` does not branch on them)."""
        addr, low, high, rand_all = mapping
        if addr is None:
            addr = src
        table = self.conntrack
        if rand_all:
            if proto in PORTED:
                # --random-fully, kube-proxy's masquerade: the first port from a random offset is
                # nearly always free; the search goes on from there when it is not.
                first, size = port_range(sport, low, high)
                off = int(rand() * 65536) if rand is not None else 0
                port = first + off % size
                if not table.taken((version, dst, dport, addr, port, proto)):
                    return port, True
                return search_ports(
                    first,
                    size,
                    lambda p: table.taken((version, dst, dport, addr, p, proto)),
                    (lambda: int(rand() * 65536)) if rand is not None else _zero,
                    off=(off + 1) & 0xFFFF,
                    tried=1,
                    last=port,
                    exhaustive=rand is None,
                )
        elif low is None and addr == src and not table.taken((version, dst, dport, addr, sport, proto)):
            return sport, True  # a null binding, decided by one lookup: its own port, free
        return choose_source_port(
            proto=proto,
            src=src,
            sport=sport,
            addr=addr,
            low=low,
            high=high,
            random=rand_all,
            taken=lambda p: table.taken((version, dst, dport, addr, p, proto)),
            mappings=lambda: table.source_mappings(version, src, sport, proto),
            draw16=(lambda: int(rand() * 65536)) if rand is not None else _zero,
            exhaustive=rand is None,
        )

    def _summarize(self, packet: Packet, version: int, segments: list[Segment]) -> Summary:
        """What a recorded path does to any packet that takes it (see :data:`Summary`).

        The path's effects are redone on a probe whose source, destination and ports are
        markers no real packet has: a field still holding its marker at the end was left as
        the packet had it; any other value was written by the path, and is the same for every
        packet taking it (the path is decided by fields that are keyed, the mark among them).
        """
        probe = Ctx(
            node=self.node,
            version=version,
            src=_MARK_SRC,
            dst=_MARK_DST,
            sport=_MARK_SPORT,
            dport=_MARK_DPORT,
            proto=packet.protocol,
            iif=packet.in_interface,
            mark=packet.mark,
            length=packet.length,
            syn=packet.syn,
            now=0.0,
            dyn=Dynamic(),
            oracle=_no_draw,
            set_lookup=None,
            tracing=False,
        )
        path = _Path(self, probe, packet, _MARK_SRC, _MARK_DST)
        path.known_new = True
        path.summarizing = True
        for seg in segments:
            path.replay(seg)  # the draws between them only chose the path
        end = segments[-1].end
        assert end is not None
        verdict, delivery, device, reason = end

        def written(value: int, marker: int) -> int | None:
            return None if value == marker else value

        src, dst = written(probe.src, _MARK_SRC), written(probe.dst, _MARK_DST)
        return (
            verdict,
            delivery,
            device,
            reason,
            probe.ctstate,
            probe.masquerade,
            path.new_flow and verdict == "ACCEPT",
            probe.mark,
            probe.ctmark,
            src,
            written(probe.sport, _MARK_SPORT),
            dst,
            written(probe.dport, _MARK_DPORT),
            None if src is None else format_address(version, src),
            None if dst is None else format_address(version, dst),
            path.source_range,
        )

    def _replayed(
        self,
        packet: Packet,
        version: int,
        src: int,
        dst: int,
        summary: Summary,
        replayed: list[Segment],
        rand: Callable[[], float] | None,
    ) -> tuple[Outcome, list[Segment], Callable[[], None] | None]:
        """The outcome of a packet whose whole path was found in the flow cache."""
        sport, dport = packet.sport, packet.dport
        (
            verdict,
            delivery,
            device,
            reason,
            ctstate,
            masquerade,
            track,
            mark,
            ctmark,
            w_src,
            w_sport,
            w_dst,
            w_dport,
            src_text,
            dst_text,
            source,
        ) = summary
        new_src = src if w_src is None else w_src
        new_dst = dst if w_dst is None else w_dst
        new_sport = sport if w_sport is None else w_sport
        new_dport = dport if w_dport is None else w_dport
        if source is not None:  # the flow's source mapping, chosen for this packet
            new_sport, free = self.source_port(
                version, packet.protocol, src, sport, new_dst, new_dport, source, rand
            )
            if not free:
                verdict, delivery, device, reason, track = "DROP", "none", None, _TUPLE_TAKEN, False
        final = _delivered(
            packet, version, src, dst, new_src, new_dst, new_sport, new_dport, mark, device,
            src_text,
            dst_text,
        )
        outcome = _make_outcome(
            verdict,
            delivery,
            device,
            final,
            ctstate,
            new_dst != dst or new_dport != dport,
            new_src != src or new_sport != sport,
            masquerade,
            reason,
            False,
            (),
        )
        commit = None
        if track:
            proto = packet.protocol
            now = self.clock.now()
            commit = partial(
                self.conntrack.insert,
                (version, src, sport, dst, dport, proto),
                (version, new_dst, new_dport, new_src, new_sport, proto),
                now,
                now + timeout_s(proto, False, 0.0),
                False,
                ctmark,
            )
        return outcome, replayed, commit

    def _ctx(
        self,
        packet: Packet,
        version: int,
        src: int,
        dst: int,
        oracle: Callable[[float], bool] | None,
        tracing: bool,
        rand: Callable[[], float] | None = None,
    ) -> Ctx:
        ctx = Ctx(
            node=self.node,
            version=version,
            src=src,
            dst=dst,
            sport=packet.sport,
            dport=packet.dport,
            proto=packet.protocol,
            iif=packet.in_interface,
            mark=packet.mark,
            length=packet.length,
            syn=packet.syn,
            now=self.clock.now(),
            dyn=self.dynamic,
            oracle=oracle if oracle is not None else _sampler(rand),
            set_lookup=self.set_lookup,
            tracing=tracing,
            indexed=self.indexed,
        )
        ctx.rand = rand
        return ctx


class _Path:
    """One evaluation of one packet (see the module docstring for the order)."""

    def __init__(self, ns: Netns, ctx: Ctx, packet: Packet, src: int, dst: int) -> None:
        self.ns = ns
        self.orig_src, self.orig_dst = src, dst
        self.ctx = ctx
        self.packet = packet
        self.rs = ns.ruleset
        self.entry: ConntrackEntry | None = None
        self.new_flow = False
        self.orig: FlowKey | None = None
        self.pending_src: tuple[int, int] | None = None  # translation of an existing entry
        self.pending_dst: tuple[int, int] | None = None
        self.known_new = False  # the flow cache found no conntrack entry for it already
        self.summarizing = False  # redoing a recorded path on a probe (see Netns._summarize)
        self.confirmed = False  # a new flow's entry was confirmed before the path ended
        #: The source mapping the path asked for (a SourceRange), set while summarizing.
        self.source_range: SourceRange | None = None

    def replay(self, seg: Segment) -> None:
        """Redo the effects of a recorded segment in order (for :meth:`Netns._summarize`)."""
        ctx = self.ctx
        for code, arg in seg.ops:
            if code == flowcache.APPLY:
                arg(ctx)  # type: ignore[operator]
            elif code == flowcache.CONNTRACK:
                self._conntrack_in()
            elif code == flowcache.SNAT:
                self._apply_snat(*arg)  # type: ignore[misc]
            else:
                ctx.iif = arg  # type: ignore[assignment]

    def run(self) -> tuple[Outcome, Ctx, Callable[[], None] | None]:
        ctx, node = self.ctx, self.ns.node
        if self.packet.in_interface is None:
            return self._local_out()
        if (
            ctx.iif != "lo"
            and not node.route_localnet
            and (_loopback(ctx.version, ctx.src) or _loopback(ctx.version, ctx.dst))
        ):
            return self._done("DROP", "none", None, "martian: 127.0.0.0/8 off lo without route_localnet")
        v = self._hook("PREROUTING", ("raw",))
        if v != "ACCEPT":
            return self._done(v, "none", None, "raw PREROUTING")
        self._conntrack_in()
        v = self._hook("PREROUTING", _PRE)
        if v != "ACCEPT":
            return self._done(v, "none", None, "PREROUTING")
        route = node.route(ctx.version, ctx.dst)
        if ctx.iif != "lo" and not node.route_localnet and _loopback(ctx.version, ctx.dst):
            return self._done("DROP", "none", None, "martian destination 127.0.0.0/8 after DNAT")
        if ctx.version == 4 and ctx.iif != "lo" and _martian_source4(ctx.src, ctx.dst):
            return self._done("DROP", "none", None, "martian source (multicast, broadcast or 0.0.0.0/8)")
        if route.kind in ("local", "broadcast", "multicast"):
            return self._input()
        if route.kind != "unicast":
            return self._done("DROP", "none", None, f"route: {route.kind}")
        if not node.ip_forward:
            return self._done("DROP", "none", None, "ip_forward is off")
        ctx.oif = route.device
        v = self._hook("FORWARD", _FWD)
        if v != "ACCEPT":
            return self._done(v, "none", None, "FORWARD")
        return self._postrouting(route.device, route.nexthop)

    def _local_out(self) -> tuple[Outcome, Ctx, Callable[[], None] | None]:
        ctx, node = self.ctx, self.ns.node
        route = node.route(ctx.version, ctx.dst)
        if route.kind not in ("local", "unicast", "broadcast", "multicast"):
            return self._done("DROP", "none", None, f"route: {route.kind}")
        ctx.oif = route.device
        v = self._hook("OUTPUT", ("raw",))
        if v != "ACCEPT":
            return self._done(v, "none", None, "raw OUTPUT")
        self._conntrack_in()
        before = (ctx.dst, ctx.mark)
        v = self._hook("OUTPUT", _OUT)
        if v != "ACCEPT":
            return self._done(v, "none", None, "OUTPUT")
        if (ctx.dst, ctx.mark) != before:
            route = node.route(ctx.version, ctx.dst)
            if route.kind not in ("local", "unicast", "broadcast", "multicast"):
                return self._done("DROP", "none", None, f"re-route: {route.kind}")
            ctx.oif = route.device
        if route.kind != "local" and not node.route_localnet and _loopback(ctx.version, ctx.src):
            return self._done(
                "DROP", "none", None, "martian: 127.0.0.0/8 source leaving lo without route_localnet"
            )
        if route.kind != "local":
            return self._postrouting(route.device, route.nexthop)
        v = self._hook("POSTROUTING", _POST)
        if v != "ACCEPT":
            return self._done(v, "none", None, "POSTROUTING")
        dropped = self._apply_snat("lo", None)
        if dropped is not None:
            return self._done("DROP", "none", None, dropped)
        self.confirmed = True  # confirmed at POSTROUTING, before the loop back (see _done)
        ctx.iif, ctx.oif = "lo", None
        if ctx.rec is not None:
            ctx.rec.op(flowcache.IIF, "lo")
        for hook, tables in (("PREROUTING", ("raw", "mangle")), ("INPUT", ("mangle", "filter", "security"))):
            v = self._hook(hook, tables)
            if v != "ACCEPT":
                return self._done(v, "none", None, hook)
        return self._done("ACCEPT", "local", None, "delivered locally")

    def _input(self) -> tuple[Outcome, Ctx, Callable[[], None] | None]:
        v = self._hook("INPUT", _IN)
        if v != "ACCEPT":
            return self._done(v, "none", None, "INPUT")
        dropped = self._apply_snat(None, None)
        if dropped is not None:
            return self._done("DROP", "none", None, dropped)
        return self._done("ACCEPT", "local", None, "delivered locally")

    def _postrouting(
        self, device: str | None, nexthop: str | None
    ) -> tuple[Outcome, Ctx, Callable[[], None] | None]:
        v = self._hook("POSTROUTING", _POST)
        if v != "ACCEPT":
            return self._done(v, "none", None, "POSTROUTING")
        dropped = self._apply_snat(device, nexthop)
        if dropped is not None:
            return self._done("DROP", "none", None, dropped)
        return self._done("ACCEPT", "forward", device, f"sent out {device}")

    # --- hooks, conntrack, NAT --------------------------------------------------------------------

    def _hook(self, hook: str, tables: tuple[str, ...]) -> str:
        ctx = self.ctx
        ctx.hook = hook
        rs_tables = self.rs.tables
        for tname in tables:
            if tname == "nat" and not self.new_flow:
                self._apply_existing(hook)
                continue
            table = rs_tables.get(tname)
            if table is None:
                continue
            chain = table.chains.get(hook)
            if chain is None:
                continue
            before = (ctx.dst, ctx.dport)
            v = run_chain(ctx, table, chain)
            if tname == "nat" and self.orig is not None and (ctx.dst, ctx.dport) != before:
                ctx.ct_dnat = True
                if ctx.ct_reply is not None:
                    ctx.ct_reply = (ctx.dst, ctx.dport, ctx.ct_reply[2], ctx.ct_reply[3])
            if v != "ACCEPT":
                return v
        return "ACCEPT"

    def _apply_existing(self, hook: str) -> None:
        ctx = self.ctx
        if hook in ("PREROUTING", "OUTPUT") and self.pending_dst is not None:
            ctx.dst, ctx.dport = self.pending_dst
            self.pending_dst = None

    def _conntrack_in(self) -> None:
        ctx = self.ctx
        if ctx.rec is not None:
            ctx.rec.op(flowcache.CONNTRACK, None)
        if ctx.notrack:
            ctx.ctstate = "UNTRACKED"
            return
        key: FlowKey = (ctx.version, ctx.src, ctx.sport, ctx.dst, ctx.dport, ctx.proto)
        found = None if self.known_new else self.ns.conntrack.lookup(key)
        if found is None:
            if ctx.proto == "tcp" and not ctx.syn and not self.ns.node.tcp_loose:
                ctx.ctstate = "INVALID"
                return
            self.new_flow = True
            self.orig = key
            ctx.ctstate = "NEW"
            ctx.ct_orig = (ctx.src, ctx.sport, ctx.dst, ctx.dport)
            # The reply tuple exists from here on (init_conntrack: the inverse of the
            # original); NAT rewrites it when it decides (nf_conntrack_alter_reply).
            ctx.ct_reply = (ctx.dst, ctx.dport, ctx.src, ctx.sport)
            return
        entry, is_reply = found
        self.entry = entry
        ctx.ctmark = entry.mark
        ctx.ct_dnat, ctx.ct_snat = entry.dnat, entry.snat
        o, r = entry.original, entry.reply
        ctx.ct_orig = (o[1], o[2], o[3], o[4])
        ctx.ct_reply = (r[1], r[2], r[3], r[4])
        ctx.ct_dir_reply = is_reply
        if is_reply:
            ctx.ctstate = "ESTABLISHED"
            self.pending_dst = (o[1], o[2])
            self.pending_src = (o[3], o[4])
        else:
            ctx.ctstate = "ESTABLISHED" if entry.seen_reply else "NEW"
            self.pending_dst = (r[1], r[2])
            self.pending_src = (r[3], r[4])

    def _apply_snat(self, device: str | None, nexthop: str | None, chosen: int | None = None) -> str | None:
        """Give a new flow its source mapping (``nf_nat_setup_info`` for the source, at
        POSTROUTING or INPUT): the one SNAT or MASQUERADE asked for, or a null binding to its
        own source, with the port :func:`~emulation.netfilter.nat.choose_source_port` picks.
        MASQUERADE takes ``device``'s address (or ``chosen``, when the flow cache knows it).

        Returns ``None``, or why the packet is dropped: MASQUERADE found no address, or no
        port left the flow a free reply tuple (the kernel's confirmation then fails).
        """
        ctx = self.ctx
        if not self.new_flow:
            if self.pending_src is not None:
                ctx.src, ctx.sport = self.pending_src
            return None
        asked = ctx.snat
        if asked is None:  # a null binding: the flow's own source
            addr, low, high, rand_all = ctx.src, None, None, False
        else:
            addr, low, high, rand_all = asked
            if addr == -1:  # MASQUERADE: the out interface's address
                if chosen is None:
                    text = self.ns.node.source_address(device or "lo", ctx.version, nexthop, ctx.dst)
                    if text is None:
                        return f"MASQUERADE: no address on {device or 'the way in'}"
                    chosen = parse_address(text)[1]
                addr = chosen
        if ctx.rec is not None:
            ctx.rec.op(flowcache.SNAT, (device, nexthop, chosen))
        if self.summarizing:  # the port is chosen per packet when the path is replayed
            self.source_range = (None if asked is None else addr, low, high, rand_all)
            ctx.src = addr
            return None
        mapping = (addr, low, high, rand_all)
        port, free = self.ns.source_port(
            ctx.version, ctx.proto, ctx.src, ctx.sport, ctx.dst, ctx.dport, mapping, ctx.rand
        )
        if not free and ctx.rec is not None:
            ctx.rec.abandon()  # this packet's drop is not its path's: other packets may find a port
        if (addr, port) != (ctx.src, ctx.sport):
            ctx.ct_snat = True
            if ctx.ct_reply is not None:
                ctx.ct_reply = (ctx.ct_reply[0], ctx.ct_reply[1], addr, port)
        ctx.src, ctx.sport = addr, port
        return None if free else _TUPLE_TAKEN

    def _done(
        self,
        verdict: str,
        delivery: str,
        device: str | None,
        reason: str,
    ) -> tuple[Outcome, Ctx, Callable[[], None] | None]:
        ctx, p = self.ctx, self.packet
        if ctx.rec is not None:
            ctx.rec.end(verdict, delivery, device, reason)
        orig_src, orig_dst = self.orig_src, self.orig_dst
        final = _delivered(
            p, ctx.version, orig_src, orig_dst, ctx.src, ctx.dst, ctx.sport, ctx.dport, ctx.mark, device
        )
        outcome = Outcome(
            verdict=verdict,
            delivery=delivery,
            out_interface=device,
            packet=final,
            ctstate=ctx.ctstate,
            dnat=(ctx.dst, ctx.dport) != (orig_dst, p.dport) and not ctx.ct_dir_reply,
            snat=(ctx.src, ctx.sport) != (orig_src, p.sport) and not ctx.ct_dir_reply,
            masquerade=ctx.masquerade,
            reason=reason,
            uncertain=ctx.uncertain,
            trace=tuple(ctx.trace),
        )
        commit = None
        # A new flow's entry is confirmed when its packet leaves the last hook (ipv4_confirm),
        # so only an accepted packet makes one, or a packet of the node to itself that
        # POSTROUTING let through (confirmed before it loops back over lo, so a DROP or REJECT
        # in INPUT leaves it). An existing entry is updated when conntrack sees the packet, at
        # PREROUTING or OUTPUT (nf_conntrack_in: IPS_SEEN_REPLY, nf_ct_refresh_acct; a CONNMARK
        # writes ct->mark at once), whatever later rules decide.
        if verdict == "ACCEPT" or self.confirmed or (self.entry is not None and not self.new_flow):
            commit = self._commit_fn()
        return outcome, ctx, commit

    def _commit_fn(self) -> Callable[[], None] | None:
        ctx, table = self.ctx, self.ns.conntrack
        if self.new_flow and self.orig is not None:
            now = ctx.now
            orig = self.orig
            reply: FlowKey = (ctx.version, ctx.dst, ctx.dport, ctx.src, ctx.sport, ctx.proto)
            entry = ConntrackEntry(
                original=orig,
                reply=reply,
                created_s=now,
                expires_s=now + timeout_s(ctx.proto, False, 0.0),
                mark=ctx.ctmark,
            )
            return lambda: table.confirm(entry)
        if self.entry is not None:
            existing, is_reply, mark = self.entry, ctx.ct_dir_reply, ctx.ctmark
            return lambda: _refresh(table, existing, is_reply, mark)
        return None


def _refresh(table: ConntrackTable, entry: ConntrackEntry, reply: bool, mark: int) -> None:
    table.refresh(entry, reply=reply, mark=mark)
