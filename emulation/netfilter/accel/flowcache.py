"""A megaflow cache of whole packet paths, so that new flows skip the hook walk.

Theory of operation. Open vSwitch's megaflow cache (Pfaff et al., "The Design and
Implementation of Open vSwitch", NSDI 2015) remembers, for a packet the slow path handled, the
*fields the classifier examined*, and reuses the result for every later packet that agrees on
those fields only. The same holds for a netfilter walk: which rules a packet matches, and so
which targets run, is decided by the tests it meets, and each test reads a few header fields.
A path recorded for one packet is therefore the path of every packet equal to it in those
fields. Here the cache applies to the first packet of a flow (a conntrack miss) evaluated
untraced; established flows, traced packets and enumerate's trace go the slow way.

*What a path depends on.* Always: the input interface, IP version, protocol, the TCP SYN flag,
the input mark and the destination address (the chain indexes and the routing decision read
it). Besides those, each rule tested on the path adds what its matches read
(:func:`~emulation.netfilter.accel.deps.rule_deps`): the source address up to the bits that
decide each prefix test (all of a prefix the source is inside; up to the first differing bit
of one it is not, as OVS's prefix tracking; all bits for ``-m addrtype --src-type``), the
source port, the destination port.
A value a target changed on the way (DNAT's address, MARK's mark) is a function of the fields
already keyed and of the path, so a later test of it adds nothing new. A rule whose result can
depend on anything else (``recent`` lists and ``nth`` counters, ipsets, an unknown match or
target) makes the path *uncacheable* from that rule on: packets that reach it always take the
slow path.

*Random draws.* A ``statistic --mode random`` match asks the oracle; the path branches there.
The cache is a tree: a :class:`Segment` holds what happens before its first draw (matched rule
uids, chain policies met, and the ordered effects to redo: target ``apply`` calls, the conntrack
decision, source NAT), then either the path's end or a ladder of draws (kube-proxy's endpoint
choice: ``1/n``, then ``1/(n-1)`` ... while they come out False), each draw leading, when True,
to the next segment or to a :class:`FlowSet` keyed again (a branch may test more fields).
Replaying a packet draws from the same oracle at the same points, so the random stream,
counters (each matched rule counted once per packet, as in the walk), conntrack entries and
outcome are exactly those of the walk (an equivalence property in ``tests/emulation`` checks
this on random rulesets). The outcome of a replayed path comes from its :class:`Summary`,
made once by redoing the path's effects on a probe. A branch not yet explored is recorded by
running the slow path with the draws already made replayed first, and grafted into the tree;
paths are recorded from a destination's second packet on (most first packets of a cold start
are never followed by another like them).

Paths are recorded by :class:`~emulation.netfilter.accel.recorder.Recorder` and replayed by
:mod:`emulation.netfilter.accel.replay`. The cache belongs to one ruleset and one node (a new
one is started when either is replaced) and holds at most ``limit`` segments; when full it is
emptied (as a flow table is flushed), which costs only speed.
"""

from __future__ import annotations

from typing import NamedTuple

from emulation.netfilter.accel.deps import DPORT, SPORT
from emulation.netfilter.counters import Counters
from emulation.netfilter.nat import SourceRange
from emulation.netfilter.verdicts import CtState, Delivery, Verdict

__all__ = [
    "APPLY",
    "CONNTRACK",
    "IIF",
    "SNAT",
    "TAIL",
    "BaseKey",
    "Cut",
    "End",
    "FlowCache",
    "FlowSet",
    "Op",
    "Segment",
    "Summary",
]

#: Effects redone in order on replay: a target's apply, the conntrack decision, source NAT,
#: the input interface of a locally delivered packet.
APPLY, CONNTRACK, SNAT, IIF = range(4)
#: A segment's exit when every draw of its ladder came out False.
TAIL = -1
Op = tuple[int, object]


class End(NamedTuple):
    """How a recorded path ends: its verdict, where the packet went, and why."""

    verdict: Verdict
    delivery: Delivery
    device: str | None
    reason: str


class Cut(NamedTuple):
    """A closed segment of a recording: the source bits and port flags read before it, and
    its exit: the index of the draw that came out True, :data:`TAIL` when all came out False,
    ``None`` at the path's end."""

    bits: int
    flags: int
    segment: Segment
    exit: int | None


class Summary(NamedTuple):
    """What one recorded path does to every packet that takes it.

    ``src``, ``sport``, ``dst``, ``dport``: the value the path wrote, or ``None`` when the
    packet keeps its own; ``src_text``, ``dst_text``: the written addresses' texts (made once,
    not per packet). ``mark`` and ``ctmark`` are final values (the input mark is keyed).
    ``track``: the flow is confirmed in conntrack. ``source``: the source mapping the path
    asked for (:data:`~emulation.netfilter.nat.SourceRange`), whose port is chosen anew for
    each packet (it depends on the conntrack table), or ``None``. The rest is the
    :class:`~emulation.netfilter.Outcome`'s.
    """

    verdict: Verdict
    delivery: Delivery
    device: str | None
    reason: str
    ctstate: CtState
    masquerade: bool
    track: bool
    mark: int
    ctmark: int
    src: int | None
    sport: int | None
    dst: int | None
    dport: int | None
    src_text: str | None
    dst_text: str | None
    source: SourceRange | None


