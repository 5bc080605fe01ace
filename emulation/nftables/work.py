"""The mutable working copy a transaction edits, and the token cursor its parsers share.

A transaction (:func:`emulation.nftables.ruleset.apply`) copies the ruleset into
:class:`Work` (tables, chains with their rule lists, sets with their elements by key), edits
it, and freezes it into a new :class:`~.model.Ruleset` only when the whole input was
accepted. Handles come from a per-table counter shared by chains, sets and rules
(``table->hgenerator`` in nf_tables_api.c).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from emulation.errors import InputError
from emulation.nftables import exprs as ex
from emulation.nftables.model import Chain, Element, Family, NftHook, Rule, Ruleset, Table, TableSet
from emulation.nftables.tokens import NEWLINE, Token, tokenize
from emulation.nftables.types import Key

__all__ = [
    "PRIORITY_NAMES",
    "Cursor",
    "WChain",
    "WSet",
    "WTable",
    "Work",
    "parse_duration",
    "priority_name_fits",
    "refs",
]

#: Standard priority names (``std_prios`` in nft's src/rule.c; ``enum nf_ip_hook_priorities``).
PRIORITY_NAMES: dict[str, int] = {
    "raw": -300,
    "mangle": -150,
    "dstnat": -100,
    "filter": 0,
    "security": 50,
    "srcnat": 100,
}


def priority_name_fits(name: str, hook: NftHook | None) -> bool:
    """Whether a standard priority name may be used at ``hook``: ``dstnat`` only at
    prerouting and ``srcnat`` only at postrouting, as nft 1.0.6's
    ``std_prio_family_hook_compat`` (elsewhere nft says "invalid priority expression value in
    this context")."""
    if name == "dstnat":
        return hook == NftHook.PREROUTING
    if name == "srcnat":
        return hook == NftHook.POSTROUTING
    return True


_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> float:
    """Seconds in an nft time like ``3h``, ``10800s``, ``1h30m`` or ``500ms``.

    Raises:
        InputError: not a duration.
    """
    total, num, i = 0.0, "", 0
    if text.isdigit():
        return float(text)
    while i < len(text):
        c = text[i]
        if c.isdigit():
            num += c
            i += 1
            continue
        unit = "ms" if text[i : i + 2] == "ms" else c
        if unit not in _UNITS or not num:
            raise InputError(f"{text!r} is not a time (e.g. 3h, 10800s, 1h30m)")
        total += int(num) * _UNITS[unit]
        num, i = "", i + len(unit)
    if num:
        raise InputError(f"{text!r} is not a time: a number without a unit at its end")
    return total


@dataclass(slots=True)
class WSet:
    spec: TableSet
    elements: dict[tuple[Key, ...], Element] = field(default_factory=dict)


@dataclass(slots=True)
class WChain:
    spec: Chain
    rules: list[Rule] = field(default_factory=list)


@dataclass(slots=True)
class WTable:
    family: Family
    name: str
    comment: str | None
    sets: dict[str, WSet]
    chains: dict[str, WChain]
    next_handle: int

    def handle(self) -> int:
        self.next_handle += 1
        return self.next_handle - 1


class Work:
    """The mutable copy a transaction edits (see the module docstring)."""

    def __init__(self, rs: Ruleset, strict: bool) -> None:
        self.strict = strict
        self.tables: dict[tuple[Family, str], WTable] = {}
        for key, t in rs.tables.items():
            self.tables[key] = WTable(
                t.family,
                t.name,
                t.comment,
                {n: WSet(s, {e.key: e for e in s.elements}) for n, s in t.sets.items()},
                {n: WChain(c, list(c.rules)) for n, c in t.chains.items()},
                t.next_handle,
            )
        #: ``(family, table, set)`` of the sets this transaction created.
        self.created_sets: set[tuple[Family, str, str]] = set()
        self.deferred: list[tuple[int, WTable]] = []  # block-form tables to check at the end

    def freeze(self) -> Ruleset:
        out: dict[tuple[Family, str], Table] = {}
        for key, t in self.tables.items():
            sets = {n: replace(s.spec, elements=tuple(s.elements.values())) for n, s in t.sets.items()}
            chains = {n: replace(c.spec, rules=tuple(c.rules)) for n, c in t.chains.items()}
            out[key] = Table(
                family=t.family,
                name=t.name,
                comment=t.comment,
                sets=sets,
                chains=chains,
                next_handle=t.next_handle,
            )
        return Ruleset(tables=out)


def refs(stmts: tuple[ex.Stmt, ...]) -> tuple[list[str], list[str]]:
    """Chains and sets a rule names."""
    chains: list[str] = []
    sets: list[str] = []
    for st in stmts:
        if isinstance(st, ex.VerdictStmt) and st.verdict.chain is not None:
            chains.append(st.verdict.chain)
        elif isinstance(st, ex.VMap | ex.Numgen):
            chains.extend(v.chain for _, v in st.entries if v.chain is not None)
            if isinstance(st, ex.VMap) and st.set_name is not None:
                sets.append(st.set_name)
        elif isinstance(st, ex.Match | ex.SetUpdate) and st.set_name is not None:
            sets.append(st.set_name)
        elif isinstance(st, ex.Nat) and st.map_name is not None:
            sets.append(st.map_name)
    return chains, sets


class Cursor:
    """A position in a transaction's tokens, over its :class:`Work`."""

    def __init__(self, text: str, work: Work) -> None:
        self.toks = tokenize(text)
        self.pos = 0
        self.work = work

    def peek(self) -> str:
        return self.toks[self.pos].text if self.pos < len(self.toks) else ""

    @property
    def line(self) -> int:
        return self.toks[min(self.pos, len(self.toks) - 1)].line if self.toks else 0

    def take(self) -> str:
        if self.pos >= len(self.toks):
            raise InputError("unexpected end of input")
        self.pos += 1
        return self.toks[self.pos - 1].text

    def expect(self, word: str) -> None:
        got = self.take()
        if got != word:
            raise InputError(f"expected {word!r}, found {got!r}")

    def skip_ends(self) -> None:
        while self.peek() in (NEWLINE, ";"):
            self.pos += 1

    def upto_end(self) -> list[Token]:
        """Tokens up to the next newline or ``;`` outside braces (a rule)."""
        out: list[Token] = []
        depth = 0
        while self.pos < len(self.toks):
            tok = self.toks[self.pos]
            if depth == 0 and tok.text in (NEWLINE, ";"):
                break
            if tok.text == "{":
                depth += 1
            elif tok.text == "}":
                if depth == 0:
                    raise InputError("a rule must end with a newline or ';' before '}'")
                depth -= 1
            if tok.text != NEWLINE:
                out.append(tok)
            self.pos += 1
        return out

    # --- top level -------------------------------------------------------------------------------
