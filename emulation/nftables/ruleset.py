"""Loading nft input into a :class:`~.model.Ruleset`: ``nft -f`` scripts in the block form
(``table ip t { chain c { ... } }``) and the command form (``add rule ip t c ...``), as
kube-proxy's knftables writes its transactions, and ``nft list ruleset`` output.

Theory of operation: a transaction works on a mutable copy (:class:`~.work.Work`) of the ruleset
and is frozen into a new :class:`Ruleset` only when the whole input was accepted, as the
kernel commits or aborts a netlink batch whole (``nf_tables_commit`` / ``nf_tables_abort`` in
net/netfilter/nf_tables_api.c). An error names the input line. References to chains and sets
inside a ``table { ... }`` block are resolved when the transaction ends (nft's block form); a
command-form rule or element must name a chain or set that exists already, as nft 1.0.6
requires. A chain still jumped to cannot be deleted (``EBUSY``). Rule handles come from a
per-table counter shared with chains and sets (``table->hgenerator``).
"""

from __future__ import annotations

from dataclasses import replace

from emulation.errors import InputError
from emulation.nftables import exprs as ex
from emulation.nftables import rule_parse as rp
from emulation.nftables.model import Chain, ChainType, Family, NftablesError, NftHook, Policy, Rule, Ruleset
from emulation.nftables.sets import SetCommands
from emulation.nftables.tokens import NEWLINE, Token
from emulation.nftables.types import Verdict
from emulation.nftables.work import (
    PRIORITY_NAMES,
    WChain,
    Work,
    WTable,
    parse_duration,
    priority_name_fits,
    refs,
)

__all__ = ["PRIORITY_NAMES", "apply", "load", "parse_duration", "priority_name_fits"]


class _Parser(SetCommands):
    """The transaction parser: tables, chains, rules (sets: :class:`SetCommands`)."""

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
            table = tables[(fam, name)] = WTable(fam, name, None, {}, {}, 1)
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
            table = self.work.tables[(fam, name)] = WTable(fam, name, None, {}, {}, 1)
        self.expect("{")
        self.table_body(table, nested=True)
        self.work.deferred.append((self.line, table))

    def table_body(self, table: WTable, *, nested: bool) -> None:
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

    def chain_decl(self, table: WTable, name: str, *, nested: bool, create: bool = False) -> None:
        if ":" in name:
            raise InputError(f"chain name {name!r} has a ':' (nft reads a colon; kube-proxy writes '.')")
        wc = table.chains.get(name)
        if wc is None:
            wc = table.chains[name] = WChain(Chain(name=name))
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
        self, table: WTable, wc: WChain, toks: list[Token], line: int, *, check: bool, at: int | None = None
    ) -> None:
        stmts, comment = rp.parse_stmts(toks, strict=self.work.strict)
        if check:
            self.checkrefs(table, stmts)
        rule = Rule(handle=table.handle(), stmts=stmts, comment=comment, line=line)
        if at is None:
            wc.rules.append(rule)
        else:
            wc.rules.insert(at, rule)

    def checkrefs(self, table: WTable, stmts: tuple[ex.Stmt, ...]) -> None:
        chains, sets = refs(stmts)
        for c in chains:
            if c not in table.chains:
                raise InputError(
                    f"no such chain {c!r} in table {table.family} {table.name}"
                    " (add it before a rule refers to it)"
                )
        for s in sets:
            if s not in table.sets:
                raise InputError(f"no such set @{s} in table {table.family} {table.name}")

    def cmd_chain(self, word: str, table: WTable, name: str) -> None:
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
                if other is not wc and name in refs(rule.stmts)[0]:
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

    def cmd_rule(self, word: str, table: WTable, name: str) -> None:
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


def _dynset_sizes(work: Work) -> None:
    """A set this transaction created without ``size`` that a rule updates from the packet
    path gets size 65535, as nft's evaluation of a dynset gives it (and lists it)."""
    for table in work.tables.values():
        for wc in table.chains.values():
            for rule in wc.rules:
                for st in rule.stmts:
                    if not isinstance(st, ex.SetUpdate):
                        continue
                    ws = table.sets.get(st.set_name)
                    created = (table.family, table.name, st.set_name) in work.created_sets
                    if ws is not None and created and ws.spec.size is None:
                        ws.spec = replace(ws.spec, size=65535)


def _check_deferred(work: Work) -> None:
    for line, table in work.deferred:
        if work.tables.get((table.family, table.name)) is not table:
            continue
        for wc in table.chains.values():
            for rule in wc.rules:
                chains, sets = refs(rule.stmts)
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
    work = Work(ruleset, strict)
    try:
        _Parser(text, work).run()
        _check_deferred(work)
        _dynset_sizes(work)
    except NftablesError:
        raise
    except (InputError, ValueError) as exc:
        raise NftablesError(str(exc)) from None
    return work.freeze()


def load(text: str, *, strict: bool = True) -> Ruleset:
    """A ruleset from ``nft list ruleset`` output or an ``nft -f`` script (see :func:`apply`)."""
    return apply(Ruleset(), text, strict=strict)