class Segment:
    """What a path does from one point to the next random draw that came out True (or its end).

    A segment has a body (what happens before its first draw) and then a *ladder* of draws:
    ``ps[0]``, and when that came out False and nothing else happened, ``ps[1]``, and so on,
    as kube-proxy's endpoint chains draw ``1/n``, ``1/(n-1)`` ... until one holds. See the
    module docstring.

    Attributes:
        hits: uids of the rules the body matched (each counts the packet once).
        policies: ``(table, chain)`` of the built-in chain policies the body applied.
        ops: the body's effects to redo, in order: ``(APPLY, target.apply)``,
            ``(CONNTRACK, None)``, ``(SNAT, (device, nexthop, address MASQUERADE chose))``,
            ``(IIF, name)``.
        end: how the path ends, when it ends after the body.
        ps: the probabilities of the ladder's draws known so far.
        kids: for each draw, what follows when it came out True: the next segment itself when
            that reads nothing the path had not already read (every packet that got there goes
            on the same way), else a :class:`FlowSet` of them; ``None`` until recorded.
        tail: what follows when every draw came out False (``None`` until recorded).
        cacheable: ``False`` for a marker: packets reaching it take the slow path.
        counts: it has rules or policies to count.
        packets, bytes: replayed packets not yet folded into the rule counters.
        summary: on the segment that ends a path, the outcome of the whole path (``recorded``
            until it is first needed).
    """

    __slots__ = (
        "bytes",
        "cacheable",
        "counts",
        "end",
        "hits",
        "kids",
        "ops",
        "packets",
        "policies",
        "ps",
        "recorded",
        "summary",
        "tail",
    )

    def __init__(
        self,
        hits: tuple[int, ...],
        policies: tuple[tuple[str, str], ...],
        ops: tuple[Op, ...],
        *,
        end: End | None = None,
        ps: tuple[float, ...] = (),
        cacheable: bool = True,
    ) -> None:
        self.hits = hits
        self.policies = policies
        self.ops = ops
        self.end = end
        # A tuple, and no list of kids on a segment without draws (most are path ends): fewer
        # objects for the garbage collector to walk.
        self.ps = ps
        self.kids: list[FlowSet | Segment | None] | tuple[()] = [None] * len(ps) if ps else ()
        self.tail: FlowSet | Segment | None = None
        self.cacheable = cacheable
        self.counts = bool(hits or policies)
        self.packets = self.bytes = 0
        self.summary: Summary | None = None
        self.recorded: list[Segment] | None = None


class FlowSet:
    """Segments keyed by the source prefix and ports their paths read (one table per mask).

    ``find(src, sport, dport)`` tries each mask in the order first seen, as OVS's subtables:
    a packet's key under a mask is ``(src >> shift, sport or 0, dport or 0)``, or ``src >> shift``
    alone for a mask that reads no port.
    """

    __slots__ = ("flags", "more", "shift", "table")

    def __init__(self) -> None:
        # The first mask's table inline (the common case has only one: fewer objects to
        # reach per packet), then the others as ``(shift, flags, table)``.
        self.shift = self.flags = 0
        self.table: dict[object, Segment] | None = None
        self.more: list[tuple[int, int, dict[object, Segment]]] = []

    def find(self, src: int, sport: int, dport: int) -> Segment | None:
        """The segment for a packet with these input fields, or ``None``."""
        table = self.table
        if table is None:
            return None
        flags = self.flags
        seg = table.get(
            (src >> self.shift, sport if flags & SPORT else 0, dport if flags & DPORT else 0)
            if flags
            else src >> self.shift
        )
        if seg is not None or not self.more:
            return seg
        for shift, flags, table in self.more:
            seg = table.get(
                (src >> shift, sport if flags & SPORT else 0, dport if flags & DPORT else 0)
                if flags
                else src >> shift
            )
            if seg is not None:
                return seg
        return None

    def insert(self, shift: int, flags: int, src: int, sport: int, dport: int, seg: Segment) -> Segment:
        """The segment under ``(shift, flags)`` for these input fields; ``seg`` is stored there
        when none is. A table keyed on the source alone takes ``src >> shift`` as its key (no
        tuple to build and hash per packet); one that reads ports, the tuple."""
        if self.table is not None and self.shift == shift and self.flags == flags:
            table: dict[object, Segment] | None = self.table
        else:
            table = next((t for s, f, t in self.more if s == shift and f == flags), None)
        if table is None:
            table = {}
            if self.table is None:
                self.shift, self.flags, self.table = shift, flags, table
            else:
                self.more.append((shift, flags, table))
        key: object = src >> shift
        if flags:
            key = (src >> shift, sport if flags & SPORT else 0, dport if flags & DPORT else 0)
        return table.setdefault(key, seg)


