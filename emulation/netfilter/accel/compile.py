"""Rules compiled for the indexed walk: closures in tuples, and an index per long chain.

Theory of operation: a :class:`CompiledChain` is built lazily, the first time a packet walks
the chain without tracing, and kept by the :class:`~emulation.netfilter.accel.Accelerator` in
a side table keyed by the chain's identity (a ``--noflush`` restore keeps untouched chains, so
it keeps their compiled form too). Each rule becomes a :class:`CRule` ``(uid, test, code, arg,
deps)``: ``test`` runs the rule's matches in order as one closure (``None`` when every match
always holds, e.g. only ``-m comment``), ``code`` says what the target does without a method
call for the common ones (count only, jump, goto, a fixed verdict), ``arg`` is the chain name,
the verdict or the target's ``apply``, and ``deps`` is what the matches read, for the flow
cache (:func:`emulation.netfilter.accel.deps.rule_deps`).

A chain of at least :data:`MIN_INDEXED` rules is indexed by the exact destination address
(``-d IP/32``, a basic match) or, failing that, by the exact ``(protocol, dport)`` of a
``-m tcp|udp|sctp --dport N`` preceded only by pure, definite modules (``comment``, ports,
``mark`` ...). The candidates for a packet are the rules keyed on its value plus every rule
with no key, in chain order. A rule left out carries a key the packet does not have, so its
keyed match fails; nothing before that match can count, change state, draw a random number
or be unknown. Skipping it therefore leaves verdicts, counters, ``recent``/``nth`` state,
the random stream and the uncertainty flag exactly as the full walk leaves them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from emulation.netfilter.accel.deps import Deps
from emulation.netfilter.context import Ctx
from emulation.netfilter.matches import (
    AddressMatch,
    AddrType,
    Comment,
    Conntrack,
    Icmp,
    Mark,
    Multiport,
    Nfacct,
    Ports,
    Pred,
)
from emulation.netfilter.rules import Rule
from emulation.netfilter.targets import Jump, Reject, Simple, Target, TargetResult
from emulation.netfilter.verdicts import RETURN, Verdict

__all__ = [
    "APPLY",
    "COUNT",
    "GOTO",
    "JUMP",
    "MIN_INDEXED",
    "VERDICT",
    "CRule",
    "ChainIndex",
    "CompiledChain",
    "build_index",
    "compile_rule",
    "dispatch_keys",
    "target_code",
]

COUNT, JUMP, GOTO, VERDICT, APPLY = range(5)
#: The fixed verdicts of Simple targets, as the walk returns them.
_FIXED = {"ACCEPT": Verdict.ACCEPT, "DROP": Verdict.DROP, "RETURN": RETURN}


class CRule(NamedTuple):
    """A compiled rule; see the module docstring."""

    uid: int
    test: Pred | None
    code: int
    arg: object
    deps: Deps


DstKey = tuple[int, int]
PortKey = tuple[str, int]

#: Chains shorter than this are walked rule by rule (an index would not pay for itself).
MIN_INDEXED = 16
#: An index is built only when at most this many rules (and at most half) have no key.
MAX_GENERIC = 32

#: Modules that neither change state nor can be unknown: a rule may be skipped past them.
_PURE = (Comment, Nfacct, Ports, Multiport, Mark, AddrType, Conntrack, Icmp)


def _all_of(preds: list[Pred]) -> Pred | None:
    """One closure running ``preds`` in order; the first result that is not True is the result."""
    if not preds:
        return None
    if len(preds) == 1:
        return preds[0]
    if len(preds) == 2:
        a, b = preds

        def two(ctx: Ctx) -> bool | None:
            r = a(ctx)
            return b(ctx) if r is True else r

        return two
    if len(preds) == 3:
        a, b, c = preds

        def three(ctx: Ctx) -> bool | None:
            r = a(ctx)
            if r is not True:
                return r
            r = b(ctx)
            return c(ctx) if r is True else r

        return three
    seq = tuple(preds)

    def many(ctx: Ctx) -> bool | None:
        for p in seq:
            r = p(ctx)
            if r is not True:
                return r
        return True

    return many


def target_code(target: Target | None) -> tuple[int, object]:
    """``(code, arg)`` for a target: COUNT, JUMP/GOTO with the chain, VERDICT, or APPLY with ``apply``."""
    if target is None:
        return COUNT, None
    if isinstance(target, Jump):
        return (GOTO if target.goto else JUMP), target.chain
    if isinstance(target, Simple):
        fixed = _FIXED.get(target.verdict)
        if fixed is not None:
            return VERDICT, fixed
        if target.verdict in ("LOG", "NFLOG", "TRACE"):
            return COUNT, None
    if isinstance(target, Reject):
        return VERDICT, Verdict.REJECT
    apply: Callable[[Ctx], TargetResult] = target.apply
    return APPLY, apply


def compile_rule(rule: Rule, deps: Deps) -> CRule:
    """The rule as ``(uid, test, code, arg, deps)``: the same matches, in the same order, as
    closures; ``deps`` is what they read (:func:`~emulation.netfilter.accel.deps.rule_deps`)."""
    preds: list[Pred] = []
    for m in (*rule.basic, *rule.matches):
        p = m.compile(rule.uid)
        if p is not None:
            preds.append(p)
    code, arg = target_code(rule.target)
    return CRule(rule.uid, _all_of(preds), code, arg, deps)


def dispatch_keys(rule: Rule) -> tuple[DstKey | None, PortKey | None]:
    """``((version, dst), (proto, dport))`` when the rule can only match that exact value.

    Either part is ``None`` when the rule has no such test, or (for the port) when a module
    before it could change state or be unknown.
    """
    dst: DstKey | None = None
    for m in rule.basic:
        if isinstance(m, AddressMatch) and m.side == "d" and not m.negated and m.cidr.is_host:
            dst = (m.cidr.version, m.cidr.network)
    port: PortKey | None = None
    for m in rule.matches:
        if isinstance(m, Ports) and m.dport and not m.dport_neg and m.dport[0] == m.dport[1]:
            port = (m.proto, m.dport[0])
            break
        if not isinstance(m, _PURE):
            break
    return dst, port


@dataclass(frozen=True, slots=True)
class ChainIndex:
    """Candidate rule positions per exact destination (``kind="dst"``) or per protocol and port.

    ``by_key[key]`` lists, in order, every rule that could match a packet with that key
    (rules keyed on it plus every rule with no key); ``fallback`` is for other packets.
    """

    kind: str  # "dst" or "dport"
    by_key: Mapping[object, tuple[int, ...]]
    fallback: tuple[int, ...]


def build_index(rules: tuple[Rule, ...]) -> ChainIndex | None:
    """The index of a chain, or ``None`` when it is short or too few of its rules have keys."""
    if len(rules) < MIN_INDEXED:
        return None
    keys = [dispatch_keys(r) for r in rules]
    for kind, pos in (("dst", 0), ("dport", 1)):
        generic = tuple(i for i, k in enumerate(keys) if k[pos] is None)
        if len(generic) > MAX_GENERIC or len(generic) * 2 > len(rules):
            continue
        buckets: dict[object, list[int]] = {}
        for i, k in enumerate(keys):
            if k[pos] is not None:
                buckets.setdefault(k[pos], []).append(i)
        by_key = {key: tuple(sorted((*idx, *generic))) for key, idx in buckets.items()}
        return ChainIndex(kind, by_key, generic)
    return None


class CompiledChain:
    """A chain's rules compiled (lazily, rule by rule) and its index; see the module docstring.

    Args:
        rules: the chain's rules.
        deps_of: what a rule reads (the accelerator's cached :func:`rule_deps`).
    """

    __slots__ = ("_compiled", "_deps_of", "_fallback", "_hot", "_rules", "index", "rules")

    def __init__(self, rules: tuple[Rule, ...], deps_of: Callable[[Rule], Deps]) -> None:
        self._rules = rules
        self._deps_of = deps_of
        self._compiled: list[CRule | None] = [None] * len(rules)
        self.index = build_index(rules)
        #: Every rule compiled, in order, when the chain has no index (else ``None``).
        self.rules = self._rules_at(range(len(rules))) if self.index is None else None
        self._fallback: tuple[CRule, ...] | None = None
        self._hot: dict[object, tuple[CRule, ...]] = {}

    def _rules_at(self, positions: range | tuple[int, ...]) -> tuple[CRule, ...]:
        out = []
        for i in positions:
            c = self._compiled[i]
            if c is None:
                rule = self._rules[i]
                c = self._compiled[i] = compile_rule(rule, self._deps_of(rule))
            out.append(c)
        return tuple(out)

    def candidates(self, ctx: Ctx) -> tuple[CRule, ...]:
        """The compiled rules a packet in ``ctx`` could match, in chain order."""
        ix = self.index
        if ix is None:
            assert self.rules is not None
            return self.rules
        key: object = (ctx.version, ctx.dst) if ix.kind == "dst" else (ctx.proto, ctx.dport)
        seq = self._hot.get(key)
        if seq is not None:
            return seq
        positions = ix.by_key.get(key)
        if positions is not None:
            seq = self._hot[key] = self._rules_at(positions)
            return seq
        seq = self._fallback
        if seq is None:
            seq = self._fallback = self._rules_at(ix.fallback)
        return seq
