"""``nft list ruleset``: a ruleset printed back in nft's own format (nft 1.0.6).

As ``table_print``, ``set_print_declaration`` and ``chain_print_declaration`` in nft's
src/rule.c: a table's comment, then its sets and maps, then its chains, in creation order,
a blank line between two; a set lists ``type``, ``size``, ``flags``, ``timeout``, ``comment``
and ``elements``; a base chain its ``comment`` and then ``type ... hook ... priority ...;
policy ...;``. Priorities within 10 of a standard one that suits the hook are printed by
name (``dstnat - 10``; ``prio2str``). Elements wrap as ``calculate_delim`` does. A hash set's
elements come out of the kernel in its hash order, which this model does not reproduce: they
are printed in insertion order (interval sets sorted, as the kernel's rbtree is), so compare
listings with :func:`canonical`, which sorts elements.
"""

from __future__ import annotations

from collections.abc import Mapping

from emulation.nftables import exprs as ex
from emulation.nftables.model import Chain, Family, NftHook, Rule, Ruleset, SetFlag, Table, TableSet
from emulation.nftables.ruleset import PRIORITY_NAMES, priority_name_fits
from emulation.nftables.types import PER_LINE, Key

__all__ = [
    "CounterKey",
    "ElementCounters",
    "canonical",
    "format_priority",
    "format_rule",
    "format_time",
    "list_ruleset",
]

#: ``(family, table, rule handle)``: whose live counter a value is.
CounterKey = tuple[Family, str, int]
#: Packets and bytes counted per element, by ``(family, table, set, element key)``.
ElementCounters = Mapping[tuple[Family, str, str, tuple[Key, ...]], tuple[int, int]]
_NEWLINE_DELIM = ",\n\t\t\t     "
_FLAG_ORDER = (SetFlag.CONSTANT, SetFlag.INTERVAL, SetFlag.DYNAMIC, SetFlag.TIMEOUT)


