"""Walking one chain of one table, as ``ipt_do_table`` does (net/ipv4/netfilter/ip_tables.c).

Rules are tried in order; a rule matches when its basic matches and then its modules all
hold (the first that fails stops: later modules, and their side effects, are skipped). A
matching rule counts its packet and runs its target: a verdict ends the walk, a jump
descends, a goto replaces the current chain, RETURN (or falling off the end) goes back to the
caller, and a built-in chain then applies its policy. A match that evaluates to "unknown"
makes the rule not taken, flags the outcome as uncertain and shows in the trace.

This is the reference walk: it tests every rule's match values as written (``Match.test``),
and it is the one that traces. :func:`run_chain` takes the walk to use as an argument, so the
accelerator (:mod:`emulation.netfilter.accel`) can give its compiled, indexed walk instead,
which is proven equal to this one; a :class:`WalkObserver` (the accelerator's flow recorder)
may watch which rules are tested and which targets run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from emulation.errors import NetfilterError
from emulation.netfilter.context import Ctx, TraceStep
from emulation.netfilter.rules import Chain, Rule, Table
from emulation.netfilter.targets import Target
from emulation.netfilter.verdicts import CONTINUE, RETURN, Verdict

__all__ = ["MAX_DEPTH", "ChainWalk", "WalkObserver", "plain_walk", "run_chain", "walk_rules"]

MAX_DEPTH = 64

#: One chain's walk: ``walk(ctx, table, chain, depth)`` returns the verdict that ended it
#: (a :class:`~emulation.netfilter.verdicts.Verdict`), ``RETURN``, or ``None`` when it fell
#: off the end. ``depth`` counts the jumps that led to it.
ChainWalk = Callable[[Ctx, Table, Chain, int], "str | None"]

#: A built-in chain's policy as a verdict.
_POLICY = {"ACCEPT": Verdict.ACCEPT, "DROP": Verdict.DROP}


class WalkObserver(Protocol):
    """What a walk tells whoever watches it (the flow cache's recorder)."""

    def tested(self, rule: Rule) -> None:
        """``rule`` is about to be tested."""

    def applied(self, target: Target) -> None:
        """``target`` of a matching rule is about to run."""


def run_chain(ctx: Ctx, table: Table, chain: Chain, walk: ChainWalk | None = None) -> Verdict:
    """Run built-in ``chain`` of ``table`` with ``walk`` (default: the plain walk; always the
    plain walk when tracing): return ACCEPT, DROP or REJECT (policy included)."""
    verdict = (plain_walk if walk is None or ctx.tracing else walk)(ctx, table, chain, 0)
    if verdict is None or verdict == RETURN:
        ctx.policy_hits.append((table.name, chain.name, ctx.length))
        policy = _POLICY[chain.policy or "ACCEPT"]
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
    return verdict  # type: ignore[return-value]  # a walk ends in a Verdict unless it returned


def plain_walk(ctx: Ctx, table: Table, chain: Chain, depth: int) -> str | None:
    """The reference walk of ``chain``: every rule as written (a :data:`ChainWalk`)."""
    return walk_rules(ctx, table, chain, depth)


def walk_rules(
    ctx: Ctx,
    table: Table,
    chain: Chain,
    depth: int,
    *,
    observer: WalkObserver | None = None,
    descend: ChainWalk | None = None,
) -> str | None:
    """The plain walk: every rule of ``chain`` as written; traces when asked to. Jumps go to
    ``descend`` (default: this walk, with the same observer).

    Raises:
        NetfilterError: jumps nest deeper than :data:`MAX_DEPTH` (a loop).
    """
    if depth > MAX_DEPTH:
        raise NetfilterError(f"chain nesting deeper than {MAX_DEPTH} at {table.name}/{chain.name}: a loop?")
    rules = chain.rules
    tracing = ctx.tracing
    for i in range(len(rules)):
        rule = rules[i]
        uid = rule.uid
        if observer is not None:
            observer.tested(rule)
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
            if tracing:
                _trace(ctx, table, chain, i, "unknown" if res is None else "nomatch", "")
            continue
        ctx.hits.append(uid)
        target = rule.target
        if target is None:
            if tracing:
                _trace(ctx, table, chain, i, "match", "")
            continue
        if observer is not None:
            observer.applied(target)
        verdict = target.apply(ctx)
        if tracing:
            _trace(ctx, table, chain, i, "match", target.label)
        if verdict == CONTINUE:
            continue
        if isinstance(verdict, tuple):
            kind, name = verdict
            sub = (
                descend(ctx, table, table.chains[name], depth + 1)
                if descend is not None
                else walk_rules(ctx, table, table.chains[name], depth + 1, observer=observer)
            )
            if kind == "GOTO":
                return None if sub is None or sub == RETURN else sub
            if sub is None or sub == RETURN:
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
