"""Rule statements: reading them from tokens and printing them as ``nft list ruleset`` does.

A rule is a sequence of statements (:data:`Stmt`), evaluated left to right (``nft_do_chain``
runs a rule's expressions in order; the first that does not match ends the rule). The
selectors (:data:`SELECTORS`) are the payload, meta, ct, fib and numgen expressions kube-proxy
and common CNIs write. Printing normalises as nft does: ``mark`` becomes ``meta mark``, masks
and marks are printed ``0x%08x``, ``or``/``and``/``xor`` become ``|``/``&``/``^``, a one-element
anonymous set loses its braces, a counter shows ``packets N bytes M``.

Text this model does not know is an error in strict mode; in lenient mode the rest of the
rule becomes an :class:`Unknown` statement, which evaluation treats as "maybe" (the outcome is
marked uncertain and the rule is taken not to match), never as a silent match.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.errors import InputError
from emulation.nftables.tokens import Token
from emulation.nftables.types import Datum, Key, Verdict, VerdictKind, format_key, parse_key

__all__ = [
    "CT_STATES",
    "CT_STATUS",
    "FIB_TYPES",
    "SELECTORS",
    "Counter",
    "MarkSet",
    "Match",
    "Nat",
    "Notrack",
    "Numgen",
    "Reject",
    "SetUpdate",
    "Stmt",
    "Unknown",
    "VMap",
    "Verdict",
    "VerdictStmt",
    "format_stmt",
    "parse_stmts",
]

#: Selector name -> data type. Names are as nft prints them.
SELECTORS: dict[str, str] = {
    "ip saddr": "ipv4_addr",
    "ip daddr": "ipv4_addr",
    "ip protocol": "inet_proto",
    "ip6 saddr": "ipv6_addr",
    "ip6 daddr": "ipv6_addr",
    "ip6 nexthdr": "inet_proto",
    "meta l4proto": "inet_proto",
    "meta nfproto": "nf_proto",
    "meta mark": "mark",
    "iifname": "ifname",
    "oifname": "ifname",
    "th sport": "inet_service",
    "th dport": "inet_service",
    "ct state": "ct_state",
    "ct status": "ct_status",
    "ct mark": "mark",
    "fib daddr type": "fib_type",
    "fib saddr type": "fib_type",
} | {f"{p} {d}": "inet_service" for p in ("tcp", "udp", "sctp") for d in ("sport", "dport")}
_ALIASES = {
    "mark": "meta mark",
    "meta iifname": "iifname",
    "meta oifname": "oifname",
    "l4proto": "meta l4proto",
}

#: ``ct state`` bits (``IP_CT_*`` as ``NF_CT_STATE_BIT``), in nft's printing order.
CT_STATES: dict[str, int] = {"invalid": 1, "established": 2, "related": 4, "new": 8, "untracked": 64}
#: ``ct status`` bits (``IPS_*``) this model knows.
CT_STATUS: dict[str, int] = {
    "expected": 1,
    "seen-reply": 2,
    "assured": 4,
    "confirmed": 8,
    "snat": 16,
    "dnat": 32,
}
#: ``fib ... type`` values (``RTN_*``).
FIB_TYPES: dict[str, int] = {
    "unspec": 0,
    "unicast": 1,
    "local": 2,
    "broadcast": 3,
    "anycast": 4,
    "multicast": 5,
    "blackhole": 6,
    "unreachable": 7,
    "prohibit": 8,
}
_FLAG_TYPES = {"ct_state": CT_STATES, "ct_status": CT_STATUS, "fib_type": FIB_TYPES}
_VERDICT_WORDS = {k.value for k in VerdictKind}
_MASK_OPS = {"&": "&", "and": "&", "|": "|", "or": "|", "^": "^", "xor": "^"}


@dataclass(frozen=True, slots=True)
class Match:
    """``lhs [mask] op rhs``: ``lhs`` the selectors (several: a concatenation), ``mask`` a
    bitwise ``(op, value)`` on a single selector, ``negate`` for ``!=``; ``rhs`` either the name of
    a set (``@name``) or the elements of an anonymous set (each a tuple of keys)."""

    lhs: tuple[str, ...]
    negate: bool = False
    values: tuple[tuple[Key, ...], ...] = ()
    set_name: str | None = None
    mask: tuple[str, int] | None = None
    braces: bool = False


@dataclass(frozen=True, slots=True)
class VMap:
    """``lhs vmap @name`` or ``lhs vmap { key : verdict, ... }``."""

    lhs: tuple[str, ...]
    set_name: str | None = None
    entries: tuple[tuple[tuple[Key, ...], Verdict], ...] = ()


@dataclass(frozen=True, slots=True)
class Numgen:
    """``numgen random mod N [offset K] vmap { ... }`` (``nft_ng_random_eval``)."""

    mod: int
    offset: int
    entries: tuple[tuple[int, Verdict], ...]


@dataclass(frozen=True, slots=True)
class VerdictStmt:
    """``accept``, ``drop``, ``return``, ``continue``, ``jump X``, ``goto X``."""

    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Reject:
    """``reject [with icmp|icmpv6|icmpx CODE | with tcp reset]``; ``with_`` is the text after ``with``."""

    with_: str | None = None


@dataclass(frozen=True, slots=True)
class Counter:
    """``counter [packets N bytes M]``: the starting values; live counts are the Netns's."""

    packets: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class Nat:
    """``dnat``/``snat`` ``to ADDR[:PORT]``, ``masquerade``, ``redirect``, with flags
    (``fully-random``, ``random``, ``persistent``); ``family`` is the ``ip``/``ip6`` of ``dnat ip to``."""

    kind: str
    addr: str | None = None
    port: int | None = None
    flags: tuple[str, ...] = ()
    family: str | None = None


