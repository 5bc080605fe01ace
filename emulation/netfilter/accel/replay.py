"""New flows through the flow cache: a recorded path replayed, or the slow path walked and recorded.

:meth:`FlowFront.evaluate` looks the first packet of a flow up in the
:class:`~emulation.netfilter.accel.flowcache.FlowCache` by the fields its path reads, and
follows the tree through the path's random draws (drawn from the same oracle, at the same
points, as the walk draws them). A path found whole gives the packet's outcome from its
:class:`~emulation.netfilter.accel.flowcache.Summary`, made once by redoing the path's
effects on a probe (:func:`summarize`). Otherwise the packet is walked (the draws already made
replayed first) and, from a destination's second packet on, recorded and grafted into the
tree. Replayed packets are counted per segment (:meth:`FlowFront.count`) and folded into the
rule counters on every read.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

from emulation.addr import format_address
from emulation.clock import Clock
from emulation.conntrack import timeout_s
from emulation.netfilter.accel.flowcache import (
    APPLY,
    CONNTRACK,
    SNAT,
    BaseKey,
    FlowCache,
    FlowSet,
    Segment,
    Summary,
)
from emulation.netfilter.accel.walk import Accelerator
from emulation.netfilter.context import Ctx, Dynamic
from emulation.netfilter.counters import Counters
from emulation.netfilter.nat import SourceRange, source_port
from emulation.netfilter.outcome import Outcome, delivered, make_outcome
from emulation.netfilter.path import TUPLE_TAKEN, NodeState, Path, Walked
from emulation.netfilter.verdicts import Delivery, Verdict
from emulation.packet import Packet

__all__ = ["FlowFront", "FlowState", "MakeCtx", "Replayed", "last_hit", "path_ctmark", "summarize"]

#: A replayed packet's outcome, the segments it went through that count, and its conntrack commit.
Replayed = tuple[Outcome, list[Segment], "Callable[[], None] | None"]
#: ``make_ctx(packet, version, src, dst, oracle, rand)``: a new flow's untraced context.
MakeCtx = Callable[
    [Packet, int, int, int, "Callable[[float], bool] | None", "Callable[[], float] | None"], Ctx
]

#: Values no packet has, given to the probe that summarizes a recorded path.
_MARK_SRC, _MARK_DST, _MARK_SPORT, _MARK_DPORT = -11, -13, -12, -14


class FlowState(NodeState, Protocol):
    """What the flow cache reads of its node besides a path's needs: the clock."""

    @property
    def clock(self) -> Clock: ...


def _sampler(rand: Callable[[], float] | None) -> Callable[[float], bool]:
    """Sample mode's oracle: a draw of probability ``p`` holds when ``rand() < p``."""
    assert rand is not None, "an oracle or a generator is needed"
    return lambda p: rand() < p


def _no_draw(p: float) -> bool:
    raise AssertionError("a recorded path's effects draw no random numbers")


class _Probe(Path):
    """A path redone on a probe to summarize it: the source mapping is noted, not bound."""

    source_range: SourceRange | None = None

    def bind_source(self, mapping: SourceRange) -> str | None:
        self.source_range = mapping
        if mapping[0] is not None:
            self.ctx.src = mapping[0]
        return None  # the port is chosen per packet when the path is replayed

    def replay(self, seg: Segment) -> None:
        """Redo the effects of a recorded segment in order."""
        ctx = self.ctx
        for code, arg in seg.ops:
            if code == APPLY:
                arg(ctx)  # type: ignore[operator]
            elif code == CONNTRACK:
                self.conntrack_in()
            elif code == SNAT:
                self.apply_snat(*arg)  # type: ignore[misc]
            else:
                ctx.iif = arg  # type: ignore[assignment]


def summarize(state: NodeState, packet: Packet, version: int, segments: list[Segment]) -> Summary:
    """What a recorded path does to any packet that takes it (see :class:`Summary`).

    The path's effects are redone on a probe whose source, destination and ports are markers
    no real packet has: a field still holding its marker at the end was left as the packet had
    it; any other value was written by the path, and is the same for every packet taking it
    (the path is decided by fields that are keyed, the mark among them).
    """
    probe = Ctx(node=state.node, version=version, src=_MARK_SRC, dst=_MARK_DST, sport=_MARK_SPORT,
                dport=_MARK_DPORT, proto=packet.protocol, iif=packet.in_interface, mark=packet.mark,
                length=packet.length, syn=packet.syn, now=0.0, dyn=Dynamic(), oracle=_no_draw,
                set_lookup=None, tracing=False)  # fmt: skip
    path = _Probe(state, probe, packet, _MARK_SRC, _MARK_DST, known_new=True)
    for seg in segments:
        path.replay(seg)  # the draws between them only chose the path
    end = segments[-1].end
    assert end is not None

    def written(value: int, marker: int) -> int | None:
        return None if value == marker else value

    src, dst = written(probe.src, _MARK_SRC), written(probe.dst, _MARK_DST)
    return Summary(
        verdict=end.verdict,
        delivery=end.delivery,
        device=end.device,
        reason=end.reason,
        ctstate=probe.ctstate,
        masquerade=probe.masquerade,
        track=path.new_flow and end.verdict == Verdict.ACCEPT,
        mark=probe.mark,
        ctmark=probe.ctmark,
        src=src,
        sport=written(probe.sport, _MARK_SPORT),
        dst=dst,
        dport=written(probe.dport, _MARK_DPORT),
        src_text=None if src is None else format_address(version, src),
        dst_text=None if dst is None else format_address(version, dst),
        source=path.source_range,
    )


def last_hit(segments: list[Segment]) -> int | None:
    """The uid of the last rule replayed ``segments`` matched (``None`` when none did)."""
    return next((seg.hits[-1] for seg in reversed(segments) if seg.hits), None)


