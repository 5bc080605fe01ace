"""The accelerator's side tables, and the compiled, indexed walk of a chain.

Theory of operation: an :class:`Accelerator` keeps, beside the immutable rules and chains it
was shown (never inside them), what it derived from them: each chain's compiled form and
index (:class:`~emulation.netfilter.accel.compile.CompiledChain`) and the short chains walked
once, keyed by the chain's identity, and what each rule reads, keyed by the rule's ``uid``
(never reused). A chain entry holds a weak reference whose callback drops it when the chain
is freed, before its identity can be reused; the rule table is emptied when it grows past
:data:`MAX_DEPS` (each entry is remade in about a microsecond when its rule is met again).
What it derives is a function of the chain or rule alone, so one accelerator
(:func:`shared`) serves every :class:`~emulation.netfilter.Netns`: a ruleset loaded into
several is compiled once.

The indexed walk (:meth:`Accelerator.walker`) runs a long chain's compiled rules, and only the
candidates its index gives for the packet; the rules it leaves out are ones whose match is
known to fail, and the kernel counts only matched rules, so its verdicts, counters and side
effects are exactly those of the plain walk (:func:`emulation.netfilter.traverse.walk_rules`;
an equivalence property tests this). A short chain is walked as written (by the plain walk)
at its first visit and compiled at its second; a new flow's walk with the flow cache on never
compiles one (its path is replayed from then on, and compiled chains only add work for the
garbage collector). While the flow cache records a path, the walk tells the recorder what each
tested rule reads and which targets ran.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

from emulation.errors import NetfilterError
from emulation.netfilter.accel.compile import (
    APPLY,
    COUNT,
    GOTO,
    JUMP,
    MIN_INDEXED,
    VERDICT,
    ChainIndex,
    CompiledChain,
)
from emulation.netfilter.accel.deps import DPORT, NOTHING, Deps, rule_deps
from emulation.netfilter.accel.recorder import Recorder
from emulation.netfilter.context import Ctx
from emulation.netfilter.rules import Chain, Rule, Table
from emulation.netfilter.targets import TargetResult
from emulation.netfilter.traverse import MAX_DEPTH, ChainWalk, walk_rules
from emulation.netfilter.verdicts import CONTINUE, RETURN

__all__ = ["MAX_DEPS", "Accelerator", "shared"]

#: Rule dependencies kept before the table is emptied (about 100 MB at most).
MAX_DEPS = 1 << 21


class Accelerator:
    """Compiled chains, their indexes and rule dependencies, in side tables; see the module docstring.

    Attributes:
        walk: the indexed walk (a :data:`~emulation.netfilter.traverse.ChainWalk`), compiling a
            short chain at its second visit.
        new_flow_walk: the same, never compiling a short chain (for new flows the flow cache
            handles), recording nothing.
    """

    __slots__ = ("_chains", "_deps", "new_flow_walk", "walk")

    def __init__(self) -> None:
        self._chains: dict[int, _ChainEntry] = {}
        self._deps: dict[int, Deps | bool] = {}
        self.walk = self.walker(None, compile_short=True)
        self.new_flow_walk = self.walker(None, compile_short=False)

    def __deepcopy__(self, memo: dict[int, object]) -> Accelerator:
        return self  # a cache of what immutable values imply: a copy of a Netns may share it

    def __reduce__(self) -> tuple[type[Accelerator], tuple[()]]:
        return Accelerator, ()  # pickled empty: it is refilled as packets meet the rules

    def recorder(self, ctx: Ctx) -> Recorder:
        """A recorder for the path of the packet in ``ctx``, reading rule dependencies from here."""
        return Recorder(ctx, self.deps, self._deps)

    def deps(self, rule: Rule) -> Deps:
        """What ``rule`` reads (:func:`~emulation.netfilter.accel.deps.rule_deps`), computed once."""
        table = self._deps
        d = table.get(rule.uid, False)
        if d is False:
            if len(table) >= MAX_DEPS:
                table.clear()
            d = table[rule.uid] = rule_deps(rule)
        return d  # type: ignore[return-value]

    def compiled(self, chain: Chain) -> CompiledChain:
        """``chain`` compiled (built at the first call, then kept while the chain lives)."""
        entry = self._entry(chain)
        if entry.compiled is None:
            entry.compiled = CompiledChain(chain.rules, self.deps)
        return entry.compiled

    def index(self, chain: Chain) -> ChainIndex | None:
        """``chain``'s dispatch index, or ``None`` when it is walked rule by rule."""
        return self.compiled(chain).index

    def _entry(self, chain: Chain) -> _ChainEntry:
        """``chain``'s entry (made empty, meaning "walked once", when it has none)."""
        entry = self._chains.get(id(chain))
        if entry is None:
            entry = self._chains[id(chain)] = _ChainEntry(chain, self._forget)
        return entry

    def _forget(self, entry: weakref.ref[Chain]) -> None:
        """A chain was freed: drop its entry (before its identity can be reused)."""
        assert isinstance(entry, _ChainEntry)
        if self._chains.get(entry.key) is entry:
            del self._chains[entry.key]

    def walker(self, rec: Recorder | None, *, compile_short: bool) -> ChainWalk:
        """The indexed walk, telling ``rec`` (when given) what it reads and runs; a short chain
        is compiled at its second visit only with ``compile_short``."""
        chains, compile_chain, mark = self._chains, self.compiled, self._entry

        def walk(ctx: Ctx, table: Table, chain: Chain, depth: int) -> str | None:
            if depth > MAX_DEPTH:
                raise NetfilterError(
                    f"chain nesting deeper than {MAX_DEPTH} at {table.name}/{chain.name}: a loop?"
                )
            entry = chains.get(id(chain))
            compiled = None if entry is None else entry.compiled
            if compiled is None:
                if len(chain.rules) < MIN_INDEXED and (not compile_short or entry is None):
                    if compile_short:
                        mark(chain)  # walked once: compiled at the next visit
                    return walk_rules(ctx, table, chain, depth, observer=rec, descend=walk)
                compiled = compile_chain(chain)
            seq = compiled.rules
            if seq is None:
                seq = compiled.candidates(ctx)
            hits = ctx.hits
            if rec is not None and compiled.index is not None and compiled.index.kind == "dport":
                rec.read(DPORT)
            for uid, test, code, arg, deps in seq:
                if rec is not None and deps is not NOTHING:
                    rec.rule(deps)
                if test is not None:
                    res = test(ctx)
                    if res is not True:
                        if res is None:
                            ctx.uncertain = True
                        continue
                hits.append(uid)
                if code == JUMP:
                    sub = walk(ctx, table, table.chains[arg], depth + 1)  # type: ignore[index]
                    if sub is None or sub == RETURN:
                        continue
                    return sub
                if code == VERDICT:
                    return arg  # type: ignore[return-value]
                if code == COUNT:
                    continue
                if code == GOTO:
                    sub = walk(ctx, table, table.chains[arg], depth + 1)  # type: ignore[index]
                    return None if sub is None or sub == RETURN else sub
                assert code == APPLY
                if rec is not None:
                    rec.applied_op(arg)
                verdict: TargetResult = arg(ctx)  # type: ignore[operator]
                if verdict == CONTINUE:
                    continue
                if isinstance(verdict, tuple):
                    kind, name = verdict
                    sub = walk(ctx, table, table.chains[name], depth + 1)
                    if kind == "GOTO":
                        return None if sub is None or sub == RETURN else sub
                    if sub is None or sub == RETURN:
                        continue
                    return sub
                return verdict
            return None

        return walk


class _ChainEntry(weakref.ref[Chain]):
    """A chain's entry: a weak reference to it, with its compiled form (``None``: walked once)."""

    __slots__ = ("compiled", "key")

    def __init__(self, chain: Chain, forget: Callable[[weakref.ref[Chain]], None]) -> None:
        super().__init__(chain, forget)  # type: ignore[call-arg]  # ref.__init__ takes them (typeshed has object's)
        self.key = id(chain)
        self.compiled: CompiledChain | None = None


_SHARED = Accelerator()


def shared() -> Accelerator:
    """The accelerator every :class:`~emulation.netfilter.Netns` uses unless given another."""
    return _SHARED
