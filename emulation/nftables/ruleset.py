"""Loading nft input into a :class:`~.model.Ruleset`: ``nft -f`` scripts in the block form
(``table ip t { chain c { ... } }``) and the command form (``add rule ip t c ...``), as
kube-proxy's knftables writes its transactions, and ``nft list ruleset`` output.

Theory of operation: a transaction works on a mutable copy (:class:`_Work`) of the ruleset
and is frozen into a new :class:`Ruleset` only when the whole input was accepted, as the
kernel commits or aborts a netlink batch whole (``nf_tables_commit`` / ``nf_tables_abort`` in
net/netfilter/nf_tables_api.c). An error names the input line. References to chains and sets
inside a ``table { ... }`` block are resolved when the transaction ends (nft's block form); a
command-form rule or element must name a chain or set that exists already, as nft 1.0.6
requires. A chain still jumped to cannot be deleted (``EBUSY``). Rule handles come from a
per-table counter shared with chains and sets (``table->hgenerator``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from emulation.errors import InputError
from emulation.nftables import exprs as ex
from emulation.nftables.model import (
    Chain,
    ChainType,
    Element,
    Family,
    NftablesError,
    NftHook,
    Policy,
    Rule,
    Ruleset,
    SetFlag,
    Table,
    TableSet,
)
from emulation.nftables.tokens import NEWLINE, Token, tokenize
from emulation.nftables.types import Datum, Key, Verdict, VerdictKind, parse_key

__all__ = ["PRIORITY_NAMES", "apply", "load", "parse_duration", "priority_name_fits"]

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
class _WSet:
    spec: TableSet
    elements: dict[tuple[Key, ...], Element] = field(default_factory=dict)


@dataclass(slots=True)
class _WChain:
    spec: Chain
    rules: list[Rule] = field(default_factory=list)


@dataclass(slots=True)
class _WTable:
    family: Family
    name: str
    comment: str | None
    sets: dict[str, _WSet]
    chains: dict[str, _WChain]
    next_handle: int

    def handle(self) -> int:
        self.next_handle += 1
        return self.next_handle - 1


class _Work:
    """The mutable copy a transaction edits (see the module docstring)."""

    def __init__(self, rs: Ruleset, strict: bool) -> None:
        self.strict = strict
        self.tables: dict[tuple[Family, str], _WTable] = {}
        for key, t in rs.tables.items():
            self.tables[key] = _WTable(
                t.family,
                t.name,
                t.comment,
                {n: _WSet(s, {e.key: e for e in s.elements}) for n, s in t.sets.items()},
                {n: _WChain(c, list(c.rules)) for n, c in t.chains.items()},
                t.next_handle,
            )
        self.deferred: list[tuple[int, _WTable]] = []  # block-form tables to check at the end

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


def _refs(stmts: tuple[ex.Stmt, ...]) -> tuple[list[str], list[str]]:
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
    return chains, sets


class _Parser:
    def __init__(self, text: str, work: _Work) -> None:
        self.toks = tokenize(text)
        self.pos = 0
        self.work = work

    # --- token helpers ---------------------------------------------------------------------------

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

    def run(self) -> None:
        while True:
            self.skip_ends()
            if self.pos >= len(self.toks):
                return
            line = self.line
            start = self.pos
            try:
                self.command()
            except InputError as exc:
                if isinstance(exc, NftablesError) and exc.line is not None:
                    raise
                if exc.line is not None:
                    raise NftablesError(
                        str(exc).split(": ", 1)[1].rsplit(" (in ", 1)[0], line=exc.line, text=exc.text
                    ) from None
                text = " ".join(t.text for t in self.toks[start : self.pos + 1] if t.text != NEWLINE)
                msg = str(exc).split(" (in ")[0]
                here = self.toks[min(self.pos, len(self.toks)) - 1]
                if here.line != line:  # inside a block: the line where it failed, and its text
                    line = here.line
                    text = " ".join(t.text for t in self.toks if t.line == line and t.text != NEWLINE)
                raise NftablesError(msg, line=line, text=text[:200]) from None

    def command(self) -> None:
        word = self.take()
        if word == "table":
            self.table_block()
            return
        if word not in ("add", "create", "insert", "replace", "delete", "destroy", "flush"):
            raise InputError(
                f"unknown command {word!r}; expected table, add, insert, delete, destroy or flush"
            )
        what = self.take()
        if word == "flush" and what == "ruleset":
            self.work.tables.clear()
            return
        if what not in ("table", "chain", "rule", "set", "map", "element"):
            raise InputError(f"unknown object {what!r} after {word}")
        fam = self.family()
        tname = self.take()
        if what == "table":
            self.table_cmd(word, fam, tname)
            return
        table = self.work.tables.get((fam, tname))
        if table is None:
            if word == "destroy":
                self.upto_end()
                return
            raise InputError(f"no such table {fam} {tname}")
        name = self.take().strip('"')
        getattr(self, f"cmd_{what}")(word, table, name)

    def family(self) -> Family:
        if self.peek() in ("ip", "ip6", "inet"):
            return Family(self.take())
        return Family.IP  # nft's default family

    def table_cmd(self, word: str, fam: Family, name: str) -> None:
        tables = self.work.tables
        if word in ("delete", "destroy"):
            if (fam, name) not in tables and word == "delete":
                raise InputError(f"no such table {fam} {name}")
            tables.pop((fam, name), None)
            return
        table = tables.get((fam, name))
        if table is None:
            if word == "flush":
                raise InputError(f"no such table {fam} {name}")
            table = tables[(fam, name)] = _WTable(fam, name, None, {}, {}, 1)
        elif word == "create":
            raise InputError(f"table {fam} {name} exists already (create)")
        if word == "flush":
            for chain in table.chains.values():
                chain.rules.clear()
            for s in table.sets.values():
                s.elements.clear()
            return
        if self.peek() == "{":
            self.take()
            self.table_body(table, nested=False)

    def table_block(self) -> None:
        fam = self.family()
        name = self.take()
        table = self.work.tables.get((fam, name))
        if table is None:
            table = self.work.tables[(fam, name)] = _WTable(fam, name, None, {}, {}, 1)
        self.expect("{")
        self.table_body(table, nested=True)
        self.work.deferred.append((self.line, table))

    def table_body(self, table: _WTable, *, nested: bool) -> None:
        while True:
            self.skip_ends()
            word = self.take()
            if word == "}":
                return
            if word == "comment":
                table.comment = self.take().strip('"')
            elif word in ("set", "map") and nested:
                self.set_decl(table, self.take(), word == "map", create=False)
            elif word == "chain" and nested:
                self.chain_decl(table, self.take().strip('"'), nested=True)
            elif word == "flags":
                self.take()
            else:
                raise InputError(f"unexpected {word!r} in table {table.family} {table.name}")

    # --- chains and rules ------------------------------------------------------------------------

    def chain_decl(self, table: _WTable, name: str, *, nested: bool, create: bool = False) -> None:
        wc = table.chains.get(name)
        if wc is None:
            wc = table.chains[name] = _WChain(Chain(name=name))
            table.handle()
        elif create:
            raise InputError(f"chain {name} exists already (create)")
        if self.peek() != "{":
            return
        self.take()
        spec = wc.spec
        while True:
            self.skip_ends()
            word = self.peek()
            if word == "}":
                self.take()
                break
            if word == "type":
                self.take()
                ctype = ChainType(self.take())
                self.expect("hook")
                hook = NftHook(self.take())
                self.expect("priority")
                spec = replace(spec, type=ctype, hook=hook, priority=self.priority(hook))
            elif word == "policy":
                self.take()
                spec = replace(spec, policy=Policy(self.take()))
            elif word == "comment":
                self.take()
                spec = replace(spec, comment=self.take().strip('"'))
            elif nested:
                line = self.line
                self.add_rule(table, wc, self.upto_end(), line, check=False)
            else:
                raise InputError(f"unexpected {word!r} in chain {name}")
        wc.spec = spec

    def priority(self, hook: NftHook) -> int:
        word = self.take()
        value = PRIORITY_NAMES.get(word)
        if value is not None and not priority_name_fits(word, hook):
            raise InputError(f"priority {word} is invalid at hook {hook} (invalid priority expression value)")
        if value is None:
            try:
                value = int(word)
            except ValueError:
                raise InputError(
                    f"bad priority {word!r}; expected a number or one of {', '.join(PRIORITY_NAMES)}"
                ) from None
        if self.peek() in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            value += sign * int(self.take())
        return value

    def add_rule(
        self, table: _WTable, wc: _WChain, toks: list[Token], line: int, *, check: bool, at: int | None = None
    ) -> None:
        stmts, comment = ex.parse_stmts(toks, strict=self.work.strict)
        if check:
            self.check_refs(table, stmts)
        rule = Rule(handle=table.handle(), stmts=stmts, comment=comment, line=line)
        if at is None:
            wc.rules.append(rule)
        else:
            wc.rules.insert(at, rule)

    def check_refs(self, table: _WTable, stmts: tuple[ex.Stmt, ...]) -> None:
        chains, sets = _refs(stmts)
        for c in chains:
            if c not in table.chains:
                raise InputError(
                    f"no such chain {c!r} in table {table.family} {table.name}"
                    " (add it before a rule refers to it)"
                )
        for s in sets:
            if s not in table.sets:
                raise InputError(f"no such set @{s} in table {table.family} {table.name}")

    def cmd_chain(self, word: str, table: _WTable, name: str) -> None:
        if word in ("add", "create"):
            self.chain_decl(table, name, nested=False, create=word == "create")
            return
        wc = table.chains.get(name)
        if wc is None:
            if word == "destroy":
                return
            raise InputError(f"no such chain {name} in table {table.family} {table.name}")
        if word == "flush":
            wc.rules.clear()
            return
        for other in table.chains.values():
            for rule in other.rules:
                if other is not wc and name in _refs(rule.stmts)[0]:
                    raise InputError(
                        f"chain {name} is still jumped to from chain {other.spec.name} (EBUSY);"
                        " remove those rules first"
                    )
        for s in table.sets.values():
            if any(isinstance(e.data, Verdict) and e.data.chain == name for e in s.elements.values()):
                raise InputError(
                    f"chain {name} is still referenced by an element of map {s.spec.name} (EBUSY)"
                )
        del table.chains[name]

    def cmd_rule(self, word: str, table: _WTable, name: str) -> None:
        wc = table.chains.get(name)
        if wc is None:
            raise InputError(f"no such chain {name} in table {table.family} {table.name}")
        if word in ("delete", "destroy"):
            self.expect("handle")
            handle = int(self.take())
            kept = [r for r in wc.rules if r.handle != handle]
            if len(kept) == len(wc.rules) and word == "delete":
                raise InputError(f"no rule with handle {handle} in chain {name}")
            wc.rules[:] = kept
            return
        at: int | None = 0 if word == "insert" else None
        if self.peek() in ("position", "handle", "index"):
            kind = self.take()
            ref = int(self.take())
            if kind == "index":
                at = ref if word == "insert" else ref + 1
            else:
                idx = next((i for i, r in enumerate(wc.rules) if r.handle == ref), None)
                if idx is None:
                    raise InputError(f"no rule with handle {ref} in chain {name}")
                at = idx if word == "insert" else idx + 1
        line = self.line
        self.add_rule(table, wc, self.upto_end(), line, check=True, at=at)

    def cmd_set(self, word: str, table: _WTable, name: str) -> None:
        self.set_cmd(word, table, name, is_map=False)

    def cmd_map(self, word: str, table: _WTable, name: str) -> None:
        self.set_cmd(word, table, name, is_map=True)

    def set_cmd(self, word: str, table: _WTable, name: str, *, is_map: bool) -> None:
        if word in ("add", "create"):
            self.set_decl(table, name, is_map, create=word == "create")
            return
        ws = table.sets.get(name)
        if ws is None:
            if word == "destroy":
                return
            raise InputError(
                f"no such {'map' if is_map else 'set'} {name} in table {table.family} {table.name}"
            )
        if word == "flush":
            ws.elements.clear()
            return
        for chain in table.chains.values():
            for rule in chain.rules:
                if name in _refs(rule.stmts)[1]:
                    raise InputError(f"set {name} is still used by a rule in chain {chain.spec.name} (EBUSY)")
        del table.sets[name]

    # --- sets, maps and elements -----------------------------------------------------------------

    def set_decl(self, table: _WTable, name: str, is_map: bool, *, create: bool) -> None:
        existing = table.sets.get(name)
        if existing is not None and create:
            raise InputError(f"set {name} exists already (create)")
        self.expect("{")
        spec = existing.spec if existing else None
        keys: tuple[str, ...] = spec.key_types if spec else ()
        data = spec.data_type if spec else None
        flags: set[SetFlag] = set(spec.flags) if spec else set()
        timeout = spec.timeout_s if spec else None
        size = spec.size if spec else None
        comment = spec.comment if spec else None
        pending: list[Token] | None = None
        while True:
            self.skip_ends()
            word = self.take()
            if word == "}":
                break
            if word == "type":
                parts = [self.take()]
                while self.peek() == ".":
                    self.take()
                    parts.append(self.take())
                keys = tuple(parts)
                if self.peek() == ":":
                    self.take()
                    dparts = [self.take()]
                    while self.peek() == ".":
                        self.take()
                        dparts.append(self.take())
                    data = " . ".join(dparts)
            elif word == "flags":
                flags.add(SetFlag(self.take()))
                while self.peek() == ",":
                    self.take()
                    flags.add(SetFlag(self.take()))
            elif word == "timeout":
                timeout = parse_duration(self.take())
            elif word == "size":
                size = int(self.take())
            elif word == "comment":
                comment = self.take().strip('"')
            elif word == "elements":
                self.expect("=")
                start = self.pos
                self.skip_braces()
                pending = self.toks[start : self.pos]
            elif word in ("policy", "gc-interval"):
                self.take()
            elif word == "auto-merge":
                pass
            else:
                raise InputError(f"unexpected {word!r} in set {name}")
        if not keys:
            raise InputError(f"set {name} has no type")
        for k in keys:
            if k not in ex.SELECTORS.values() and k not in (
                "ipv4_addr",
                "ipv6_addr",
                "inet_proto",
                "inet_service",
                "mark",
                "ifname",
                "integer",
            ):
                raise InputError(f"unknown set key type {k!r} in set {name}")
        if is_map and data is None:
            raise InputError(f"map {name} has no data type (type KEY : DATA)")
        if SetFlag.DYNAMIC in flags and size is None:
            size = 65535  # nft gives a dynamic set this default size (NFT_SET_MAXSIZE-like listing)
        new = TableSet(
            name=name,
            key_types=keys,
            data_type=data,
            flags=frozenset(flags),
            timeout_s=timeout,
            size=size,
            comment=comment,
        )
        if existing is None:
            table.handle()
            existing = table.sets[name] = _WSet(new)
        existing.spec = new
        if pending is not None:
            self.elements(table, existing, pending, add=True, check=False)

    def skip_braces(self) -> None:
        depth = 0
        while True:
            t = self.take()
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0:
                    return

    def cmd_element(self, word: str, table: _WTable, name: str) -> None:
        ws = table.sets.get(name)
        if ws is None:
            raise InputError(f"no such set or map {name} in table {table.family} {table.name}")
        start = self.pos
        self.skip_braces()
        self.elements(
            table,
            ws,
            self.toks[start : self.pos],
            add=word in ("add", "create"),
            check=True,
            missing_ok=word == "destroy",
        )

    def elements(
        self,
        table: _WTable,
        ws: _WSet,
        toks: list[Token],
        *,
        add: bool,
        check: bool,
        missing_ok: bool = False,
    ) -> None:
        s = ex._Stream([t for t in toks if t.text != NEWLINE][1:-1])
        spec = ws.spec
        while not s.done:
            key = tuple(
                ex._value(k, v)
                for k, v in zip(spec.key_types, self._concat(s, len(spec.key_types)), strict=True)
            )
            comment = None
            timeout = spec.timeout_s
            while s.peek() in ("comment", "timeout", "expires", "counter"):
                w = s.take()
                if w == "comment":
                    comment = s.take().strip('"')
                elif w == "timeout":
                    timeout = parse_duration(s.take())
                elif w == "expires":
                    s.take()
            datum: Datum | None = None
            if s.peek() == ":":
                s.take()
                datum = self._datum(s, spec)
            if s.peek() == ",":
                s.take()
            if add:
                if spec.is_map and datum is None:
                    raise InputError(f"an element of map {spec.name} needs ': DATA'")
                if (
                    check
                    and isinstance(datum, Verdict)
                    and datum.chain is not None
                    and datum.chain not in table.chains
                ):
                    raise InputError(f"no such chain {datum.chain!r} for an element of map {spec.name}")
                ws.elements[key] = Element(
                    key=key, data=datum, comment=comment, expires_s=None if timeout is None else timeout
                )
            elif key in ws.elements:
                del ws.elements[key]
            elif not missing_ok:
                raise InputError(f"no such element in set {spec.name} (delete element)")

    @staticmethod
    def _concat(s: ex._Stream, n: int) -> list[str]:
        parts = [s.take()]
        for _ in range(n - 1):
            s.expect(".")
            parts.append(s.take())
        return parts

    @staticmethod
    def _datum(s: ex._Stream, spec: TableSet) -> Datum:
        assert spec.data_type is not None
        if spec.data_type == "verdict":
            return ex._verdict(s)
        kinds = spec.data_type.split(" . ")
        return tuple(parse_key(k, v) for k, v in zip(kinds, _Parser._concat(s, len(kinds)), strict=True))


def _check_deferred(work: _Work) -> None:
    for line, table in work.deferred:
        if work.tables.get((table.family, table.name)) is not table:
            continue
        for wc in table.chains.values():
            for rule in wc.rules:
                chains, sets = _refs(rule.stmts)
                for c in chains:
                    if c not in table.chains:
                        raise NftablesError(
                            f"no such chain {c!r} in table {table.family} {table.name}",
                            line=rule.line or line,
                        )
                for name in sets:
                    if name not in table.sets:
                        raise NftablesError(
                            f"no such set @{name} in table {table.family} {table.name}",
                            line=rule.line or line,
                        )
        for ws in table.sets.values():
            for e in ws.elements.values():
                if (
                    isinstance(e.data, Verdict)
                    and e.data.chain is not None
                    and e.data.chain not in table.chains
                ):
                    raise NftablesError(
                        f"no such chain {e.data.chain!r} for an element of map {ws.spec.name}", line=line
                    )
    for table in work.tables.values():
        for wc in table.chains.values():
            if wc.spec.type == ChainType.NAT and wc.spec.hook == NftHook.FORWARD:
                raise NftablesError(f"chain {wc.spec.name}: a nat chain cannot hook forward (EOPNOTSUPP)")


def apply(ruleset: Ruleset, text: str, *, strict: bool = True) -> Ruleset:
    """Apply an ``nft -f`` transaction (block or command form) to ``ruleset``: a new ruleset.

    Atomic: on error ``ruleset`` is untouched (it is immutable) and nothing is returned.

    Raises:
        NftablesError: bad syntax, a missing table, chain or set, a chain still referenced,
            or (``strict``) an expression this model does not know; the message starts with
            ``line N:``. As nf_tables_api.c aborts a batch.
    """
    work = _Work(ruleset, strict)
    try:
        _Parser(text, work).run()
        _check_deferred(work)
    except NftablesError:
        raise
    except (InputError, ValueError) as exc:
        raise NftablesError(str(exc)) from None
    return work.freeze()


def load(text: str, *, strict: bool = True) -> Ruleset:
    """A ruleset from ``nft list ruleset`` output or an ``nft -f`` script (see :func:`apply`)."""
    return apply(Ruleset(), text, strict=strict)


_ = (VerdictKind,)
