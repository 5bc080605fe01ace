"""Running one packet through nftables chains: selectors, set and map lookups, verdicts.

Theory of operation, as ``nft_do_chain`` (net/netfilter/nf_tables_core.c): a base chain's rules
run in order; a rule's statements run left to right and the first match that fails ends the
rule. ``jump`` runs the target chain and, when it falls off its end or returns, goes on with
the *next rule* of the jumping chain (the rest of the jumping rule is not run: the jump stack
keeps ``nft_rule_next``); ``goto`` does not come back (the target's return goes to whoever
called the current chain); ``return`` pops; ``accept`` and ``drop`` end the base chain. A base
chain that falls off its end applies its policy. A selector with no value for the packet
(``ip saddr`` of an IPv6 packet in an inet table, ``th dport`` of ICMP) fails the match, as
the payload expression's implicit dependency does; an :class:`~.exprs.Unknown` statement
makes the rule not match and the outcome ``uncertain``. ``numgen random mod N`` asks the
walk's ``choose(N)`` for an index (sampled, or enumerated by the caller).
"""

from __future__ import annotations

from collections.abc import Callable

from emulation.addr import parse_address
from emulation.netfilter.context import TraceStep
from emulation.nftables import exprs as ex
from emulation.nftables.listing import format_rule
from emulation.nftables.model import Chain, Element, Family, Rule, SetFlag, Table, TableSet
from emulation.nftables.types import TYPE_BITS, Key, Verdict, VerdictKind, parse_key
from emulation.node import Node
from emulation.packet import PROTO_NUMBERS

__all__ = ["MAX_DEPTH", "Flow", "Verdicts", "run_base_chain"]

#: The kernel's jump stack depth (``NFT_JUMP_STACK_SIZE``); deeper is a loop.
MAX_DEPTH = 16
_CT_BITS = ex.CT_STATES
_FIB = ex.FIB_TYPES
#: Base-chain results: ``accept``, ``drop``, or ``reject`` (a drop that answers).
Verdicts = str


