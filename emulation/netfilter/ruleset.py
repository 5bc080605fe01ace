"""Applying ``iptables-restore`` input to a ruleset atomically, and printing ``iptables-save``.

``apply_restore`` follows iptables-restore (iptables/iptables-restore.c, xtables-restore.c):
without ``--noflush`` every table named in the input is first emptied (user chains deleted,
built-in chains flushed, policies back to ACCEPT); with it, a ``:CHAIN`` line creates or
flushes a user chain and only sets the policy of a built-in chain (its rules stay, as the
kernel here shows). Any error raises :class:`NetfilterError` naming the line, and since
rulesets are immutable the caller's state is untouched.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from emulation.errors import NetfilterError
from emulation.netfilter.counters import Counters
from emulation.netfilter.hooks import Hook
from emulation.netfilter.matches import ProtoMatch
from emulation.netfilter.parse import Command, Line, iter_commands, parse_rule
from emulation.netfilter.rules import (
    BUILTIN_CHAINS,
    TABLE_ORDER,
    Chain,
    Rule,
    Ruleset,
    Table,
    chain_order,
    new_uid,
)
from emulation.netfilter.target_options import check_protocol
from emulation.netfilter.targets import Jump, Masquerade, Nat, Redirect, Reject

__all__ = ["Counters", "apply_restore", "load", "save"]


@dataclass(slots=True)
class _Draft:
    """A chain being edited by a transaction (rules as a list; made a Chain at the end)."""

    name: str
    policy: str | None
    rules: list[Rule]
    counters: tuple[int, int]

    def freeze(self) -> Chain:
        return Chain(self.name, self.policy, tuple(self.rules), self.counters)


class _Tx:
    """A restore transaction: copy-on-write views of the tables it touches.

    Untouched chains stay the same :class:`Chain` objects (their index is reused); a chain
    that is edited becomes a :class:`_Draft` until the transaction ends.
    """

    def __init__(self, state: Ruleset, strict: bool, counters: bool) -> None:
        self.version = state.version
        self.tables: dict[str, dict[str, Chain | _Draft]] = {
            n: dict(t.chains) for n, t in state.tables.items()
        }
        self.strict = strict
        self.counters = counters
        #: Tables a line of this restore named (only they get the hook check at the end).
        self.touched: set[str] = set()
        #: Rules created by this restore have a larger uid (their input line is known).
        self.first_uid = new_uid()

    def chains(self, table: str) -> dict[str, Chain | _Draft]:
        if table not in self.tables:
            self.tables[table] = dict(Table.empty(table).chains)
        return self.tables[table]

    def draft(self, table: str, name: str) -> _Draft:
        chains = self.tables[table]
        c = chains[name]
        if isinstance(c, Chain):
            c = _Draft(c.name, c.policy, list(c.rules), c.counters)
            chains[name] = c
        return c

    def freeze(self, table: str) -> Table:
        return Table(
            table, {n: c.freeze() if isinstance(c, _Draft) else c for n, c in self.tables[table].items()}
        )


def _fail(line: Line | Command, message: str) -> NetfilterError:
    return NetfilterError(message, line=line.number, text=line.text)


def _references(chains: dict[str, Chain | _Draft], name: str) -> list[str]:
    return [
        c.name
        for c in chains.values()
        for r in c.rules
        if isinstance(r.target, Jump) and r.target.chain == name
    ]


def _apply_line(tx: _Tx, line: Line | Command, noflush: bool) -> None:
    tx.touched.add(line.table)
    if line.kind == "rule":
        _apply_rule(tx, line)
        return
    if line.kind == "table":
        chains = tx.chains(line.table)
        if not noflush:
            chains.clear()
            chains.update(Table.empty(line.table).chains)
        return
    if line.kind == "commit":
        return
    chains = tx.chains(line.table)
    builtin = BUILTIN_CHAINS[line.table]
    counters = line.counters if tx.counters else (0, 0)
    if line.kind == "chain":
        policy = line.words[0]
        if line.chain in builtin:
            if policy not in ("ACCEPT", "DROP"):
                raise _fail(line, f"built-in chain {line.chain} needs policy ACCEPT or DROP, not {policy!r}")
            d = tx.draft(line.table, line.chain)
            d.policy, d.counters = policy, counters
        else:
            if policy != "-":
                raise _fail(line, f"user chain {line.chain} cannot have a policy ({policy!r}); write '-'")
            chains[line.chain] = _Draft(line.chain, None, [], counters)
        return
    if line.kind == "new":
        if line.chain in chains:
            raise _fail(line, f"chain {line.chain} already exists")
        chains[line.chain] = _Draft(line.chain, None, [], (0, 0))
        return
    if line.kind == "policy":
        if line.chain not in builtin or line.words[0] not in ("ACCEPT", "DROP"):
            raise _fail(line, "-P needs a built-in chain and ACCEPT or DROP")
        tx.draft(line.table, line.chain).policy = line.words[0]
        return
    if line.kind in ("flush", "delete"):
        names = [line.chain] if line.chain else list(chains)
        for name in names:
            if name not in chains:
                raise _fail(line, f"no chain {name!r} in table {line.table}")
            if line.kind == "flush":
                tx.draft(line.table, name).rules.clear()
            elif line.chain or name not in builtin:
                if name in builtin:
                    raise _fail(line, f"cannot delete built-in chain {name}")
                if chains[name].rules and line.chain:
                    raise _fail(line, f"cannot delete chain {name}: it is not empty (flush it first)")
                refs = [r for r in _references(chains, name) if r != name or line.chain]
                if refs and (line.chain or any(r not in names for r in refs)):
                    raise _fail(
                        line, f"cannot delete chain {name}: still referenced from {sorted(set(refs))}"
                    )
        if line.kind == "delete":
            for name in names:
                if name not in builtin:
                    del chains[name]
        return


#: Targets whose options the kernel or iptables checks against the rule's ``-p``.
_PROTOCOL_TARGETS = frozenset({Reject, Nat, Masquerade, Redirect})


def _check_protocol(rule: Rule, version: int) -> None:
    """``check_protocol`` for the rule's target and its ``[!] -p`` (load validation)."""
    proto = next((m for m in rule.basic if isinstance(m, ProtoMatch)), None)
    check_protocol(rule.target, proto.proto if proto else None, proto.negated if proto else False, version)


