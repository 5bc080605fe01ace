"""Rule statements as values, and printing them as ``nft list ruleset`` does.

A rule is a sequence of statements (:data:`Stmt`), evaluated left to right (``nft_do_chain``
runs a rule's expressions in order; the first that does not match ends the rule). The
selectors (:data:`SELECTORS`) are the payload, meta, ct, fib and numgen expressions kube-proxy
and common CNIs write. Printing normalises as nft does: ``mark`` becomes ``meta mark``, masks
and marks are printed ``0x%08x``, ``or``/``and``/``xor`` become ``|``/``&``/``^``, a one-element
anonymous set loses its braces, a counter shows ``packets N bytes M``.

Reading statements from tokens is :mod:`.rule_parse`. Text this model does not know is an
error in strict mode; in lenient mode the rest of the rule becomes an :class:`Unknown`
statement, which evaluation treats as "maybe" (the outcome is marked uncertain and the rule is
taken not to match), never as a silent match.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.nftables.types import Datum, Key, Verdict, VerdictKind, format_key

__all__ = [
    "CT_STATES",
    "CT_STATUS",
    "FIB_TYPES",
    "SELECTORS",
    "Counter",
    "Log",
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
    "format_datum",
    "format_element",
    "format_stmt",
    "format_value",
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
    "fib saddr . iif oif": "fib_oif",
    "fib saddr . mark . iif oif": "fib_oif",
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
#: ``fib ... oif`` compared with ``missing`` (no route back out of the input interface) or ``exists``.
FIB_OIF: dict[str, int] = {"missing": 0, "exists": 1}
_FLAG_TYPES = {"ct_state": CT_STATES, "ct_status": CT_STATUS, "fib_type": FIB_TYPES, "fib_oif": FIB_OIF}
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
    (``fully-random``, ``random``, ``persistent``); ``family`` is the ``ip``/``ip6`` of ``dnat ip to``.

    ``dnat [ip] to SELECTORS map @name`` (or ``map { key : addr [. port], ... }``) takes the
    address, and the port when the data is ``addr . port``, from a map lookup: ``map_lhs`` the
    selectors, ``map_name`` a named map or ``map_entries`` an anonymous one.
    """

    kind: str
    addr: str | None = None
    port: int | None = None
    flags: tuple[str, ...] = ()
    family: str | None = None
    map_lhs: tuple[str, ...] = ()
    map_name: str | None = None
    map_entries: tuple[tuple[tuple[Key, ...], tuple[Key, ...]], ...] = ()


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
class Log:
    """``log [prefix "TEXT"] [level LEVEL] [group N] [snaplen N] [queue-threshold N]``: logs the
    packet (``nft_log_eval``) and goes on; no effect on the packet. ``level warn`` is the default
    and is not printed, as nft lists it."""

    prefix: str | None = None
    level: str | None = None
    group: int | None = None
    snaplen: int | None = None
    queue_threshold: int | None = None


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


Stmt = (Match | VMap | Numgen | VerdictStmt | Reject | Counter | Nat | MarkSet | Notrack | Log | SetUpdate
        | Unknown)


def _kinds(lhs: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(SELECTORS[name] for name in lhs)


def format_value(kind: str, key: Key) -> str:
    """One value as nft prints it (flag types as ``a,b`` in nft's bit order)."""
    flags = _FLAG_TYPES.get(kind)
    if flags is None:
        return format_key(kind, key)
    if kind in ("fib_type", "fib_oif"):
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
    if isinstance(stmt, Log):
        words = ["log"]
        if stmt.prefix is not None:
            words.append(f"prefix {stmt.prefix}")
        if stmt.level is not None and stmt.level != "warn":
            words.append(f"level {stmt.level}")
        for name, number in (("group", stmt.group), ("snaplen", stmt.snaplen),
                             ("queue-threshold", stmt.queue_threshold)):
            if number is not None:
                words.append(f"{name} {number}")
        return " ".join(words)
    if isinstance(stmt, SetUpdate):
        return f"{stmt.op} @{stmt.set_name} {{ {' . '.join(stmt.lhs)} }}"
    return stmt.text


def _format_nat(stmt: Nat) -> str:
    out = stmt.kind
    if stmt.family is not None:
        out += f" {stmt.family}"
    if stmt.map_lhs:
        out += " to " + " . ".join(stmt.map_lhs) + " map "
        if stmt.map_name is not None:
            out += f"@{stmt.map_name}"
        else:
            v = "ipv6_addr" if stmt.family == "ip6" else "ipv4_addr"
            kinds = tuple(SELECTORS[n] for n in stmt.map_lhs)
            body = ", ".join(
                f"{format_element(kinds, k)} : {format_element((v, 'inet_service')[: len(d)], d)}"
                for k, d in stmt.map_entries
            )
            out += f"{{ {body} }}"
    elif stmt.addr is not None:
        host = f"[{stmt.addr}]" if ":" in stmt.addr and stmt.port is not None else stmt.addr
        out += f" to {host}" + (f":{stmt.port}" if stmt.port is not None else "")
    elif stmt.port is not None:
        out += f" to :{stmt.port}"
    return " ".join([out, *stmt.flags])
