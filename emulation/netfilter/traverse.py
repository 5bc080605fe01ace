"""Walking one chain of one table, as ``ipt_do_table`` does (net/ipv4/netfilter/ip_tables.c).

Rules are tried in order; a rule matches when its basic matches and then its modules all
hold (the first that fails stops: later modules, and their side effects, are skipped). A
matching rule counts its packet and runs its target: a verdict ends the walk, a jump
descends, a goto replaces the current chain, RETURN (or falling off the end) goes back to the
caller, and a built-in chain then applies its policy. A match that evaluates to "unknown"
makes the rule not taken, flags the outcome as uncertain and shows in the trace.

Without tracing, a chain's index (see ``ChainIndex``) skips rules that cannot match the
packet's destination; those rules would fail their basic match before any module runs, so
verdicts, counters and side effects are exactly those of the full walk.
"""

from __future__ import annotations

from emulation.errors import NetfilterError
from emulation.netfilter.context import Ctx, TraceStep
from emulation.netfilter.rules import Chain, Table
from emulation.netfilter.targets import CONTINUE

__all__ = ["run_chain"]

MAX_DEPTH = 64


def run_chain(ctx: Ctx, table: Table, chain: Chain) -> str:
    """Run built-in ``chain`` of ``table``: return ACCEPT, DROP or REJECT (policy included)."""
    verdict = _walk(ctx, table, chain, 0)
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


def _walk(ctx: Ctx, table: Table, chain: Chain, depth: int) -> str | None:
    if depth > MAX_DEPTH:
        raise NetfilterError(f"chain nesting deeper than {MAX_DEPTH} at {table.name}/{chain.name}: a loop?")
    rules = chain.rules
    ix = chain.index
    if ix is None or ctx.tracing:
        seq: range | tuple[int, ...] = range(len(rules))
    elif ix.kind == "dst":
        seq = ix.by_key.get((ctx.version, ctx.dst), ix.fallback)
    else:
        seq = ix.by_key.get((ctx.proto, ctx.dport), ix.fallback)
    for i in seq:
        rule = rules[i]
        uid = rule.uid
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
        ctx.hits.append((uid, ctx.length))
        target = rule.target
        if target is None:
            if ctx.tracing:
                _trace(ctx, table, chain, i, "match", "")
            continue
        verdict = target.apply(ctx)
        if ctx.tracing:
            _trace(ctx, table, chain, i, "match", target.label)
        if verdict == CONTINUE:
            continue
        if isinstance(verdict, tuple):
            kind, name = verdict
            sub = _walk(ctx, table, table.chains[name], depth + 1)
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