def _apply_rule(tx: _Tx, line: Line | Command) -> None:
    chains = tx.chains(line.table)
    builtin = BUILTIN_CHAINS[line.table]
    counters = line.counters if tx.counters else (0, 0)
    if line.chain not in chains:
        raise _fail(
            line, f"no chain {line.chain!r} in table {line.table} (declare it with :{line.chain} - [0:0])"
        )
    try:
        rule = parse_rule(
            line.chain,
            line.words,
            table=line.table,
            version=tx.version,
            strict=tx.strict,
            is_chain=lambda n: n in chains and n not in builtin,
            line=line.number,
            counters=counters,
        )
        if line.op != "-D" and type(rule.target) in _PROTOCOL_TARGETS:
            _check_protocol(rule, tx.version)
    except NetfilterError as e:
        raise _fail(line, str(e)) from None
    rules = tx.draft(line.table, line.chain).rules
    if line.op == "-A":
        rules.append(rule)
    elif line.op == "-I":
        pos = (line.position or 1) - 1
        if pos > len(rules):
            raise _fail(
                line, f"cannot insert at position {pos + 1}: chain {line.chain} has {len(rules)} rules"
            )
        rules.insert(pos, rule)
    else:
        if line.position is not None:
            if line.position > len(rules):
                raise _fail(line, f"no rule {line.position} in chain {line.chain} ({len(rules)} rules)")
            del rules[line.position - 1]
        else:
            spec = rule.spec()
            for i, r in enumerate(rules):
                if r.spec() == spec:
                    del rules[i]
                    break
            else:
                raise _fail(line, f"no rule '{spec}' in chain {line.chain} to delete")


#: Netfilter hooks in their kernel order (``NF_INET_PRE_ROUTING`` = 0 ... ``NF_INET_POST_ROUTING``).
_HOOKS = tuple(h.value for h in Hook)
_HOOK_BIT = {h: 1 << i for i, h in enumerate(_HOOKS)}
_PRE, _IN, _FWD, _OUT, _POST = (1 << i for i in range(5))

