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
(:func:`rule_deps`): the source address up to the longest prefix tested (``-s 10.0.0.0/8``
reads 8 bits; ``-m addrtype --src-type`` all of them), the source port, the destination port.
A value a target changed on the way (DNAT's address, MARK's mark) is a function of the fields
already keyed and of the path, so a later test of it adds nothing new. A rule whose result can
depend on anything else (``recent`` lists and ``nth`` counters, ipsets, an unknown match or
target) makes the path *uncacheable* from that rule on: packets that reach it always take the
slow path.

*Random draws.* A ``statistic --mode random`` match asks the oracle; the path branches there.
The cache is a tree: a :class:`Segment` holds what happens up to the next draw (matched rule
uids, chain policies met, and the ordered effects to redo: target ``apply`` calls, the conntrack
decision, source NAT), then either ends (the verdict) or branches on the draw into two child
:class:`FlowSet` s keyed again, since a branch may test more fields. Replaying a packet draws
from the same oracle at the same points, so the random stream, counters (each matched rule
counted once per packet, as in the walk), conntrack entries and outcome are exactly those of the
walk (an equivalence property in ``tests/emulation`` checks this on random rulesets). A branch
not yet explored is recorded by running the slow path with the draws already made replayed
first, and grafted into the tree.

The cache belongs to one ruleset and one node (:class:`Netns` starts a new one when either is
replaced) and holds at most ``limit`` segments; when full it is emptied (as a flow table is
flushed), which costs only speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from emulation.addr import Cidr
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
    from emulation.netfilter.rules import Rule
    from emulation.netfilter.ruleset import Counters