class Flow:
    """A packet's mutable state on its way through the hooks (internal to the model)."""

    __slots__ = (
        "chain",
        "chain_line",
        "choose",
        "counted",
        "ct_status",
        "ctmark",
        "ctstate",
        "dnat",
        "dport",
        "dst",
        "dyn_sets",
        "dyn_updates",
        "elem_counted",
        "hook",
        "iif",
        "index",
        "length",
        "mark",
        "masquerade",
        "node",
        "notrack",
        "now",
        "oif",
        "proto",
        "reject",
        "snat",
        "sport",
        "src",
        "trace",
        "tracing",
        "uncertain",
        "version",
    )

    def __init__(
        self,
        *,
        node: Node,
        version: int,
        src: int,
        dst: int,
        sport: int,
        dport: int,
        proto: str,
        iif: str | None,
        mark: int,
        length: int,
        now: float,
        choose: Callable[[int], int],
        index: Callable[[TableSet], dict[tuple[Key, ...], Element]],
        dyn_sets: dict[tuple[Family, str, str], dict[tuple[Key, ...], float]],
        tracing: bool,
    ) -> None:
        self.node, self.version = node, version
        self.src, self.dst, self.sport, self.dport, self.proto = src, dst, sport, dport, proto
        self.iif: str | None = iif
        self.oif: str | None = None
        self.mark, self.length, self.now = mark, length, now
        self.choose = choose
        self.index = index
        self.dyn_sets = dyn_sets
        self.dyn_updates: list[tuple[tuple[Family, str, str], tuple[Key, ...], float]] = []
        self.tracing = tracing
        self.trace: list[TraceStep] = []
        self.counted: list[tuple[Family, str, int]] = []
        self.elem_counted: list[tuple[Family, str, str, tuple[Key, ...]]] = []
        self.hook = ""
        #: The chain whose rule runs now (set and map lookups and numgen draws are traced in it).
        self.chain = ""
        #: The input line of the rule running now (0 when unknown).
        self.chain_line = 0
        self.ctstate = _CT_BITS["new"]
        self.ct_status = 0
        self.ctmark = 0
        self.notrack = False
        self.dnat: tuple[int, int | None] | None = None
        #: ``(address or -1 for masquerade, random)`` asked for by snat / masquerade.
        self.snat: tuple[int, bool] | None = None
        self.masquerade = False
        self.reject: str | None = None
        self.uncertain = False

    def step(
        self, table: Table, chain: str, index: int, line: int, rule: str, result: str, target: str
    ) -> None:
        """Record one trace step (a rule, a lookup or a policy) at the current hook."""
        self.trace.append(
            TraceStep(
                hook=self.hook,
                table=f"{table.family} {table.name}",
                chain=chain,
                index=index,
                line=line,
                rule=rule,
                result=result,
                target=target,
            )
        )

    # --- selectors -------------------------------------------------------------------------------

    def value(self, name: str) -> int | None:
        """The packet's value for a selector, or ``None`` when it has none."""
        v4 = self.version == 4
        if name in ("ip saddr", "ip daddr", "ip protocol"):
            if not v4:
                return None
        elif name in ("ip6 saddr", "ip6 daddr", "ip6 nexthdr") and v4:
            return None
        if name.endswith("saddr") and not name.startswith("fib"):
            return self.src
        if name.endswith("daddr") and not name.startswith("fib"):
            return self.dst
        if name in ("ip protocol", "ip6 nexthdr", "meta l4proto"):
            return self._l4proto()
        if name.endswith("sport") or name.endswith("dport"):
            head = name.split()[0]
            if head == "th":
                if self.proto not in ("tcp", "udp", "sctp"):
                    return None
            elif head != self.proto:
                return None
            return self.sport if name.endswith("sport") else self.dport
        return self._meta(name)

    def _l4proto(self) -> int:
        if self.proto == "icmp" and self.version == 6:
            return 58
        return PROTO_NUMBERS[self.proto]

    def _meta(self, name: str) -> int | None:
        if name == "meta nfproto":
            return 2 if self.version == 4 else 10
        if name == "meta mark":
            return self.mark
        if name == "ct mark":
            return self.ctmark
        if name in ("iifname", "oifname"):
            dev = self.iif if name == "iifname" else self.oif
            return None if dev is None else parse_key("ifname", dev)[0]
        if name == "ct state":
            return self.ctstate
        if name == "ct status":
            return self.ct_status
        if name in ("fib daddr type", "fib saddr type"):
            addr = self.dst if name == "fib daddr type" else self.src
            return _FIB[self.node.address_type(self.version, addr).lower()]
        if name.startswith("fib saddr") and name.endswith("iif oif"):
            return self._reverse_path()
        raise AssertionError(f"selector {name!r} without a value")  # pragma: no cover

    def _reverse_path(self) -> int | None:
        """``fib saddr . iif oif``: 1 (``exists``) when the route back to the source leaves by the
        input interface, else 0 (``missing``); as ``nft_fib4_eval``/``nft_fib6_eval``: a packet
        that came in on loopback finds its interface, a local or unroutable source finds none.
        No value where there is no input interface (the output hook)."""
        if self.iif is None:
            return None
        if self.iif == "lo":
            return 1
        route = self.node.route(self.version, self.src)
        return 1 if route.kind == "unicast" and route.device == self.iif else 0

    def key(self, lhs: tuple[str, ...]) -> tuple[int, ...] | None:
        out = []
        for name in lhs:
            v = self.value(name)
            if v is None:
                return None
            out.append(v)
        return tuple(out)


def _in(values: tuple[int, ...], key: tuple[Key, ...]) -> bool:
    return all(low <= v <= high for v, (low, high) in zip(values, key, strict=True))


def _count(flow: Flow, table: Table, s: TableSet, e: Element) -> None:
    if s.counter:
        flow.elem_counted.append((table.family, table.name, s.name, e.key))