@dataclass(frozen=True, slots=True)
class MarkSet:
    """``meta mark set VALUE`` or ``meta mark set meta mark OP VALUE`` (``ct mark`` alike)."""

    target: str
    op: str | None
    value: int


@dataclass(frozen=True, slots=True)
class Notrack:
    """``notrack``: the packet is not tracked (``nft_notrack_eval``)."""


@dataclass(frozen=True, slots=True)
class SetUpdate:
    """``update|add @set { selectors [timeout Ns] }`` from the packet path (``nft_dynset``)."""

    op: str
    set_name: str
    lhs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Unknown:
    """Text this model does not understand (lenient mode); evaluates to "maybe"."""

    text: str


Stmt = Match | VMap | Numgen | VerdictStmt | Reject | Counter | Nat | MarkSet | Notrack | SetUpdate | Unknown


class _Stream:
    def __init__(self, tokens: list[Token]) -> None:
        self.toks = tokens
        self.pos = 0

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.toks[i].text if i < len(self.toks) else ""

    def take(self) -> str:
        if self.pos >= len(self.toks):
            raise InputError("unexpected end of rule")
        self.pos += 1
        return self.toks[self.pos - 1].text

    def expect(self, word: str) -> None:
        got = self.take()
        if got != word:
            raise InputError(f"expected {word!r}, found {got!r}")

    @property
    def done(self) -> bool:
        return self.pos >= len(self.toks)


def _selector(s: _Stream) -> str | None:
    for width in (3, 2, 1):
        words = " ".join(s.peek(k) for k in range(width))
        name = _ALIASES.get(words, words)
        if name in SELECTORS:
            s.pos += width
            return name
    return None


def _lhs(s: _Stream) -> tuple[str, ...] | None:
    first = _selector(s)
    if first is None:
        return None
    parts = [first]
    while s.peek() == ".":
        s.take()
        nxt = _selector(s)
        if nxt is None:
            raise InputError(f"expected a selector after '.', found {s.peek()!r}")
        parts.append(nxt)
    return tuple(parts)


