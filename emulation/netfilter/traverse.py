"""Walking one chain of one table, as ``ipt_do_table`` does (net/ipv4/netfilter/ip_tables.c).

Rules are tried in order; a rule matches when its basic matches and then its modules all
hold (the first that fails stops: later modules, and their side effects, are skipped). A
matching rule counts its packet and runs its target: a verdict ends the walk, a jump
descends, a goto replaces the current chain, RETURN (or falling off the end) goes back to the
caller, and a built-in chain then applies its policy. A match that evaluates to "unknown"
makes the rule not taken, flags the outcome as uncertain and shows in the trace.

Two walks share these semantics. The plain walk tests every rule's match values as written
(``Match.test``) and is the one that traces. The indexed walk, used when tracing is off,
runs each chain's compiled rules (see :mod:`emulation.netfilter.compile`) and only the
candidates its index gives for the packet; the rules it leaves out are ones whose match is
known to fail, and the kernel counts only matched rules, so its verdicts, counters and side
effects are exactly those of the plain walk (an equivalence property tests this).

While the flow cache records a path (``ctx.rec``, see :mod:`emulation.netfilter.flowcache`),
both walks tell the recorder what each tested rule reads and which targets ran.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from emulation.errors import NetfilterError
from emulation.netfilter import flowcache
from emulation.netfilter.compile import APPLY, COUNT, GOTO, JUMP, MIN_INDEXED, VERDICT, target_code
from emulation.netfilter.context import Ctx, TraceStep
from emulation.netfilter.rules import Chain, Table
from emulation.netfilter.targets import CONTINUE, Verdict

__all__ = ["run_chain"]

MAX_DEPTH = 64
_Walk = Callable[[Ctx, Table, Chain, int], "str | None"]


def run_chain(ctx: Ctx, table: Table, chain: Chain) -> str:
    """Run built-in ``chain`` of ``table``: return ACCEPT, DROP or REJECT (policy included)."""
    verdict = (
        _walk(ctx, table, chain, 0) if ctx.tracing or not ctx.indexed else _walk_indexed(ctx, table, chain, 0)
    )
    if verdict is None or verdict == "RETURN":
        ctx.policy_hits.append((table.name, chain.name, ctx.length))
        policy = chain.policy or "ACCEPT"
        if ctx.tracing:
            ctx.trace.append(
                TraceStep(
                    hook=ctx.hook,
                    table=table.name,
                    chain=chain.name,
                    index=0,
                    line=0,
                    rule=f":{chain.name} {policy}",
                    result="policy",
                    target=policy,
                )
            )
        return policy
    return verdict


def _walk_indexed(ctx: Ctx, table: Table, chain: Chain, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        raise NetfilterError(f"chain nesting deeper than {MAX_DEPTH} at {table.name}/{chain.name}: a loop?")
    compiled = chain._compiled
    if compiled is None and len(chain.rules) < MIN_INDEXED and (not chain._seen or not ctx.compile_short):
        # A short chain's first visit walks it as written (compiling costs about as much as
        # one walk, and at 10,000 Services most chains are met once); the next one compiles.
        # A new flow's walk with the flow cache on never compiles one: its path is replayed
        # from then on, and compiled chains only add work for the garbage collector.
        if ctx.compile_short:
            object.__setattr__(chain, "_seen", True)
        return _walk(ctx, table, chain, depth, _walk_indexed)
    if compiled is None:
        compiled = chain.compiled()
    seq = compiled.rules
    if seq is None:
        seq = compiled.candidates(ctx)
    hits = ctx.hits
    rec = ctx.rec
    if rec is not None and compiled.index is not None and compiled.index.kind == "dport":
        rec.read(flowcache.DPORT)
    for uid, test, code, arg, deps in seq:
        if rec is not None and deps is not flowcache.NOTHING:
            rec.rule(deps)
        if test is not None:
            res = test(ctx)
            if res is not True:
                if res is None:
                    ctx.uncertain = True
                continue
        hits.append(uid)
        if code == JUMP:
            sub = _walk_indexed(ctx, table, table.chains[arg], depth + 1)  # type: ignore[index]
            if sub is None or sub == "RETURN":
                continue
            return sub
        if code == VERDICT:
            return arg  # type: ignore[return-value]
        if code == COUNT:
            continue
        if code == GOTO:
            sub = _walk_indexed(ctx, table, table.chains[arg], depth + 1)  # type: ignore[index]
            return None if sub is None or sub == "RETURN" else sub
        assert code == APPLY
        if rec is not None:
            rec.op(flowcache.APPLY, arg)
        verdict: Verdict = arg(ctx)  # type: ignore[operator]
        if verdict == CONTINUE:
            continue
        if isinstance(verdict, tuple):
            kind, name = verdict
            sub = _walk_indexed(ctx, table, table.chains[name], depth + 1)
            if kind == "GOTO":
                return None if sub in (None, "RETURN") else sub
            if sub is None or sub == "RETURN":
                continue
            return sub
        return verdict
    return None


def _walk(
    ctx: Ctx,
    table: Table,
    chain: Chain,
    depth: int,
    descend: _Walk | None = None,
    positions: Sequence[int] | None = None,
) -> str | None:
    """The plain walk: the rules at ``positions`` (default: every rule) as written; traces when
    asked to. Jumps go to ``descend`` (default: this walk)."""
    sub_walk = descend or _walk
    if depth > MAX_DEPTH:
        raise NetfilterError(f"chain nesting deeper than {MAX_DEPTH} at {table.name}/{chain.name}: a loop?")
    rules = chain.rules
    rec = ctx.rec
    for i in range(len(rules)) if positions is None else positions:
        rule = rules[i]
        uid = rule.uid
        if rec is not None:
            deps = rule.deps()
            if deps is not flowcache.NOTHING:
                rec.rule(deps)
        res: bool | None = True
        for m in rule.basic:
            res = m.test(ctx, uid)
            if res is not True:
                break
        else:
            for m in rule.matches:
                res = m.test(ctx, uid)
                if res is not True:
                    break
        if res is not True:
            if res is None:
                ctx.uncertain = True
            if ctx.tracing:
                _trace(ctx, table, chain, i, "unknown" if res is None else "nomatch", "")
            continue
        ctx.hits.append(uid)
        target = rule.target
        if target is None:
            if ctx.tracing:
                _trace(ctx, table, chain, i, "match", "")
            continue
        if rec is not None:
            code, arg = target_code(target)
            if code == APPLY:
                rec.op(flowcache.APPLY, arg)
        verdict = target.apply(ctx)
        if ctx.tracing:
            _trace(ctx, table, chain, i, "match", target.label)
        if verdict == CONTINUE:
            continue
        if isinstance(verdict, tuple):
            kind, name = verdict
            sub = sub_walk(ctx, table, table.chains[name], depth + 1)
            if kind == "GOTO":
                return None if sub in (None, "RETURN") else sub
            if sub is None or sub == "RETURN":
                continue
            return sub
        return verdict
    return None


def _trace(ctx: Ctx, table: Table, chain: Chain, i: int, result: str, target: str) -> None:
    rule = chain.rules[i]
    ctx.trace.append(
        TraceStep(
            hook=ctx.hook,
            table=table.name,
            chain=chain.name,
            index=i + 1,
            line=rule.line,
            rule=rule.text(),
            result=result,
            target=target,
        )
    )