def _set_has(flow: Flow, table: Table, s: TableSet, values: tuple[int, ...]) -> bool:
    exact = tuple((v, v) for v in values)
    if SetFlag.INTERVAL not in s.flags:
        found = flow.index(s).get(exact)
        if found is not None:
            _count(flow, table, s, found)
            return True
    else:
        for e in s.elements:
            if _in(values, e.key):
                _count(flow, table, s, e)
                return True
    dyn = flow.dyn_sets.get((table.family, table.name, s.name))
    if dyn is not None:
        expires = dyn.get(exact)
        if expires is not None and expires > flow.now:
            return True
    return any(k == (table.family, table.name, s.name) and key == exact for k, key, _ in flow.dyn_updates)


def _map_get(flow: Flow, table: Table, s: TableSet, values: tuple[int, ...]) -> Element | None:
    if SetFlag.INTERVAL not in s.flags:  # a hash lookup: flat in the number of elements
        found = flow.index(s).get(tuple((v, v) for v in values))
        if found is not None:
            _count(flow, table, s, found)
        return found
    for e in s.elements:
        if _in(values, e.key):
            _count(flow, table, s, e)
            return e
    return None


def _flags_match(kind: str, value: int, want: int, negate: bool) -> bool:
    hit = value & want != 0 if kind in ("ct_state", "ct_status") else value == want
    return hit != negate


def _match(flow: Flow, table: Table, st: ex.Match) -> bool:
    values = flow.key(st.lhs)
    if values is None:
        return False
    if st.mask is not None:
        op, m = st.mask
        v = values[0]
        values = (v & m if op == "&" else v | m if op == "|" else v ^ m,)
    if st.set_name is not None:
        hit = _set_has(flow, table, table.sets[st.set_name], values)
        if flow.tracing:
            flow.step(table, flow.chain, 0, flow.chain_line, f"{' . '.join(st.lhs)} @{st.set_name}",
                      "lookup:hit" if hit else "lookup:miss", "")
        return hit != st.negate
    kinds = tuple(ex.SELECTORS[n] for n in st.lhs)
    if len(kinds) == 1 and kinds[0] in ("ct_state", "ct_status", "fib_type", "fib_oif"):
        return _flags_match(kinds[0], values[0], st.values[0][0][0], st.negate)
    hit = any(_in(values, key) for key in st.values)
    return hit != st.negate


def _rule(flow: Flow, table: Table, rule: Rule) -> Verdict | None:
    """Run one rule: the verdict it reached, or ``None`` when it did not match or went on."""
    for st in rule.stmts:
        if isinstance(st, ex.Match):
            if not _match(flow, table, st):
                return None
        elif isinstance(st, ex.VerdictStmt):
            return st.verdict
        elif isinstance(st, ex.VMap):
            values = flow.key(st.lhs)
            if values is None:
                return None
            if st.set_name is not None:
                e = _map_get(flow, table, table.sets[st.set_name], values)
                got = e.data if e is not None and isinstance(e.data, Verdict) else None
                if flow.tracing:
                    flow.step(
                        table,
                        flow.chain,
                        0,
                        flow.chain_line,
                        f"{' . '.join(st.lhs)} vmap @{st.set_name}",
                        "lookup:hit" if got else "lookup:miss",
                        str(got or ""),
                    )
            else:
                got = next((v for k, v in st.entries if _in(values, k)), None)
            if got is None:
                return None
            return got
        elif isinstance(st, ex.Numgen):
            n = flow.choose(st.mod) + st.offset
            got = next((v for k, v in st.entries if k == n), None)
            if flow.tracing:
                text = f"numgen random mod {st.mod} = {n}"
                flow.step(table, flow.chain, 0, flow.chain_line, text, "numgen", str(got or ""))
            if got is None:
                return None
            return got
        elif isinstance(st, ex.Counter):
            flow.counted.append((table.family, table.name, rule.handle))
        elif isinstance(st, ex.Reject):
            flow.reject = st.with_ or "default"
            return Verdict(VerdictKind.DROP)
        elif isinstance(st, ex.Nat):
            if not _nat(flow, table, st):
                return None
            return Verdict(VerdictKind.ACCEPT)
        elif isinstance(st, ex.MarkSet):
            base = flow.mark if st.target == "meta mark" else flow.ctmark
            v = (
                st.value
                if st.op is None
                else (
                    base | st.value if st.op == "|" else base & st.value if st.op == "&" else base ^ st.value
                )
            )
            if st.target == "meta mark":
                flow.mark = v
            else:
                flow.ctmark = v
        elif isinstance(st, ex.Notrack):
            flow.notrack = True
        elif isinstance(st, ex.Log):
            pass  # nft_log_eval: a copy goes to the log; the packet goes on unchanged
        elif isinstance(st, ex.SetUpdate):
            values = flow.key(st.lhs)
            s = table.sets[st.set_name]
            if values is not None:
                flow.dyn_updates.append(
                    (
                        (table.family, table.name, s.name),
                        tuple((v, v) for v in values),
                        flow.now + (s.timeout_s or 0.0),
                    )
                )
        else:
            flow.uncertain = True
            if flow.tracing:
                flow.step(table, flow.chain, 0, rule.line, format_rule(rule), "unknown", "")
            return None
    return None