def _value(kind: str, text: str) -> Key:
    flags = _FLAG_TYPES.get(kind)
    if flags is None:
        return parse_key(kind, text)
    bits = 0
    for word in text.split(","):
        if word not in flags:
            raise InputError(f"unknown {kind} value {word!r}; known: {', '.join(flags)}")
        bits |= flags[word]
    return bits, bits


def _element(s: _Stream, kinds: tuple[str, ...]) -> tuple[Key, ...]:
    parts = []
    for i, kind in enumerate(kinds):
        if i:
            s.expect(".")
        parts.append(_value(kind, s.take()))
    return tuple(parts)


def _verdict(s: _Stream) -> Verdict:
    word = s.take()
    if word not in _VERDICT_WORDS:
        raise InputError(f"expected a verdict (accept, drop, jump CHAIN, goto CHAIN ...), found {word!r}")
    kind = VerdictKind(word)
    if kind in (VerdictKind.JUMP, VerdictKind.GOTO):
        return Verdict(kind, s.take().strip('"'))
    return Verdict(kind)


def _anon_map(s: _Stream, kinds: tuple[str, ...]) -> tuple[tuple[tuple[Key, ...], Verdict], ...]:
    s.expect("{")
    out = []
    while s.peek() != "}":
        key = _element(s, kinds)
        s.expect(":")
        out.append((key, _verdict(s)))
        if s.peek() == ",":
            s.take()
    s.take()
    return tuple(out)


def _match_rest(s: _Stream, lhs: tuple[str, ...]) -> Stmt:
    kinds = tuple(SELECTORS[name] for name in lhs)
    if s.peek() == "vmap":
        s.take()
        if s.peek().startswith("@"):
            return VMap(lhs, set_name=s.take()[1:])
        return VMap(lhs, entries=_anon_map(s, kinds))
    mask = None
    if s.peek() in _MASK_OPS and len(lhs) == 1:
        op = _MASK_OPS[s.take()]
        mask = (op, _value(kinds[0], s.take())[0])
    if s.peek() == "set" and lhs in (("meta mark",), ("ct mark",)) and mask is None:
        s.take()
        return _mark_set(s, lhs[0])
    negate = False
    if s.peek() in ("==", "eq"):
        s.take()
    elif s.peek() in ("!=", "ne"):
        s.take()
        negate = True
    if s.peek().startswith("@"):
        return Match(lhs, negate, set_name=s.take()[1:], mask=mask)
    if s.peek() == "{":
        s.take()
        values = []
        while s.peek() != "}":
            values.append(_element(s, kinds))
            if s.peek() == ",":
                s.take()
        s.take()
        return Match(lhs, negate, values=tuple(values), mask=mask, braces=len(values) > 1)
    if len(kinds) == 1 and kinds[0] in _FLAG_TYPES:
        text = s.take()
        while s.peek() == "," and s.peek(1) in _FLAG_TYPES[kinds[0]]:
            s.take()
            text += "," + s.take()
        return Match(lhs, negate, values=((_value(kinds[0], text),),), mask=mask)
    return Match(lhs, negate, values=(_element(s, kinds),), mask=mask)


def _mark_set(s: _Stream, target: str) -> MarkSet:
    if _ALIASES.get(s.peek(), s.peek()) == target or " ".join((s.peek(), s.peek(1))) == target:
        s.pos += 1 if _ALIASES.get(s.peek()) == target else 2
        op = _MASK_OPS.get(s.take())
        if op is None:
            raise InputError(f"expected | & ^ (or, and, xor) after {target}")
        return MarkSet(target, op, _value("mark", s.take())[0])
    return MarkSet(target, None, _value("mark", s.take())[0])


