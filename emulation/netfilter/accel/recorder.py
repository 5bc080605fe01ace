"""Recording a walked packet's path as flow cache segments (see :mod:`.flowcache`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from emulation.netfilter.accel.compile import APPLY as APPLY_TARGET
from emulation.netfilter.accel.compile import target_code
from emulation.netfilter.accel.deps import NOTHING, Deps
from emulation.netfilter.accel.flowcache import APPLY, CONNTRACK, IIF, SNAT, TAIL, Cut, End, Op, Segment
from emulation.netfilter.context import Ctx
from emulation.netfilter.rules import Rule
from emulation.netfilter.targets import Target
from emulation.netfilter.verdicts import Delivery, Verdict

__all__ = ["Recorder"]

#: The IPv4 prefixes the path's martian checks test the source against (127.0.0.0/8;
#: multicast, limited broadcast and 0.0.0.0/8 at input routing).
_MARTIAN_SOURCES4 = ((127 << 24, 8), (0xE0000000, 4), (0xFFFFFFFF, 32), (0, 8))


class Recorder:
    """Records the slow path of one packet as segments (see :meth:`FlowCache.graft`).

    It watches a walked path (it is a :class:`~emulation.netfilter.path.PathObserver`): the
    walks tell it each rule they test (:meth:`tested`, or :meth:`rule` with its
    :data:`~emulation.netfilter.accel.deps.Deps` from the compiled walk) and each target they
    run (:meth:`applied`), the path each effect to redo (:meth:`conntrack`, :meth:`source_nat`,
    :meth:`entered`) and its end (:meth:`end`); the oracle each random draw (:meth:`draw`).
    :meth:`stop` (or an uncacheable rule) ends the recording at that point.

    Args:
        ctx: the packet's context (its hits and policies are read as the path goes).
        deps_of: what a rule reads (the accelerator's cached :func:`rule_deps`).
        known: the cache behind ``deps_of`` by rule uid, read first (saves a call per rule).
    """

    __slots__ = (
        "_deps",
        "at_draw",
        "bits",
        "body",
        "ctx",
        "deps_of",
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

    def __init__(
        self, ctx: Ctx, deps_of: Callable[[Rule], Deps], known: Mapping[int, Deps | bool] | None = None
    ) -> None:
        self.ctx = ctx
        self.deps_of = deps_of
        self._deps = known if known is not None else {}
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
        #: Each closed segment, in order.
        self.segments: list[Cut] = []

    def tested(self, rule: Rule) -> None:
        """The plain walk is about to test ``rule``."""
        deps = self._deps.get(rule.uid, False)
        if deps is False:
            deps = self.deps_of(rule)
        if deps is not NOTHING:
            self.rule(deps)  # type: ignore[arg-type]  # False (not known yet) was replaced

    def applied(self, target: Target) -> None:
        """A matching rule's target is about to run: its ``apply`` is redone on replay."""
        code, arg = target_code(target)
        if code == APPLY_TARGET:
            self.op(APPLY, arg)

    def applied_op(self, apply: object) -> None:
        """The compiled walk is about to run a target's ``apply``: redone on replay."""
        self.op(APPLY, apply)

    def conntrack(self) -> None:
        """Conntrack looks the packet up: redone on replay."""
        self.op(CONNTRACK, None)

    def source_nat(self, device: str | None, nexthop: str | None, chosen: int | None) -> None:
        """The flow's source mapping: redone on replay (with the address MASQUERADE chose)."""
        self.op(SNAT, (device, nexthop, chosen))

    def entered(self, iif: str) -> None:
        """The packet loops back in over ``iif``."""
        self.op(IIF, iif)

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
        self.segments.append(Cut(self.at_draw[0], self.at_draw[1], seg, exit_))
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

    def end(self, verdict: Verdict, delivery: Delivery, device: str | None, reason: str) -> None:
        """The path ended with this outcome."""
        if not self.live:
            return
        if self.rungs:
            self._close(TAIL)
        hits, policies, ops = self._take()
        seg = Segment(hits, policies, ops, end=End(verdict, delivery, device, reason))
        self.segments.append(Cut(self.bits, self.flags, seg, None))
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
        self.segments.append(Cut(self.bits, self.flags, Segment((), (), (), cacheable=False), None))
        self.live = False
        self.done = True
