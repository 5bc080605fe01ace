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
(:func:`rule_deps`): the source address up to the bits that decide each prefix test (all of
a prefix the source is inside; up to the first differing bit of one it is not, as OVS's prefix
tracking; all bits for ``-m addrtype --src-type``), the source port, the destination port.
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
this on random rulesets). The outcome of a replayed path comes from its :data:`Summary`,
made once by redoing the path's effects on a probe. A branch not yet explored is recorded by
running the slow path with the draws already made replayed first, and grafted into the tree;
paths are recorded from a destination's second packet on (most first packets of a cold start
are never followed by another like them).

The cache belongs to one ruleset and one node (:class:`Netns` starts a new one when either is
replaced) and holds at most ``limit`` segments; when full it is emptied (as a flow table is
flushed), which costs only speed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from emulation.netfilter.matches import (
    AddressMatch,
    AddrType,
    Comment,
    Conntrack,
    Icmp,
    InterfaceMatch,
    Mark,
    Match,
    Multiport,
    Nfacct,
    Ports,
    ProtoMatch,
    Statistic,
)
from emulation.netfilter.targets import UnknownTarget

if TYPE_CHECKING:
    from emulation.netfilter.context import Ctx
    from emulation.netfilter.nat import SourceRange
    from emulation.netfilter.rules import Rule
    from emulation.netfilter.ruleset import Counters

__all__ = [
    "DPORT",
    "NOTHING",
    "SPORT",
    "SUMMARY_CTMARK",
    "FlowCache",
    "FlowSet",
    "Recorder",
    "Segment",
    "Summary",
    "match_deps",
    "rule_deps",
]

#: Dependency flags beside the source prefix: the path read the source / destination port.
SPORT, DPORT = 1, 2
#: ``(source bits, flags, source prefixes)`` a rule reads: the leading bits of the source it
#: needs whatever the prefixes, the port flags, and the ``-s`` prefixes it compares the
#: source with as ``(version, network, prefix length)`` (see :meth:`Recorder.rule`).
#: ``None``: its result depends on state. Only numbers inside, so the garbage collector
#: stops tracking these tuples (rules made after a load are not frozen; see Summary).
Prefix = tuple[int, int, int]
Deps = tuple[int, int, tuple[Prefix, ...]] | None
_ALL_BITS = 128  # "every bit of the source" for either family (clamped per family)

#: Effects redone in order on replay: a target's apply, the conntrack decision, source NAT,
#: the input interface of a locally delivered packet.
APPLY, CONNTRACK, SNAT, IIF = range(4)
#: A segment's exit when every draw of its ladder came out False.
TAIL = -1
Op = tuple[int, object]


#: The IPv4 prefixes the evaluator's martian checks test the source against (127.0.0.0/8;
#: multicast, limited broadcast and 0.0.0.0/8 at input routing).
_MARTIAN_SOURCES4 = ((127 << 24, 8), (0xE0000000, 4), (0xFFFFFFFF, 32), (0, 8))

#: What a rule reads when it reads no more than the always-keyed fields (one object: the
#: walks skip telling the recorder about such rules).
NOTHING: Deps = (0, 0, ())
_PORT_DEPS: tuple[Deps, ...] = ((0, 0, ()), (0, SPORT, ()), (0, DPORT, ()), (0, SPORT | DPORT, ()))
_MULTIPORT = {"sports": _PORT_DEPS[SPORT], "dports": _PORT_DEPS[DPORT], "ports": _PORT_DEPS[SPORT | DPORT]}
_WHOLE_SOURCE: Deps = (_ALL_BITS, 0, ())
_WHOLE_TUPLE: Deps = (_ALL_BITS, SPORT | DPORT, ())


def _address(m: Match) -> Deps:
    assert isinstance(m, AddressMatch)
    c = m.cidr
    return (0, 0, ((c.version, c.network, c.prefix),)) if m.side == "s" and c.prefix else NOTHING