def _nat(s: _Stream, kind: str) -> Nat:
    family = None
    addr: str | None = None
    port: int | None = None
    if kind in ("dnat", "snat"):
        if s.peek() in ("ip", "ip6"):
            family = s.take()
        s.expect("to")
        target = s.take()
        if target.startswith("["):
            host, _, rest = target[1:].partition("]")
            addr, port = host, int(rest[1:]) if rest.startswith(":") else None
        elif target.count(":") == 1:
            host, _, p = target.partition(":")
            addr, port = host, parse_key("inet_service", p)[0]
        else:
            addr = target
        parse_key("ipv6_addr" if ":" in addr else "ipv4_addr", addr)
    elif kind == "redirect" and s.peek() == "to":
        s.take()
        port = parse_key("inet_service", s.take().lstrip(":"))[0]
    flags = []
    while s.peek() in ("fully-random", "random", "persistent"):
        flags.append(s.take())
    return Nat(kind, addr, port, tuple(flags), family)


def _statement(s: _Stream) -> Stmt | str:
    """One statement, or the rule's comment text."""
    word = s.peek()
    if word == "comment":
        s.take()
        return s.take().strip('"')
    if word in _VERDICT_WORDS:
        return VerdictStmt(_verdict(s))
    if word == "counter":
        s.take()
        if s.peek() == "packets":
            s.take()
            packets = int(s.take())
            s.expect("bytes")
            return Counter(packets, int(s.take()))
        return Counter()
    if word == "reject":
        s.take()
        if s.peek() != "with":
            return Reject()
        s.take()
        proto = s.take()
        if proto == "tcp":
            s.expect("reset")
            return Reject("tcp reset")
        if s.peek() == "type":
            s.take()
        return Reject(f"{proto} {s.take()}")
    if word in ("dnat", "snat", "masquerade", "redirect"):
        s.take()
        return _nat(s, word)
    if word == "notrack":
        s.take()
        return Notrack()
    if word in ("update", "add") and s.peek(1).startswith("@"):
        s.take()
        name = s.take()[1:]
        s.expect("{")
        lhs = _lhs(s)
        if lhs is None:
            raise InputError(f"expected a selector in {word} @{name} {{ ... }}")
        s.expect("}")
        return SetUpdate(word, name, lhs)
    if word == "numgen":
        s.take()
        s.expect("random")
        s.expect("mod")
        mod = int(s.take())
        offset = 0
        if s.peek() == "offset":
            s.take()
            offset = int(s.take())
        s.expect("vmap")
        entries = _anon_map(s, ("integer",))
        return Numgen(mod, offset, tuple((k[0][0], v) for k, v in entries))
    lhs = _lhs(s)
    if lhs is None:
        raise InputError(f"unknown expression {word!r}")
    return _match_rest(s, lhs)


def parse_stmts(tokens: list[Token], *, strict: bool) -> tuple[tuple[Stmt, ...], str | None]:
    """A rule's statements and comment, from its tokens (no newline or ``;`` among them).

    Raises:
        InputError: bad syntax, or (``strict``) an expression this model does not know; the
            message names the rule's line.
    """
    s = _Stream(tokens)
    stmts: list[Stmt] = []
    comment = None
    line = tokens[0].line if tokens else None
    while not s.done:
        start = s.pos
        try:
            got = _statement(s)
        except (InputError, ValueError) as exc:
            if strict:
                raise InputError(str(exc), line=line, text=" ".join(t.text for t in tokens)) from None
            rest = [t.text for t in tokens[start:]]
            if "comment" in rest:
                at = rest.index("comment")
                comment = rest[at + 1].strip('"') if at + 1 < len(rest) else None
                rest = rest[:at]
            stmts.append(Unknown(" ".join(rest)))
            break
        if isinstance(got, str):
            comment = got
            continue
        if isinstance(got, Reject) and got.with_ == "tcp reset" and not _is_tcp_match(stmts[-1:]):
            stmts.append(_L4PROTO_TCP)  # the dependency nft adds (and lists) for a TCP reset
        stmts.append(got)
    return tuple(stmts), comment


_L4PROTO_TCP = Match(("meta l4proto",), values=(((6, 6),),))


