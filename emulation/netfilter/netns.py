"""One node's netfilter state, and the packets sent through it: :class:`Netns`.

Two modes share one pure evaluation: :meth:`Netns.send` samples (statistic matches draw from
the caller's ``random.Random``; counters, ``recent`` lists, ``nth`` counters and conntrack are
updated) and :meth:`Netns.enumerate` returns every outcome with its probability (a
``statistic --mode random`` match branches; nothing is updated, not even counters).

A packet's way through the hooks is :class:`~emulation.netfilter.path.Path`, the reference.
Traced, or with ``indexed`` off, every chain is walked as written. Otherwise the accelerator
(:mod:`emulation.netfilter.accel`) walks compiled, indexed chains and, for the first packet of
a flow, replays the path recorded in the flow cache for a packet equal to it in the fields
its path reads: the same draws, counters, conntrack entry and outcome, without testing a rule.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from emulation.addr import parse_address
from emulation.clock import Clock
from emulation.conntrack import ConntrackTable
from emulation.netfilter.accel import Accelerator, FlowCache, FlowFront, Segment
from emulation.netfilter.accel.replay import last_hit, path_ctmark
from emulation.netfilter.accel.walk import shared
from emulation.netfilter.context import Ctx, Dynamic, SetLookup
from emulation.netfilter.counters import Counters, commit_walk
from emulation.netfilter.outcome import Outcome
from emulation.netfilter.path import Path
from emulation.netfilter.reject import rejected, rejected_new_flow, send_answers
from emulation.netfilter.rules import Rule, Ruleset
from emulation.netfilter.ruleset import apply_restore, save
from emulation.netfilter.verdicts import Verdict
from emulation.node import Node
from emulation.packet import Packet

__all__ = ["Netns"]


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
        self._accel = shared()
        self._front = FlowFront(self, self._accel)
        self._by_uid: tuple[Ruleset, dict[int, Rule]] | None = None

    @property
    def accelerator(self) -> Accelerator:
        """The side tables of the compiled, indexed walk (shared by every Netns)."""
        return self._accel

    @property
    def flow_cache(self) -> FlowCache | None:
        """The flow cache of the current rules (``None`` before the first cached packet)."""
        return self._front.flows

    @property
    def counters(self) -> Counters:
        """Live rule and policy counters (packets counted by the flow cache folded in first)."""
        self._front.fold(self._counters)
        return self._counters

    @counters.setter
    def counters(self, value: Counters) -> None:
        self._front.fold(self._counters)
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

    def rule(self, uid: int) -> Rule | None:
        """The rule of the current ruleset with this ``uid``, or ``None`` (indexed once per ruleset)."""
        by_uid = self._by_uid
        if by_uid is None or by_uid[0] is not self.ruleset:
            by_uid = self._by_uid = (self.ruleset, {r.uid: r for _, r in self.ruleset.rules()})
        return by_uid[1].get(uid)

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
        if isinstance(effects, Ctx):
            commit_walk(effects, self._counters, self.dynamic)
        else:  # replayed from the flow cache: count its segments
            self._front.count(effects, packet.length)
        if commit is not None:
            commit()
        if outcome.verdict != Verdict.REJECT:
            return outcome
        if isinstance(effects, Ctx):
            refused = rejected(packet, outcome, effects, self.conntrack, self.rule)
        else:
            refused = rejected_new_flow(packet, outcome, last_hit(effects), path_ctmark(effects), self.rule)
        return send_answers(
            outcome,
            refused,
            node=self.node,
            ruleset=self.ruleset,
            counters=self._counters,
            dyn=self.dynamic,
            now=self.clock.now(),
            oracle=lambda p: rand() < p,
            set_lookup=self.set_lookup,
            tracing=trace,
            walk=self._accel.walk if self.indexed else None,
            rule_of=self.rule,
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
        source behind ``oracle`` (a draw of probability ``p`` is ``rand() < p``); there
        ``oracle`` may be ``None`` (a replay needs only ``rand``, a walk makes it from ``rand``).
        """
        version, src = parse_address(packet.src)
        _, dst = parse_address(packet.dst)
        if version != self.ruleset.version:
            raise ValueError(
                f"an IPv{version} packet sent to IPv{self.ruleset.version} rules: a Netns holds one family's "
                f"rules (iptables or ip6tables); use one Netns per family"
            )
        node = self.node
        flows = self._front.flows
        iif = packet.in_interface
        if iif is not None and (flows is None or flows.node is not node or iif not in flows.interfaces):
            if node.interface(iif) is None:
                raise ValueError(f"in_interface={iif!r} is not an interface of the node")
            if flows is not None and flows.node is node:
                flows.interfaces.add(iif)
        if tracing or not self.indexed:
            return Path(
                self, self._ctx(packet, version, src, dst, oracle, rand, tracing), packet, src, dst
            ).run()
        accel = self._accel
        if (
            not self.cache_flows
            or self.conntrack.lookup((version, src, packet.sport, dst, packet.dport, packet.protocol))
            is not None
        ):  # an established flow, or no flow cache: walked
            ctx = self._ctx(packet, version, src, dst, oracle, rand, False)
            return Path(self, ctx, packet, src, dst, walk=accel.walk).run()
        return self._front.evaluate(
            packet, version, src, dst, oracle, rand, self._counters, self._new_flow_ctx
        )

    def _new_flow_ctx(
        self,
        packet: Packet,
        version: int,
        src: int,
        dst: int,
        oracle: Callable[[float], bool] | None,
        rand: Callable[[], float] | None,
    ) -> Ctx:
        return self._ctx(packet, version, src, dst, oracle, rand, False)

    def _ctx(
        self,
        packet: Packet,
        version: int,
        src: int,
        dst: int,
        oracle: Callable[[float], bool] | None,
        rand: Callable[[], float] | None,
        tracing: bool,
    ) -> Ctx:
        if oracle is None:
            assert rand is not None, "an oracle or a generator is needed"
            sample = rand
            oracle = lambda p: sample() < p  # noqa: E731
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
            oracle=oracle,
            set_lookup=self.set_lookup,
            tracing=tracing,
        )
        ctx.rand = rand
        return ctx