__all__ = [
    "DPORT",
    "SPORT",
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
#: source with (see :meth:`Recorder.rule`). ``None``: its result depends on state.
Deps = tuple[int, int, tuple[Cidr, ...]] | None
_ALL_BITS = 128  # "every bit of the source" for either family (clamped per family)

#: Effects redone in order on replay: a target's apply, the conntrack decision, source NAT,
#: the input interface of a locally delivered packet.
APPLY, CONNTRACK, SNAT, IIF = range(4)
Op = tuple[int, object]


def match_deps(m: Match) -> Deps:
    """What ``m`` reads of the packet beside the always-keyed fields; ``None`` if not a pure function.

    Matches on fields the cache always keys (destination, protocol, interfaces, mark), on
    values the path itself decides (conntrack state of a new flow, the output interface), and
    annotations read nothing extra.
    """
    if isinstance(m, AddressMatch):
        return (0, 0, (m.cidr,)) if m.side == "s" and m.cidr.prefix else _NOTHING
    if isinstance(m, Ports):
        return 0, (SPORT if m.sport is not None else 0) | (DPORT if m.dport is not None else 0), ()
    if isinstance(m, Multiport):
        return 0, {"sports": SPORT, "dports": DPORT}.get(m.which, SPORT | DPORT), ()
    if isinstance(m, AddrType):
        return (_ALL_BITS if m.src_types else 0), 0, ()
    if isinstance(m, Conntrack):
        if m.tuple_checks:  # --ctorig*/--ctrepl*: the flow's tuple, i.e. the packet's
            return _ALL_BITS, SPORT | DPORT, ()
        return _NOTHING
    if isinstance(m, Statistic):
        return _NOTHING if m.mode == "random" else None  # nth counts packets: state
    if isinstance(m, (Comment, Nfacct, Mark, ProtoMatch, InterfaceMatch, Icmp)):
        return _NOTHING
    return None  # recent, set, unknown matches, anything not listed here


_NOTHING: Deps = (0, 0, ())


def rule_deps(rule: Rule) -> Deps:
    """The union of what the rule's matches read, or ``None`` when the rule is not cacheable."""
    bits = flags = 0
    prefixes: tuple[Cidr, ...] = ()
    for m in (*rule.basic, *rule.matches):
        d = match_deps(m)
        if d is None:
            return None
        bits, flags, prefixes = max(bits, d[0]), flags | d[1], prefixes + d[2]
    return None if isinstance(rule.target, UnknownTarget) else (bits, flags, prefixes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    """What one recorded path does to every packet that takes it.

    ``src``, ``sport``, ``dst``, ``dport``: the value the path wrote, or ``None`` when the
    packet keeps its own (``*_text``: the written address as text). ``mark`` and ``ctmark``
    are final values (the input mark is keyed). ``track``: the flow is confirmed in conntrack.
    The rest is the :class:`~emulation.netfilter.Outcome`'s.
    """

    verdict: str
    delivery: str
    device: str | None
    reason: str
    ctstate: str
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


class Segment:
    """What a path does between two random draws (or up to its end); see the module docstring.

    Attributes:
        hits: uids of the rules matched (each counts the packet once).
        policies: ``(table, chain)`` of the built-in chain policies applied.
        ops: effects to redo, in order: ``(APPLY, target.apply)``, ``(CONNTRACK, None)``,
            ``(SNAT, (device, nexthop, address MASQUERADE chose))``, ``(IIF, name)``.
        end: ``(verdict, delivery, device, reason)`` when the path ends here, else ``None``.
        p: the probability of the draw that ends the segment (when ``end`` is ``None``).
        yes, no: what follows when the draw came out True (``yes``) or False (``no``): the
            next segment itself when it reads nothing the path had not already read (every
            packet that got here goes on the same way), else a :class:`FlowSet` of them.
        cacheable: ``False`` for a marker: packets reaching it take the slow path.
        counts: it has rules or policies to count.
        packets, bytes: replayed packets not yet folded into the rule counters.
        summary: on the segment that ends a path, the outcome of the whole path.
    """

    __slots__ = (
        "bytes",
        "cacheable",
        "counts",
        "end",
        "hits",
        "no",
        "ops",
        "p",
        "packets",
        "plain",
        "policies",
        "summary",
        "yes",
    )

    def __init__(
        self,
        hits: tuple[int, ...],
        policies: tuple[tuple[str, str], ...],
        ops: tuple[Op, ...],
        *,
        end: tuple[str, str, str | None, str] | None = None,
        p: float = 0.0,
        cacheable: bool = True,
    ) -> None:
        self.hits = hits
        self.policies = policies
        self.ops = ops
        self.end = end
        self.p = p
        self.yes: FlowSet | Segment | None = None
        self.no: FlowSet | Segment | None = None
        self.cacheable = cacheable
        self.counts = bool(hits or policies)
        #: Nothing to count and no end: only a draw (kube-proxy's endpoint ladders are these).
        self.plain = cacheable and not self.counts and end is None
        #: Packets (and their bytes) replayed through it since its counts were last folded.
        self.packets = self.bytes = 0
        #: For the last segment of a path: what the whole path does (set when grafted).
        self.summary: Summary | None = None


class FlowSet:
    """Segments keyed by the source prefix and ports their paths read (one table per mask).

    ``find(src, sport, dport)`` tries each mask in the order first seen, as OVS's subtables:
    a packet's key under a mask is ``(src >> shift, sport or 0, dport or 0)``.
    """

    __slots__ = ("masks",)

    def __init__(self) -> None:
        self.masks: list[tuple[int, int, dict[tuple[int, int, int], Segment]]] = []

    def find(self, src: int, sport: int, dport: int) -> Segment | None:
        """The segment for a packet with these input fields, or ``None``."""
        for shift, flags, table in self.masks:
            seg = table.get((src >> shift, sport if flags & SPORT else 0, dport if flags & DPORT else 0))
            if seg is not None:
                return seg
        return None

    def insert(self, shift: int, flags: int, key: tuple[int, int, int], seg: Segment) -> Segment:
        """The segment under ``(shift, flags)`` and ``key``; ``seg`` is stored there when none is."""
        table = next((t for s, f, t in self.masks if s == shift and f == flags), None)
        if table is None:
            table = {}
            self.masks.append((shift, flags, table))
        return table.setdefault(key, seg)


class Recorder:
    """Records the slow path of one packet as segments (see :meth:`FlowCache.graft`).

    The evaluator calls :meth:`rule` for each rule it tests, :meth:`op` for each effect to
    redo, :meth:`draw` for each random draw and :meth:`end` once; :meth:`stop` (or an
    uncacheable rule) ends the recording at that point.
    """

    __slots__ = (
        "bits",
        "ctx",
        "done",
        "flags",
        "live",
        "ops",
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
        if ctx.version == 4:  # the martian check compares the source with 127.0.0.0/8
            self._compare(127 << 24, 8)
        self.live = True
        self.done = False
        self.ops: list[Op] = []
        self.start_hits = self.start_policies = 0
        #: ``(bits, flags, segment fields, draw choice or None)`` per closed segment.
        self.segments: list[tuple[int, int, Segment, bool | None]] = []

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
            for cidr in deps[2]:
                if cidr.version == self.ctx.version:
                    self._compare(cidr.network, cidr.prefix)

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
        """An effect to redo on replay."""
        if self.live:
            self.ops.append((code, arg))

    def _close(self, **kw: object) -> Segment:
        ctx = self.ctx
        hits = tuple(ctx.hits[self.start_hits :])
        policies = tuple((t, c) for t, c, _ in ctx.policy_hits[self.start_policies :])
        self.start_hits, self.start_policies = len(ctx.hits), len(ctx.policy_hits)
        seg = Segment(hits, policies, tuple(self.ops), **kw)  # type: ignore[arg-type]
        self.ops = []
        return seg

    def draw(self, p: float, choice: bool) -> None:
        """A random draw with probability ``p`` came out ``choice``: the segment ends here."""
        if self.live:
            self.segments.append((self.bits, self.flags, self._close(p=p), choice))

    def end(self, verdict: str, delivery: str, device: str | None, reason: str) -> None:
        """The path ended with this outcome."""
        if self.live:
            seg = self._close(end=(verdict, delivery, device, reason))
            self.segments.append((self.bits, self.flags, seg, None))
            self.live = False
            self.done = True

    def stop(self) -> None:
        """What follows depends on state: packets reaching this point take the slow path."""
        if self.live:
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

    __slots__ = ("dirty", "interfaces", "limit", "node", "recorded", "roots", "ruleset", "segments")

    def __init__(self, ruleset: object, node: object, *, limit: int = 1 << 18) -> None:
        self.ruleset = ruleset
        self.node = node
        self.limit = limit
        self.roots: dict[BaseKey, FlowSet] = {}
        self.segments = 0
        #: Input interfaces already found on ``node`` (so a packet's need not be looked up).
        self.interfaces: set[str | None] = {None}
        #: Paths recorded (walked and grafted) so far, for statistics.
        self.recorded = 0
        #: Segments with packets not yet folded into the counters.
        self.dirty: list[Segment] = []

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
                if c is None:
                    rules[uid] = [n, b]
                else:
                    c[0] += n
                    c[1] += b
            for key in seg.policies:
                c = policies.setdefault(key, [0, 0])
                c[0] += n
                c[1] += b
            seg.packets = seg.bytes = 0
        self.dirty.clear()

    def full(self, more: int) -> bool:
        """Whether ``more`` segments would go over the limit."""
        return self.segments + more > self.limit

    def clear(self) -> None:
        """Forget every recorded path (fold the counters first)."""
        self.roots.clear()
        self.segments = 0

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
        for i, (bits, flags, seg, choice) in enumerate(rec.segments):
            if isinstance(at, FlowSet):
                shift = width - min(bits, width)
                key = (src >> shift, sport if flags & SPORT else 0, dport if flags & DPORT else 0)
                made = at.insert(shift, flags, key, seg)
            else:
                made = at
            if made is seg:
                self.segments += 1
            if choice is None:
                return made
            child = made.yes if choice else made.no
            if child is None:
                following = rec.segments[i + 1]
                # The same reads after the draw: the next segment is the only one possible.
                child = following[2] if following[:2] == (bits, flags) else FlowSet()
                if choice:
                    made.yes = child
                else:
                    made.no = child
            at = child
        return None