def format_time(seconds: float) -> str:
    """nft's ``time_print``: ``3h``, ``1m30s``, ``500ms``."""
    ms = round(seconds * 1000)
    out = ""
    for unit, size in (("d", 86400000), ("h", 3600000), ("m", 60000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            out += f"{ms // size}{unit}"
            ms %= size
    return out or "0s"


def format_priority(priority: int, hook: NftHook | None) -> str:
    """A base chain's priority as ``prio2str`` prints it."""
    for name, value in PRIORITY_NAMES.items():
        offset = priority - value
        if abs(offset) > 10:
            continue
        if not priority_name_fits(name, hook):
            continue
        if offset == 0:
            return name
        return f"{name} {'+' if offset > 0 else '-'} {abs(offset)}"
    return str(priority)


_DEPENDENT = {
    ("meta nfproto", 2): "ip ",
    ("meta nfproto", 10): "ip6 ",
    ("meta l4proto", 6): "tcp ",
    ("meta l4proto", 17): "udp ",
    ("meta l4proto", 132): "sctp ",
    ("ip protocol", 6): "tcp ",
    ("ip protocol", 17): "udp ",
    ("ip protocol", 132): "sctp ",
}


def _redundant(stmt: ex.Stmt, nxt: ex.Stmt | None) -> bool:
    """A dependency nft leaves out of its listing: ``meta nfproto ipv4`` just before an ``ip``
    match, ``meta l4proto tcp`` just before a ``tcp`` one (``payload_dependency_kill``)."""
    if not isinstance(stmt, ex.Match) or not isinstance(nxt, ex.Match | ex.VMap) or len(stmt.lhs) != 1:
        return False
    if stmt.negate or stmt.mask is not None or stmt.set_name is not None or len(stmt.values) != 1:
        return False
    low, high = stmt.values[0][0]
    prefix = _DEPENDENT.get((stmt.lhs[0], low)) if low == high else None
    return prefix is not None and nxt.lhs[0].startswith(prefix)


def format_rule(rule: Rule, live: ex.Counter | None = None) -> str:
    """One rule's text (``live``: its counter's current values)."""
    stmts = rule.stmts
    parts = [
        ex.format_stmt(s, live=live)
        for i, s in enumerate(stmts)
        if not _redundant(s, stmts[i + 1] if i + 1 < len(stmts) else None)
    ]
    if rule.comment is not None:
        parts.append(f'comment "{rule.comment}"')
    return " ".join(parts)


def _elements(s: TableSet, live: ElementCounters | None, t: Table) -> str:
    elems = list(s.elements)
    if SetFlag.INTERVAL in s.flags:
        elems.sort(key=lambda e: e.key)
    per_line = PER_LINE.get(s.key_types[0], 0) if len(s.key_types) == 1 else 0
    out, count = "", 0
    for i, e in enumerate(elems):
        if i:
            if count < per_line:
                out += ", "
            else:
                out += _NEWLINE_DELIM
                count = 0
        text = ex.format_element(s.key_types, e.key)
        if s.counter:
            p, b = live.get((t.family, t.name, s.name, e.key), (0, 0)) if live is not None else (0, 0)
            text += f" counter packets {e.packets + p} bytes {e.bytes + b}"
        if e.comment is not None:
            text += f' comment "{e.comment}"'
        if e.data is not None and s.data_type is not None:
            text += " : " + ex.format_datum(s.data_type, e.data)
        out += text
        count += 1
    return "{ " + out + " }"


def _set(s: TableSet, t: Table, live: ElementCounters | None) -> list[str]:
    kind = "map" if s.is_map else "set"
    typ = " . ".join(s.key_types) + (f" : {s.data_type}" if s.data_type else "")
    lines = [f"\t{kind} {s.name} {{", f"\t\ttype {typ}"]
    if s.size is not None:
        lines.append(f"\t\tsize {s.size}")
    if s.flags and not (s.flags == {SetFlag.TIMEOUT} and s.timeout_s is not None):
        # (nft 1.0.6 leaves out a lone ``timeout`` flag when the set has a default timeout)
        lines.append("\t\tflags " + ",".join(f for f in _FLAG_ORDER if f in s.flags))
    if s.counter:
        lines.append("\t\tcounter")
    if s.timeout_s is not None:
        lines.append(f"\t\ttimeout {format_time(s.timeout_s)}")
    if s.comment is not None:
        lines.append(f'\t\tcomment "{s.comment}"')
    if s.elements:
        lines.append(f"\t\telements = {_elements(s, live, t)}")
    lines.append("\t}")
    return lines


def _chain(t: Table, c: Chain, live: Mapping[CounterKey, ex.Counter] | None) -> list[str]:
    lines = [f"\tchain {c.name} {{"]
    if c.comment is not None:
        lines.append(f'\t\tcomment "{c.comment}"')
    if c.is_base:
        lines.append(
            f"\t\ttype {c.type} hook {c.hook} priority {format_priority(c.priority, c.hook)};"
            f" policy {c.policy};"
        )
    for rule in c.rules:
        counter = live.get((t.family, t.name, rule.handle)) if live is not None else None
        lines.append("\t\t" + format_rule(rule, counter))
    lines.append("\t}")
    return lines


def list_ruleset(
    ruleset: Ruleset,
    *,
    counters: Mapping[CounterKey, ex.Counter] | None = None,
    element_counters: ElementCounters | None = None,
) -> str:
    """The text ``nft list ruleset`` prints for ``ruleset``; ``counters`` gives live counter
    values by rule (a rule's ``counter`` statement shows them instead of its starting ones),
    ``element_counters`` the packets and bytes counted per element since it was loaded."""
    out: list[str] = []
    for t in ruleset.tables.values():
        out.append(f"table {t.family} {t.name} {{")
        blocks: list[list[str]] = [_set(s, t, element_counters) for s in t.sets.values()]
        blocks += [_chain(t, c, counters) for c in t.chains.values()]
        if t.comment is not None:
            out.append(f'\tcomment "{t.comment}"')
        for i, block in enumerate(blocks):
            if i:
                out.append("")
            out.extend(block)
        out.append("}")
    return "\n".join(out) + "\n" if out else ""


def canonical(listing: str) -> str:
    """``listing`` with every ``elements = { ... }`` sorted and on one line, to compare two
    listings whose hash sets came out in different orders."""
    out: list[str] = []
    lines = listing.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("elements = {"):
            body = line
            while not body.rstrip().endswith("}"):
                i += 1
                body += " " + lines[i].strip()
            inner = body.split("{", 1)[1].rsplit("}", 1)[0]
            items = sorted(x.strip() for x in inner.split(","))
            line = "\t\telements = { " + ", ".join(items) + " }"
        out.append(line)
        i += 1
    return "\n".join(out)
