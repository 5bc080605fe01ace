"""Rules, chains, tables and rulesets: immutable values.

A :class:`Ruleset` is the whole netfilter state of one IP family: tables by name, each with
its chains in order. Changing anything makes a new ruleset (so a failed restore simply keeps
the old one). Each rule has a ``uid`` that follows it through unrelated changes, as the
kernel's per-rule counters do; counters themselves live outside (see ``Counters``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from emulation.netfilter.hooks import hooks_of
from emulation.netfilter.matches import Match
from emulation.netfilter.targets import Target

__all__ = ["BUILTIN_CHAINS", "TABLE_ORDER", "Chain", "Rule", "Ruleset", "Table", "new_uid"]

#: Built-in chains per table, in the order iptables-save prints them (hook order): the hooks the
#: table registers at (:data:`~emulation.netfilter.hooks.STAGES`).
BUILTIN_CHAINS: dict[str, tuple[str, ...]] = {
    table: tuple(hook.value for hook in hooks_of(table))
    for table in ("raw", "mangle", "filter", "nat", "security")
}
#: The order iptables-save (nf_tables backend, 1.8.x) prints tables in.
TABLE_ORDER = ("mangle", "security", "raw", "filter", "nat")

_uids = itertools.count(1)


def new_uid() -> int:
    """A fresh rule identity (process-wide, increasing)."""
    return next(_uids)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One rule: basic matches, match modules in order, and an optional target.

    Attributes:
        chain: the chain it belongs to.
        basic: ``-s -d -i -o -p`` matches in canonical order (tested first, as ip_tables does).
        matches: ``-m`` modules in the order given (tested in that order; the first that fails
            stops, so later side effects such as ``recent --set`` do not happen).
        target: ``None`` for a rule without ``-j`` (it only counts).
        line: the restore input line that created it (0 if none).
        counters: the ``[packets:bytes]`` it was created with.
        uid: identity for counters and ``nth`` state (not part of equality).
    """

    chain: str
    basic: tuple[Match, ...] = ()
    matches: tuple[Match, ...] = ()
    target: Target | None = None
    line: int = field(default=0, compare=False)
    counters: tuple[int, int] = field(default=(0, 0), compare=False)
    uid: int = field(default_factory=new_uid, compare=False)

    def spec(self) -> str:
        """The rule without ``-A CHAIN``, canonical, as iptables-save prints it."""
        words: list[str] = []
        for m in self.basic:
            words += m.save_args()
        for m in self.matches:
            words += ["-m", m.module, *m.save_args()]
        if self.target is not None:
            words += self.target.save_args()
        return " ".join(words)

    def text(self) -> str:
        """``-A CHAIN ...`` in iptables-save form."""
        spec = self.spec()
        return f"-A {self.chain} {spec}" if spec else f"-A {self.chain}"


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Chain:
    """A chain: ``policy`` ACCEPT/DROP for a built-in chain, ``None`` for a user chain.

    Weakly referenceable, so that side tables keyed by a chain's identity (the accelerator's)
    can forget it when it is freed.
    """

    name: str
    policy: str | None = None
    rules: tuple[Rule, ...] = ()
    counters: tuple[int, int] = field(default=(0, 0), compare=False)

    @property
    def builtin(self) -> bool:
        """Whether this is a built-in chain (it has a policy)."""
        return self.policy is not None


@dataclass(frozen=True, slots=True)
class Table:
    """A table: ``name`` and its ``chains`` (built-in ones always present)."""

    name: str
    chains: Mapping[str, Chain]

    @classmethod
    def empty(cls, name: str) -> Table:
        """A table with only its built-in chains, policy ACCEPT, no rules."""
        return cls(name, {c: Chain(c, "ACCEPT") for c in BUILTIN_CHAINS[name]})


@dataclass(frozen=True, slots=True)
class Ruleset:
    """All tables of one IP family (``version`` 4 for iptables, 6 for ip6tables)."""

    version: int = 4
    tables: Mapping[str, Table] = field(default_factory=dict)

    def chain(self, table: str, chain: str) -> Chain | None:
        """The chain, or ``None`` if the table or chain does not exist."""
        t = self.tables.get(table)
        return t.chains.get(chain) if t else None

    def rules(self) -> list[tuple[str, Rule]]:
        """Every ``(table, rule)`` in save order."""
        out: list[tuple[str, Rule]] = []
        for tname in TABLE_ORDER:
            t = self.tables.get(tname)
            if t is not None:
                for c in chain_order(t):
                    out += [(tname, r) for r in t.chains[c].rules]
        return out

    def chains(self) -> list[Chain]:
        """Every chain of every table (in no particular order)."""
        return [c for t in self.tables.values() for c in t.chains.values()]


def chain_order(table: Table) -> list[str]:
    """Built-in chains in kernel order, then user chains sorted by name (as iptables-save)."""
    builtin = [c for c in BUILTIN_CHAINS[table.name] if c in table.chains]
    return builtin + sorted(c for c in table.chains if c not in BUILTIN_CHAINS[table.name])
