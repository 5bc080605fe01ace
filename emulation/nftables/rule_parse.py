"""Reading a rule's statements from its tokens (nft's rule grammar, ``src/parser_bison.y``,
for the expressions and statements of :mod:`.exprs`).

Implicit dependencies nft adds are added here too, so that evaluation and listing see them:
``reject with tcp reset`` gets ``meta l4proto tcp`` before it (nft lists it), unless the rule
already has it just before.
"""

from __future__ import annotations

from emulation.errors import InputError
from emulation.nftables.exprs import (
    _ALIASES,
    _FLAG_TYPES,
    _MASK_OPS,
    _VERDICT_WORDS,
    SELECTORS,
    Counter,
    Log,
    MarkSet,
    Match,
    Nat,
    Notrack,
    Numgen,
    Reject,
    SetUpdate,
    Stmt,
    Unknown,
    VerdictStmt,
    VMap,
)
from emulation.nftables.tokens import Token
from emulation.nftables.types import Key, Verdict, VerdictKind, parse_key

__all__ = ["Stream", "parse_stmts", "parse_value", "parse_verdict"]


class Stream:
    """A cursor over a rule's tokens."""

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


def _selector(s: Stream) -> str | None:
    # 7 and 5 words: the reverse-path lookups ``fib saddr . mark . iif oif``, ``fib saddr . iif oif``.
    for width in (7, 5, 3, 2, 1):
        words = " ".join(s.peek(k) for k in range(width))
        name = _ALIASES.get(words, words)
        if name in SELECTORS:
            s.pos += width
            return name
    return None


def _lhs(s: Stream) -> tuple[str, ...] | None:
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


def parse_value(kind: str, text: str) -> Key:
    flags = _FLAG_TYPES.get(kind)
    if flags is None:
        return parse_key(kind, text)
    bits = 0
    for word in text.split(","):
        if word not in flags:
            raise InputError(f"unknown {kind} value {word!r}; known: {', '.join(flags)}")
        bits |= flags[word]
    return bits, bits


def _element(s: Stream, kinds: tuple[str, ...]) -> tuple[Key, ...]:
    parts = []
    for i, kind in enumerate(kinds):
        if i:
            s.expect(".")
        parts.append(parse_value(kind, s.take()))
    return tuple(parts)


def parse_verdict(s: Stream) -> Verdict:
    word = s.take()
    if word not in _VERDICT_WORDS:
        raise InputError(f"expected a verdict (accept, drop, jump CHAIN, goto CHAIN ...), found {word!r}")
    kind = VerdictKind(word)
    if kind in (VerdictKind.JUMP, VerdictKind.GOTO):
        return Verdict(kind, s.take().strip('"'))
    return Verdict(kind)


def _anon_map(s: Stream, kinds: tuple[str, ...]) -> tuple[tuple[tuple[Key, ...], Verdict], ...]:
    s.expect("{")
    out = []
    while s.peek() != "}":
        key = _element(s, kinds)
        s.expect(":")
        out.append((key, parse_verdict(s)))
        if s.peek() == ",":
            s.take()
    s.take()
    return tuple(out)


def _match_rest(s: Stream, lhs: tuple[str, ...]) -> Stmt:
    kinds = tuple(SELECTORS[name] for name in lhs)
    if s.peek() == "vmap":
        s.take()
        if s.peek().startswith("@"):
            return VMap(lhs, set_name=s.take()[1:])
        return VMap(lhs, entries=_anon_map(s, kinds))
    mask = None
    if s.peek() in _MASK_OPS and len(lhs) == 1:
        op = _MASK_OPS[s.take()]
        mask = (op, parse_value(kinds[0], s.take())[0])
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
        return Match(lhs, negate, values=((parse_value(kinds[0], text),),), mask=mask)
    return Match(lhs, negate, values=(_element(s, kinds),), mask=mask)


_LOG_LEVELS = ("emerg", "alert", "crit", "err", "warn", "notice", "info", "debug", "audit")


def _log(s: Stream) -> Log:
    """The options of ``log`` (see :class:`~.exprs.Log`)."""
    found: dict[str, str] = {}
    while s.peek() in ("prefix", "level", "group", "snaplen", "queue-threshold"):
        key = s.take()
        value = s.take()
        if key == "prefix" and not value.startswith('"'):
            raise InputError(f"log prefix: expected a quoted string, found {value!r}")
        if key == "level" and value not in _LOG_LEVELS:
            raise InputError(f"log level: expected one of {', '.join(_LOG_LEVELS)}, found {value!r}")
        if key not in ("prefix", "level") and not value.isdigit():
            raise InputError(f"log {key}: expected a number, found {value!r}")
        found[key] = value
    if "level" in found and "group" in found:
        raise InputError("log: level and group are mutually exclusive (group logs through nflog)")
    if "group" not in found and ("snaplen" in found or "queue-threshold" in found):
        raise InputError("log: snaplen and queue-threshold need a group")
    number = {k: int(v) for k, v in found.items() if k not in ("prefix", "level")}
    return Log(prefix=found.get("prefix"), level=found.get("level"), group=number.get("group"),
               snaplen=number.get("snaplen"), queue_threshold=number.get("queue-threshold"))


def _mark_set(s: Stream, target: str) -> MarkSet:
    if _ALIASES.get(s.peek(), s.peek()) == target or " ".join((s.peek(), s.peek(1))) == target:
        s.pos += 1 if _ALIASES.get(s.peek()) == target else 2
        op = _MASK_OPS.get(s.take())
        if op is None:
            raise InputError(f"expected | & ^ (or, and, xor) after {target}")
        return MarkSet(target, op, parse_value("mark", s.take())[0])
    return MarkSet(target, None, parse_value("mark", s.take())[0])


def _nat(s: Stream, kind: str) -> Nat:
    family = None
    addr: str | None = None
    port: int | None = None
    if kind in ("dnat", "snat"):
        if s.peek() in ("ip", "ip6"):
            family = s.take()
        s.expect("to")
        lhs = _lhs(s)
        if lhs is not None:
            return _nat_map(s, kind, family, lhs)
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


def _nat_map(s: Stream, kind: str, family: str | None, lhs: tuple[str, ...]) -> Nat:
    s.expect("map")
    if s.peek().startswith("@"):
        return Nat(kind, family=family, map_lhs=lhs, map_name=s.take()[1:])
    kinds = tuple(SELECTORS[n] for n in lhs)
    addr_kind = "ipv6_addr" if family == "ip6" else "ipv4_addr"
    s.expect("{")
    entries = []
    while s.peek() != "}":
        key = _element(s, kinds)
        s.expect(":")
        data = [parse_value(addr_kind, s.take())]
        if s.peek() == ".":
            s.take()
            data.append(parse_value("inet_service", s.take()))
        entries.append((key, tuple(data)))
        if s.peek() == ",":
            s.take()
    s.take()
    return Nat(kind, family=family, map_lhs=lhs, map_entries=tuple(entries))


def _statement(s: Stream) -> Stmt | str:
    """One statement, or the rule's comment text."""
    word = s.peek()
    if word == "comment":
        s.take()
        return s.take().strip('"')
    if word in _VERDICT_WORDS:
        return VerdictStmt(parse_verdict(s))
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
    if word == "log":
        s.take()
        return _log(s)
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
    s = Stream(tokens)
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