#: ``.hooks`` of the targets that have one (xt_nat.c, xt_MASQUERADE.c, xt_REDIRECT.c,
#: ipt_REJECT.c / ip6t_REJECT.c); every other target may be used from any hook.
_TARGET_HOOKS: dict[type, int] = {Masquerade: _POST, Redirect: _PRE | _OUT, Reject: _IN | _FWD | _OUT}
_NAT_HOOKS = {"SNAT": _POST | _IN, "DNAT": _PRE | _OUT}
_ALL = (1 << len(_HOOKS)) - 1


def _hook_names(mask: int) -> str:
    return "/".join(h for h in _HOOKS if mask & _HOOK_BIT[h])


def _check_hooks(tx: _Tx, table: str, text: str) -> None:
    """Refuse a rule whose target is not usable from a hook it can be reached from.

    As the kernel at table load: ``mark_source_chains`` (ip_tables.c, ip6_tables.c) gives each
    chain the set of built-in hooks it is reachable from through ``-j``/``-g`` (transitively;
    a user chain reachable from none has an empty set), and ``xt_check_target`` (x_tables.c)
    refuses a target with ``.hooks`` when that set is not inside them. One pass over the rules
    finds the jumps and such targets; the graph is then walked from a built-in chain only when
    some target in the table is refused from its hook (the exact masks are computed only to
    word the error).
    """
    chains = tx.tables[table]
    edges: dict[str, list[str]] = {}
    groups: dict[int, set[str]] = {}  # allowed hooks -> chains holding such a target
    nat, jump, hooks_of, nat_hooks = Nat, Jump, _TARGET_HOOKS, _NAT_HOOKS
    for name, chain in chains.items():
        out: list[str] | None = None
        for r in chain.rules:
            t = r.target
            tt = type(t)
            if tt is jump:
                if out is None:
                    out = edges[name] = []
                out.append(t.chain)  # type: ignore[union-attr]
            elif tt is nat or tt in hooks_of:
                allowed = nat_hooks.get(t.kind, _ALL) if tt is nat else hooks_of[tt]  # type: ignore[union-attr]
                group = groups.get(allowed)
                if group is None:
                    group = groups[allowed] = set()
                group.add(name)
    # Hooks from which the same targets are refused share one walk (nat's PREROUTING and
    # OUTPUT both reach all of kube-proxy's chains): any refused chain reached means an error.
    starts: dict[tuple[int, ...], list[str]] = {}
    for hook in BUILTIN_CHAINS[table]:
        refused = tuple(allowed for allowed in groups if not allowed & _HOOK_BIT[hook])
        if refused:  # else every restricted target here is usable from this hook: no walk
            starts.setdefault(refused, []).append(hook)
    for refused, hooks in starts.items():
        seen = _walk(edges, hooks)
        if any(not seen.isdisjoint(groups[allowed]) for allowed in refused):
            _refuse(tx, table, edges, text)


def _walk(edges: dict[str, list[str]], starts: list[str]) -> set[str]:
    """The chains reachable from ``starts`` (themselves included) through ``edges``."""
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        e = edges.get(name)
        if e:
            stack.extend(e)
    return seen


def _refuse(tx: _Tx, table: str, edges: dict[str, list[str]], text: str) -> None:
    """Raise for the first (by input line) rule refused by the hook check (the slow path)."""
    chains = tx.tables[table]
    masks: dict[str, int] = {}
    for hook in BUILTIN_CHAINS[table]:
        for name in _walk(edges, [hook]):
            masks[name] = masks.get(name, 0) | _HOOK_BIT[hook]
    bad: list[tuple[Rule, int, int]] = []
    for name, used in masks.items():
        chain = chains.get(name)
        for r in chain.rules if chain is not None else ():
            t = r.target
            if type(t) is Nat or type(t) in _TARGET_HOOKS:
                allowed = _NAT_HOOKS.get(t.kind, _ALL) if isinstance(t, Nat) else _TARGET_HOOKS[type(t)]
                if used & ~allowed:
                    bad.append((r, used, allowed))
    rule, used, allowed = min(bad, key=lambda b: b[0].line)
    target = rule.target
    tname = target.kind if isinstance(target, Nat) else target.name if target is not None else ""
    prefix = "ip" if tx.version == 4 else "ip6"
    message = (
        f"{prefix}_tables: {tname} target: used from hooks {_hook_names(used)}, "
        f"but only usable from {_hook_names(allowed)} (table {table}, chain {rule.chain})"
    )
    if rule.uid > tx.first_uid and 0 < rule.line <= text.count("\n") + 1:
        raise NetfilterError(message, line=rule.line, text=text.splitlines()[rule.line - 1])
    raise NetfilterError(message + " (a rule loaded earlier)", line=rule.line or None, text=rule.text())