def _ports(m: Match) -> Deps:
    assert isinstance(m, Ports)
    return _PORT_DEPS[(SPORT if m.sport is not None else 0) | (DPORT if m.dport is not None else 0)]


def _multiport(m: Match) -> Deps:
    assert isinstance(m, Multiport)
    return _MULTIPORT[m.which]


def _addrtype(m: Match) -> Deps:
    assert isinstance(m, AddrType)
    return _WHOLE_SOURCE if m.src_types else NOTHING


def _conntrack(m: Match) -> Deps:
    assert isinstance(m, Conntrack)
    return _WHOLE_TUPLE if m.tuple_checks else NOTHING  # --ctorig*/--ctrepl*: the packet's tuple


def _statistic(m: Match) -> Deps:
    assert isinstance(m, Statistic)
    return NOTHING if m.mode == "random" else None  # nth counts packets: state


def _nothing(m: Match) -> Deps:
    return NOTHING


#: By match class; a class not listed (recent, set, unknown matches) is state: not cacheable.
_BY_CLASS: dict[type, Callable[[Match], Deps]] = {
    AddressMatch: _address,
    Ports: _ports,
    Multiport: _multiport,
    AddrType: _addrtype,
    Conntrack: _conntrack,
    Statistic: _statistic,
    Comment: _nothing,
    Nfacct: _nothing,
    Mark: _nothing,
    ProtoMatch: _nothing,
    InterfaceMatch: _nothing,
    Icmp: _nothing,
}


def match_deps(m: Match) -> Deps:
    """What ``m`` reads of the packet beside the always-keyed fields; ``None`` if not a pure function.

    Matches on fields the cache always keys (destination, protocol, interfaces, mark), on
    values the path itself decides (conntrack state of a new flow, the output interface), and
    annotations read nothing extra. ``recent``, ``set``, ``statistic --mode nth`` and unknown
    matches depend on state.
    """
    f = _BY_CLASS.get(type(m))
    return None if f is None else f(m)


def rule_deps(rule: Rule) -> Deps:
    """The union of what the rule's matches read, or ``None`` when the rule is not cacheable."""
    if type(rule.target) is UnknownTarget:
        return None
    out = NOTHING
    for matches in (rule.basic, rule.matches):
        for m in matches:
            f = _BY_CLASS.get(type(m))
            if f is None:
                return None
            d = f(m)
            if d is None:
                return None
            if d is not NOTHING:
                out = d if out is NOTHING else (max(out[0], d[0]), out[1] | d[1], out[2] + d[2])  # type: ignore[index]
    return out


#: What one recorded path does to every packet that takes it: ``(verdict, delivery, device,
#: reason, ctstate, masquerade, track, mark, ctmark, src, sport, dst, dport, src_text,
#: dst_text, source)``. ``src``, ``sport``, ``dst``, ``dport``: the value the path wrote, or ``None``
#: when the packet keeps its own; ``src_text``, ``dst_text``: the written addresses' texts
#: (made once, not per packet). ``mark`` and ``ctmark`` are final values (the input mark is
#: keyed). ``track``: the flow is confirmed in conntrack. ``source``: the source mapping the
#: path asked for (:data:`~emulation.netfilter.nat.SourceRange`), whose port is chosen anew for
#: each packet (it depends on the conntrack table), or ``None``. The rest is the
#: :class:`~emulation.netfilter.Outcome`'s.
#:
#: A plain tuple rather than a frozen dataclass (or a named tuple, which CPython never
#: untracks): a tuple of numbers and text leaves the cyclic garbage collector's lists, and a
#: cache of 100,000 paths otherwise made every full collection walk 100,000 more objects.
#: Where a :data:`Summary` keeps the path's ctmark (for readers outside the evaluator).
SUMMARY_CTMARK: Final = 8
Summary = tuple[
    str, str, "str | None", str, str, bool, bool, int, int,
    "int | None", "int | None", "int | None", "int | None", "str | None", "str | None",
    "SourceRange | None",
]


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
        end: ``(verdict, delivery, device, reason)`` when the path ends after the body.
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
        end: tuple[str, str, str | None, str] | None = None,
        ps: tuple[float, ...] = (),
        cacheable: bool = True,
    ) -> None:
        self.hits = hits
        self.policies = policies
        self.ops = ops
        self.end = end
        # A tuple, and no list of kids on a segment without draws (most are path ends): fewer
        # objects for the garbage collector to walk (see Summary).
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

    @property
    def masks(self) -> list[tuple[int, int, dict[object, Segment]]]:
        """Every ``(shift, flags, table)``, in the order first seen."""
        first = [] if self.table is None else [(self.shift, self.flags, self.table)]
        return first + self.more

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


