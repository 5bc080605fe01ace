"""The mutable state of one packet while it walks the hooks: what matches read, targets write.

Theory of operation: a :class:`Ctx` lives for one evaluation path of one packet. Matches read
its fields; targets change them (``mark``, the NAT decision, ``ctmark``). Side effects that
outlive the packet (rule counters, ``recent`` lists, ``statistic --mode nth`` counters) are
*buffered* in the context and only committed by the caller in sample mode, so that enumerate
mode can explore every branch of one packet against the same starting state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from emulation.netfilter.verdicts import CtState
from emulation.node import Node

__all__ = ["Ctx", "Dynamic", "RecentEntry", "SetLookup", "TraceStep"]

#: ``lookup(set_name, keys) -> True | False | None`` where ``keys`` has one ``(ip, port,
#: protocol)`` per ``src``/``dst`` flag of ``--match-set``; ``None`` means "no such set".
SetLookup = Callable[[str, tuple[tuple[str, int, str], ...]], "bool | None"]


@dataclass(frozen=True, slots=True)
class RecentEntry:
    """One address in an ``xt_recent`` list: its hit ``stamps`` (seconds, oldest first)."""

    stamps: tuple[float, ...]


@dataclass(slots=True)
class Dynamic:
    """Netfilter state that outlives a packet: ``recent`` lists and ``nth`` counters.

    ``recent[name]`` maps ``(version, masked address)`` to its entry, in LRU order (the
    first key is the least recently updated), as ``xt_recent`` keeps it. ``nth[uid]`` is the
    counter of the ``statistic --mode nth`` match of the rule with that uid.
    """

    recent: dict[str, dict[tuple[int, int], RecentEntry]] = field(default_factory=dict)
    nth: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceStep:
    """One rule (or chain policy) a packet met.

    Attributes:
        hook: PREROUTING, INPUT, FORWARD, OUTPUT or POSTROUTING.
        table, chain: where the rule lives.
        index: 1-based rule number in the chain (0 for a chain policy).
        line: line in the restore input that created the rule (0 if unknown).
        rule: the rule in ``iptables-save`` form (or ``:CHAIN POLICY`` for a policy).
        result: ``match``, ``nomatch``, ``unknown`` or ``policy``.
        target: what the rule did when it matched (``""`` otherwise).
    """

    hook: str
    table: str
    chain: str
    index: int
    line: int
    rule: str
    result: str
    target: str


class Ctx:
    """Per-path packet state; see the module docstring. Internal to the evaluator."""

    __slots__ = (
        "ct_dir_reply",
        "ct_dnat",
        "ct_orig",
        "ct_reply",
        "ct_snat",
        "ctmark",
        "ctstate",
        "dnat",
        "dport",
        "dst",
        "dyn",
        "hits",
        "hook",
        "iif",
        "length",
        "mark",
        "masquerade",
        "node",
        "notrack",
        "now",
        "nth_overlay",
        "oif",
        "oracle",
        "policy_hits",
        "proto",
        "rand",
        "recent_overlay",
        "set_lookup",
        "snat",
        "sport",
        "src",
        "syn",
        "trace",
        "tracing",
        "uncertain",
        "version",
    )

    def __init__(
        self,
        *,
        node: Node,
        version: int,
        src: int,
        dst: int,
        sport: int,
        dport: int,
        proto: str,
        iif: str | None,
        mark: int,
        length: int,
        syn: bool,
        now: float,
        dyn: Dynamic,
        oracle: Callable[[float], bool],
        set_lookup: SetLookup | None,
        tracing: bool,
    ) -> None:
        self.node = node
        self.version = version
        self.src, self.dst, self.sport, self.dport, self.proto = src, dst, sport, dport, proto
        self.iif: str | None = iif
        self.oif: str | None = None
        self.mark = mark
        self.length = length
        self.syn = syn
        self.now = now
        self.dyn = dyn
        self.oracle = oracle
        self.set_lookup = set_lookup
        self.tracing = tracing
        self.trace: list[TraceStep] = []
        self.hook = ""
        self.ctstate = CtState.NEW
        self.ct_dir_reply = False
        self.ct_dnat = False
        self.ct_snat = False
        self.ctmark = 0
        # (ip version, src, sport, dst, dport) of the conntrack tuples, when tracked.
        self.ct_orig: tuple[int, int, int, int] | None = None
        self.ct_reply: tuple[int, int, int, int] | None = None
        self.notrack = False
        self.dnat: tuple[int, int] | None = None  # (address, port) chosen by DNAT/REDIRECT
        # (address or -1 for MASQUERADE's, low port, high port, random) asked by SNAT/MASQUERADE
        self.snat: tuple[int, int | None, int | None, bool] | None = None
        #: Sample mode's generator (``random.random``), for NAT's random port offsets; ``None``
        #: in enumerate, which takes offset 0 (see emulation.netfilter.nat).
        self.rand: Callable[[], float] | None = None
        self.masquerade = False
        self.uncertain = False
        self.hits: list[int] = []  # uid of each matched rule; each counts ``length`` bytes
        self.policy_hits: list[tuple[str, str, int]] = []  # (table, chain, bytes)
        self.nth_overlay: dict[int, int] = {}
        self.recent_overlay: dict[str, dict[tuple[int, int], RecentEntry]] = {}

    def recent_table(self, name: str, *, write: bool) -> dict[tuple[int, int], RecentEntry]:
        """The ``recent`` list ``name`` as this path sees it (copied on first write)."""
        table = self.recent_overlay.get(name)
        if table is not None:
            return table
        base = self.dyn.recent.get(name, {})
        if not write:
            return base
        table = dict(base)
        self.recent_overlay[name] = table
        return table

    def nth_count(self, uid: int, initial: int) -> int:
        """The current ``nth`` counter of rule ``uid`` (``initial`` before its first packet)."""
        if uid in self.nth_overlay:
            return self.nth_overlay[uid]
        return self.dyn.nth.get(uid, initial)