def apply_restore(
    state: Ruleset,
    text: str,
    *,
    noflush: bool = False,
    strict: bool = False,
    counters: bool = False,
) -> Ruleset:
    """Apply ``iptables-restore [--noflush] [--counters]`` input; return the new ruleset.

    Args:
        state: the current ruleset (never modified).
        text: restore input.
        noflush: ``--noflush`` semantics (see the module docstring).
        strict: refuse match modules and targets the emulator does not model.
        counters: ``--counters``: take ``[p:b]`` from the input (else they start at 0).

    Raises:
        NetfilterError: naming the failing line; ``state`` stays valid and unchanged.
    """
    with _gc_paused(large=len(text) >= _LARGE_INPUT_CHARS):
        tx = _Tx(state, strict, counters)
        for line in iter_commands(text):
            _apply_line(tx, line, noflush)
        for table in TABLE_ORDER:
            if table in tx.touched and table in tx.tables:
                _check_hooks(tx, table, text)
        return Ruleset(state.version, {n: tx.freeze(n) for n in TABLE_ORDER if n in tx.tables})


#: An input this long (about 50,000 rules) makes enough objects to be worth a collection.
_LARGE_INPUT_CHARS = 4_000_000


@contextmanager
def _gc_paused(*, large: bool) -> Iterator[None]:
    """Pause the cyclic garbage collector while a ruleset is built.

    A large restore allocates millions of objects that all live on (rules, matches, chains);
    each automatic collection on the way would walk every one of them again, which made a
    430,000-line load take about a third longer. The collector resumes (if it was on) when the
    restore returns or fails. After a ``large`` one, a single full collection moves the new
    objects to the oldest generation at once; left to itself the collector would walk them
    three times (young, middle, old) during the first packets instead.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
            if large:
                gc.collect()
                # The ruleset lives on: keep later collections from walking its millions of
                # objects again and again (that roughly halved new-flow throughput at 10,000
                # Services). Frozen objects are still freed by reference counting.
                gc.freeze()


def load(text: str, *, version: int = 4, strict: bool = False) -> Ruleset:
    """Parse an ``iptables-save`` dump (with or without ``-c``) into a ruleset, keeping counters."""
    return apply_restore(Ruleset(version), text, strict=strict, counters=True)


def save(state: Ruleset, *, counters: bool = False, live: Counters | None = None) -> str:
    """Print the ruleset as ``iptables-save`` (``-c`` with ``counters=True``) does, minus its
    ``# Generated`` comments: tables in the nf_tables backend's order, built-in chains then
    user chains by name, every rule canonical. ``live`` adds packet counts seen since load.
    """
    live = live or Counters()
    out: list[str] = []
    for tname in TABLE_ORDER:
        table = state.tables.get(tname)
        if table is None:
            continue
        out.append(f"*{tname}")
        order = chain_order(table)
        for name in order:
            chain = table.chains[name]
            p, b = live.policy(tname, chain) if chain.builtin and counters else (0, 0)
            out.append(f":{name} {chain.policy or '-'} [{p}:{b}]")
        for name in order:
            for rule in table.chains[name].rules:
                if counters:
                    p, b = live.rule(rule)
                    out.append(f"[{p}:{b}] {rule.text()}")
                else:
                    out.append(rule.text())
        out.append("COMMIT")
    return "\n".join(out) + "\n" if out else ""