class Recorder:
    """Records the slow path of one packet as segments (see :meth:`FlowCache.graft`).

    The evaluator calls :meth:`rule` for each rule it tests, :meth:`op` for each effect to
    redo, :meth:`draw` for each random draw and :meth:`end` once; :meth:`stop` (or an
    uncacheable rule) ends the recording at that point.
    """

    __slots__ = (
        "at_draw",
        "bits",
        "body",
        "ctx",
        "done",
        "flags",
        "live",
        "ops",
        "rungs",
        "segments",
        "src",
        "start_hits",
        "start_policies",
        "width",
    )

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.src = ctx.src
        self.width = 32 if ctx.version == 4 else 128
        self.bits = 0
        self.flags = 0
        if ctx.version == 4:  # the martian checks compare the source with these prefixes
            for network, prefix in _MARTIAN_SOURCES4:
                self._compare(network, prefix)
        self.live = True
        self.done = False
        self.ops: list[Op] = []
        self.start_hits = self.start_policies = 0  # what is not in a closed part yet
        self.body: tuple[tuple[int, ...], tuple[tuple[str, str], ...], tuple[Op, ...]] | None = None
        self.rungs: list[float] = []  # the open segment's draws so far (all False)
        self.at_draw = (0, 0)  # (bits, flags) at its last draw
        #: ``(bits, flags, segment, exit)`` per closed segment: ``exit`` is the index of the
        #: draw that came out True, :data:`TAIL` when all came out False, ``None`` at the end.
        self.segments: list[tuple[int, int, Segment, int | None]] = []

    def rule(self, deps: Deps) -> None:
        """A rule is about to be tested: add what it reads (or stop at a stateful rule).

        A ``-s`` prefix of length L needs L bits of the source when the source is inside it,
        and only up to the first bit that differs when it is not (every packet agreeing on
        those bits is outside too), as OVS's prefix tracking. The input source is what is
        keyed; once the path has translated the source, the whole prefix is counted.
        """
        if deps is None:
            self.stop()
        elif self.live:
            if deps[0] > self.bits:
                self.bits = deps[0]
            self.flags |= deps[1]
            for version, network, prefix in deps[2]:
                if version == self.ctx.version:
                    self._compare(network, prefix)

    def _compare(self, network: int, prefix: int) -> None:
        need = prefix
        if self.ctx.src == self.src:
            differ = (self.src ^ network) >> (self.width - prefix)  # the prefix's bits that differ
            if differ:
                need = prefix - differ.bit_length() + 1  # up to the first of them
        if need > self.bits:
            self.bits = need

    def read(self, flags: int) -> None:
        """The walk read fields beside a rule's matches (an index keyed on the port)."""
        self.flags |= flags

    def op(self, code: int, arg: object) -> None:
        """An effect to redo on replay.

        The source mapping (``SNAT``) must end what is cached of a path: a replay chooses
        its port last, after the path's draws, and may drop the packet there. On the one
        path that goes on after it (a packet of the node to itself, back in over ``lo``), the
        rest is left to the slow path.
        """
        if self.live:
            if code == IIF and any(c == SNAT for c, _ in self.ops):
                self.stop()
                return
            self.ops.append((code, arg))

    def _take(self) -> tuple[tuple[int, ...], tuple[tuple[str, str], ...], tuple[Op, ...]]:
        """What happened since the last cut: matched rules, policies, effects."""
        ctx = self.ctx
        hits, policy_hits = ctx.hits, ctx.policy_hits
        taken = (
            tuple(hits[self.start_hits :]),
            tuple((t, c) for t, c, _ in policy_hits[self.start_policies :]),
            tuple(self.ops),
        )
        self.start_hits, self.start_policies = len(hits), len(policy_hits)
        self.ops = []
        return taken

    def _moved(self) -> bool:
        """Whether anything happened, or was read, since the open segment's last draw."""
        ctx = self.ctx
        return (
            len(ctx.hits) > self.start_hits
            or len(ctx.policy_hits) > self.start_policies
            or bool(self.ops)
            or (self.bits, self.flags) != self.at_draw
        )

    def _close(self, exit_: int) -> None:
        assert self.body is not None
        hits, policies, ops = self.body
        seg = Segment(hits, policies, ops, ps=tuple(self.rungs))
        self.segments.append((self.at_draw[0], self.at_draw[1], seg, exit_))
        self.rungs, self.body = [], None

    def draw(self, p: float, choice: bool) -> None:
        """A random draw with probability ``p`` came out ``choice``."""
        if not self.live:
            return
        if self.rungs and self._moved():
            self._close(TAIL)  # something happened after the ladder: a new segment
        if not self.rungs:
            self.body = self._take()
        self.rungs.append(p)
        self.at_draw = (self.bits, self.flags)
        if choice:
            self._close(len(self.rungs) - 1)

    def end(self, verdict: str, delivery: str, device: str | None, reason: str) -> None:
        """The path ended with this outcome."""
        if not self.live:
            return
        if self.rungs:
            self._close(TAIL)
        hits, policies, ops = self._take()
        seg = Segment(hits, policies, ops, end=(verdict, delivery, device, reason))
        self.segments.append((self.bits, self.flags, seg, None))
        self.live = False
        self.done = True

    def abandon(self) -> None:
        """Record nothing of this packet's path (its end was its own, not its path's)."""
        self.live = False
        self.done = False

    def stop(self) -> None:
        """What follows depends on state: packets reaching this point take the slow path."""
        if not self.live:
            return
        if self.rungs:
            self._close(TAIL)
        self.segments.append((self.bits, self.flags, Segment((), (), (), cacheable=False), None))
        self.live = False
        self.done = True


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

    def root(self, base: BaseKey) -> FlowSet | None:
        """The flows recorded for packets with this base key."""
        return self.roots.get(base)

    def graft(self, base: BaseKey, src: int, sport: int, dport: int, rec: Recorder) -> Segment | None:
        """Add the recorded path of a packet with these input fields to the tree.

        Returns the tree's segment for the path's last recorded segment (``None`` when the
        recording did not finish).
        """
        if not rec.done:
            return None
        self.recorded += 1
        width = 32 if base[1] == 4 else 128
        flows = self.roots.get(base)
        if flows is None:
            flows = self.roots[base] = FlowSet()
        at: FlowSet | Segment = flows
        for i, (bits, flags, seg, exit_) in enumerate(rec.segments):
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
                    made.recorded = [s for _, _, s, _ in rec.segments]
                return made
            child = made.tail if exit_ == TAIL else made.kids[exit_]
            if child is None:
                following = rec.segments[i + 1]
                # The same reads after the draw: the next segment is the only one possible.
                child = following[2] if following[:2] == (bits, flags) else FlowSet()
                if exit_ == TAIL:
                    made.tail = child
                else:
                    made.kids[exit_] = child  # type: ignore[index]
            at = child
        return None