def path_ctmark(segments: list[Segment]) -> int:
    """The ctmark the replayed path of ``segments`` left (0 when its end is not among them)."""
    summary = next((seg.summary for seg in reversed(segments) if seg.end is not None), None)
    return 0 if summary is None else summary.ctmark


class FlowFront:
    """The flow cache in front of the walk, for new flows evaluated untraced; see the module docstring.

    Args:
        state: the node, its rules, conntrack and clock (a :class:`~emulation.netfilter.Netns`).
        accel: the side tables and the indexed walk the slow path uses.

    Attributes:
        flows: the flow cache of the current rules (``None`` before the first cached packet).
    """

    __slots__ = ("accel", "flows", "state")

    def __init__(self, state: FlowState, accel: Accelerator) -> None:
        self.state = state
        self.accel = accel
        self.flows: FlowCache | None = None

    def count(self, segments: list[Segment], nbytes: int) -> None:
        """Count a replayed packet of ``nbytes`` in each segment it went through."""
        assert self.flows is not None
        dirty = self.flows.dirty
        for seg in segments:
            if not seg.packets:
                dirty.append(seg)
            seg.packets += 1
            seg.bytes += nbytes

    def fold(self, counters: Counters) -> None:
        """Add the packets replayed so far to ``counters``."""
        if self.flows is not None:
            self.flows.fold(counters)

    def evaluate(
        self,
        packet: Packet,
        version: int,
        src: int,
        dst: int,
        oracle: Callable[[float], bool] | None,
        rand: Callable[[], float] | None,
        counters: Counters,
        make_ctx: MakeCtx,
    ) -> Walked | Replayed:
        """A new flow's first packet: replayed when its whole path is cached, else walked.

        In sample mode ``oracle`` may be ``None``: a replay draws ``rand() < p`` itself.
        ``counters`` receive what the cache counted when it is replaced or emptied.
        """
        flows = self.flows
        state = self.state
        if flows is None or flows.ruleset is not state.ruleset or flows.node is not state.node:
            if flows is not None:
                flows.fold(counters)
            flows = self.flows = FlowCache(state.ruleset, state.node)
        sport, dport = packet.sport, packet.dport
        base = (packet.in_interface, version, packet.protocol, packet.syn, packet.mark, dst)
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
                    summary = seg.summary = summarize(state, packet, version, seg.recorded)
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
        ctx = make_ctx(packet, version, src, dst, _resumed(exits, oracle, rand) if exits else oracle, rand)
        if seg is not None or (root is None and flows.first_sight(base)):
            # An uncacheable marker: nothing to record. Or the first packet to a destination:
            # walked only (most of a cold start's would never be replayed, and recording costs
            # about as much as the walk).
            walk = self.accel.new_flow_walk
            return Path(state, ctx, packet, src, dst, walk=walk, known_new=True).run()
        return self._record(flows, base, ctx, packet, src, dst, counters)

    def _record(self, flows: FlowCache, base: BaseKey, ctx: Ctx, packet: Packet, src: int, dst: int,
                counters: Counters) -> Walked:  # fmt: skip
        """Walk a new flow's packet, recording its path, and graft the path into ``flows``."""
        rec = self.accel.recorder(ctx)
        walk_oracle = ctx.oracle

        def recording(p: float) -> bool:
            c = walk_oracle(p)
            rec.draw(p, c)
            return c

        ctx.oracle = recording
        walk = self.accel.walker(rec, compile_short=False)
        result = Path(self.state, ctx, packet, src, dst, walk=walk, observer=rec, known_new=True).run()
        if rec.done:  # an unknown match or target stopped the recording before it was met
            if flows.full(len(rec.segments)):
                flows.fold(counters)
                flows.clear()
            flows.graft(base, src, packet.sport, packet.dport, rec.segments)
        return result

    def _replayed(
        self,
        packet: Packet,
        version: int,
        src: int,
        dst: int,
        summary: Summary,
        replayed: list[Segment],
        rand: Callable[[], float] | None,
    ) -> Replayed:
        """The outcome of a packet whose whole path was found in the flow cache."""
        sport, dport = packet.sport, packet.dport
        verdict, delivery, device, reason, ctstate, masquerade, track, mark, ctmark, w_src, w_sport, w_dst, \
            w_dport, src_text, dst_text, source = summary  # fmt: skip
        new_src = src if w_src is None else w_src
        new_dst = dst if w_dst is None else w_dst
        new_sport = sport if w_sport is None else w_sport
        new_dport = dport if w_dport is None else w_dport
        state = self.state
        if source is not None:  # the flow's source mapping, chosen for this packet
            new_sport, free = source_port(
                state.conntrack, version, packet.protocol, src, sport, new_dst, new_dport, source, rand
            )
            if not free:
                verdict, delivery, device, reason, track = (
                    Verdict.DROP,
                    Delivery.NONE,
                    None,
                    TUPLE_TAKEN,
                    False,
                )
        final = delivered(
            packet,
            version,
            src,
            dst,
            new_src,
            new_dst,
            new_sport,
            new_dport,
            mark,
            device,
            src_text,
            dst_text,
        )
        outcome = make_outcome(
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
            now = state.clock.now()
            commit = partial(
                state.conntrack.insert,
                (version, src, sport, dst, dport, proto),
                (version, new_dst, new_dport, new_src, new_sport, proto),
                now,
                now + timeout_s(proto, False, 0.0),
                False,
                ctmark,
            )
        return outcome, replayed, commit


def _resumed(
    exits: list[int], oracle: Callable[[float], bool] | None, rand: Callable[[], float] | None
) -> Callable[[float], bool]:
    """An oracle that first gives the draws ``exits`` says were made, then draws afresh."""
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

    return resumed