#: Base key of a path's root: (input interface, version, protocol, syn, input mark, destination).
BaseKey = tuple[str | None, int, str, bool, int, int]


class FlowCache:
    """The tree of recorded paths of one ruleset on one node; see the module docstring.

    Args:
        ruleset, node: what the paths were recorded against (identity is compared).
        limit: segments kept before the cache is emptied (default 262,144).

    Attributes:
        segments: segments held now; recorded: paths recorded since it was made.
    """

    __slots__ = (
        "_floats",
        "dirty",
        "interfaces",
        "limit",
        "node",
        "recorded",
        "roots",
        "ruleset",
        "seen",
        "segments",
    )

    def __init__(self, ruleset: object, node: object, *, limit: int = 1 << 18) -> None:
        self.ruleset = ruleset
        self.node = node
        self.limit = limit
        self.roots: dict[BaseKey, FlowSet] = {}
        self.segments = 0
        #: Base keys whose first packet was walked without recording (see :meth:`first_sight`).
        self.seen: set[BaseKey] = set()
        #: Input interfaces already found on ``node`` (so a packet's need not be looked up).
        self.interfaces: set[str | None] = {None}
        #: Paths recorded (walked and grafted) so far, for statistics.
        self.recorded = 0
        #: Segments with packets not yet folded into the counters.
        self.dirty: list[Segment] = []
        self._floats: dict[float, float] = {}

    def fold(self, counters: Counters) -> None:
        """Add the packets replayed since the last fold to ``counters`` (rules and policies).

        Replaying counts a packet once per segment rather than once per rule; the rule
        counters are exact again after this, which every read of them does first.
        """
        rules, policies = counters.rules, counters.policies
        for seg in self.dirty:
            n, b = seg.packets, seg.bytes
            for uid in seg.hits:
                c = rules.get(uid)
                rules[uid] = (n, b) if c is None else (c[0] + n, c[1] + b)
            for key in seg.policies:
                c = policies.get(key)
                policies[key] = (n, b) if c is None else (c[0] + n, c[1] + b)
            seg.packets = seg.bytes = 0
        self.dirty.clear()

    def full(self, more: int) -> bool:
        """Whether ``more`` segments would go over the limit."""
        return self.segments + more > self.limit

    def clear(self) -> None:
        """Forget every recorded path (fold the counters first)."""
        self.roots.clear()
        self.seen.clear()
        self.segments = 0

    def first_sight(self, base: BaseKey) -> bool:
        """Whether no packet with this base key was seen before (and remember this one).

        Paths are recorded from the second packet to a destination on: a cold start sends
        most of its first packets to destinations met once, whose recording would be waste.
        """
        if base in self.seen:
            return False
        self.seen.add(base)
        return True

    def _canonical(self, p: float) -> float:
        """One float object per probability value: kube-proxy's ladders repeat the same few
        (1/n ... 1/2) in every Service, and shared objects stay in the CPU cache."""
        return self._floats.setdefault(p, p)

    def graft(self, base: BaseKey, src: int, sport: int, dport: int, recorded: list[Cut]) -> Segment | None:
        """Add the ``recorded`` path (a finished recorder's segments) of a packet with these input
        fields to the tree.

        Returns the tree's segment for the path's last recorded segment (``None`` when the
        recording did not finish).
        """
        self.recorded += 1
        width = 32 if base[1] == 4 else 128
        flows = self.roots.get(base)
        if flows is None:
            flows = self.roots[base] = FlowSet()
        at: FlowSet | Segment = flows
        for i, (bits, flags, seg, exit_) in enumerate(recorded):
            if isinstance(at, FlowSet):
                shift = width - min(bits, width)
                made = at.insert(shift, flags, src, sport, dport, seg)
            else:
                made = at
            if made is seg:
                self.segments += 1
                seg.ps = tuple(self._canonical(p) for p in seg.ps)
            elif len(seg.ps) > len(made.ps):  # this path went further down the ladder
                made.kids = [*made.kids, *[None] * (len(seg.ps) - len(made.ps))]
                made.ps += tuple(self._canonical(p) for p in seg.ps[len(made.ps) :])
            if exit_ is None:
                if made.end is not None and made.summary is None and made.recorded is None:
                    made.recorded = [cut.segment for cut in recorded]
                return made
            child = made.tail if exit_ == TAIL else made.kids[exit_]
            if child is None:
                following = recorded[i + 1]
                # The same reads after the draw: the next segment is the only one possible.
                child = following.segment if (following.bits, following.flags) == (bits, flags) else FlowSet()
                if exit_ == TAIL:
                    made.tail = child
                else:
                    made.kids[exit_] = child  # type: ignore[index]
            at = child
        return None