def _is_tcp_match(last: list[Stmt]) -> bool:
    return bool(last) and last[0] == _L4PROTO_TCP


def _kinds(lhs: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(SELECTORS[name] for name in lhs)


def format_value(kind: str, key: Key) -> str:
    """One value as nft prints it (flag types as ``a,b`` in nft's bit order)."""
    flags = _FLAG_TYPES.get(kind)
    if flags is None:
        return format_key(kind, key)
    if kind == "fib_type":
        return next((n for n, v in flags.items() if v == key[0]), str(key[0]))
    return ",".join(n for n, v in flags.items() if key[0] & v) or "0x0"


def format_element(kinds: tuple[str, ...], key: tuple[Key, ...]) -> str:
    """A (concatenated) element: ``a . b . c``."""
    return " . ".join(format_value(k, v) for k, v in zip(kinds, key, strict=True))


def format_datum(data_type: str, datum: Datum) -> str:
    """A map element's data."""
    if isinstance(datum, Verdict):
        return str(datum)
    return format_element(tuple(data_type.split(" . ")), datum)


def format_stmt(stmt: Stmt, *, live: Counter | None = None) -> str:
    """One statement as ``nft list ruleset`` prints it; ``live`` replaces a counter's values."""
    if isinstance(stmt, Match):
        kinds = _kinds(stmt.lhs)
        lhs = " . ".join(stmt.lhs)
        if stmt.mask is not None:
            lhs += f" {stmt.mask[0]} {format_value(kinds[0], (stmt.mask[1], stmt.mask[1]))}"
        op = "!= " if stmt.negate else ("== " if stmt.mask is not None else "")
        if stmt.set_name is not None:
            return f"{lhs} {op}@{stmt.set_name}"
        items = [format_element(kinds, v) for v in stmt.values]
        rhs = "{ " + ", ".join(items) + " }" if len(items) > 1 else items[0]
        return f"{lhs} {op}{rhs}"
    if isinstance(stmt, VMap):
        lhs = " . ".join(stmt.lhs)
        if stmt.set_name is not None:
            return f"{lhs} vmap @{stmt.set_name}"
        kinds = _kinds(stmt.lhs)
        body = ", ".join(f"{format_element(kinds, k)} : {v}" for k, v in stmt.entries)
        return f"{lhs} vmap {{ {body} }}"
    if isinstance(stmt, Numgen):
        body = ", ".join(f"{k} : {v}" for k, v in stmt.entries)
        offset = f" offset {stmt.offset}" if stmt.offset else ""
        return f"numgen random mod {stmt.mod}{offset} vmap {{ {body} }}"
    if isinstance(stmt, VerdictStmt):
        return str(stmt.verdict)
    if isinstance(stmt, Reject):
        return "reject" if stmt.with_ is None else f"reject with {stmt.with_}"
    if isinstance(stmt, Counter):
        c = live or stmt
        return f"counter packets {c.packets} bytes {c.bytes}"
    if isinstance(stmt, Nat):
        return _format_nat(stmt)
    if isinstance(stmt, MarkSet):
        value = f"0x{stmt.value:08x}"
        return (
            f"{stmt.target} set {stmt.target} {stmt.op} {value}" if stmt.op else f"{stmt.target} set {value}"
        )
    if isinstance(stmt, Notrack):
        return "notrack"
    if isinstance(stmt, SetUpdate):
        return f"{stmt.op} @{stmt.set_name} {{ {' . '.join(stmt.lhs)} }}"
    return stmt.text


def _format_nat(stmt: Nat) -> str:
    out = stmt.kind
    if stmt.family is not None:
        out += f" {stmt.family}"
    if stmt.addr is not None:
        host = f"[{stmt.addr}]" if ":" in stmt.addr and stmt.port is not None else stmt.addr
        out += f" to {host}" + (f":{stmt.port}" if stmt.port is not None else "")
    elif stmt.port is not None:
        out += f" to :{stmt.port}"
    return " ".join([out, *stmt.flags])