def _nat_lookup(flow: Flow, table: Table, st: ex.Nat) -> tuple[Key, ...] | None:
    """The data a NAT map gives the packet, or ``None`` (no element: the rule breaks)."""
    values = flow.key(st.map_lhs)
    if values is None:
        return None
    if st.map_name is not None:
        e = _map_get(flow, table, table.sets[st.map_name], values)
        return e.data if e is not None and isinstance(e.data, tuple) else None
    return next((d for k, d in st.map_entries if _in(values, k)), None)


def _nat(flow: Flow, table: Table, st: ex.Nat) -> bool:
    """Record what a NAT statement asks for; ``False`` when its map has no element for the packet."""
    if st.map_lhs:
        data = _nat_lookup(flow, table, st)
        if data is None:
            return False
        port = data[1][0] if len(data) > 1 else None
        if st.kind == "dnat":
            flow.dnat = (data[0][0], port)
        else:
            flow.snat = (data[0][0], "fully-random" in st.flags or "random" in st.flags)
        return True
    if st.kind == "dnat":
        assert st.addr is not None
        flow.dnat = (parse_address(st.addr)[1], st.port)
    elif st.kind == "redirect":
        flow.dnat = (-1, st.port)
    elif st.kind == "snat":
        assert st.addr is not None
        flow.snat = (parse_address(st.addr)[1], "fully-random" in st.flags or "random" in st.flags)
    else:
        flow.snat = (-1, "fully-random" in st.flags or "random" in st.flags)
        flow.masquerade = True
    return True


def _walk(flow: Flow, table: Table, chain: Chain, depth: int) -> Verdict | None:
    """Run ``chain``: a terminal verdict (accept/drop), a return (``RETURN``) or ``None`` (fell off)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"chain {chain.name}: jump stack deeper than {MAX_DEPTH} (a loop?)")
    for index, rule in enumerate(chain.rules, start=1):
        flow.chain, flow.chain_line = chain.name, rule.line
        got = _rule(flow, table, rule)
        if flow.tracing:
            flow.step(
                table,
                chain.name,
                index,
                rule.line,
                format_rule(rule),
                "nomatch" if got is None else "match",
                str(got or ""),
            )
        if got is None:
            continue
        kind = got.kind
        if kind in (VerdictKind.ACCEPT, VerdictKind.DROP, VerdictKind.RETURN):
            return got
        if kind == VerdictKind.CONTINUE:
            continue
        target = table.chains[got.chain or ""]
        sub = _walk(flow, table, target, depth + 1)
        if kind == VerdictKind.GOTO:
            return sub
        if sub is not None and sub.kind in (VerdictKind.ACCEPT, VerdictKind.DROP):
            return sub
    return None


def run_base_chain(flow: Flow, table: Table, chain: Chain) -> str:
    """Run a base chain: ``accept`` or ``drop`` (its policy when nothing decided)."""
    got = _walk(flow, table, chain, 0)
    if got is None or got.kind == VerdictKind.RETURN:
        if flow.tracing:
            flow.step(table, chain.name, 0, 0, f"policy {chain.policy}", "policy", str(chain.policy))
        return str(chain.policy)
    return str(got.kind)


_ = TYPE_BITS
