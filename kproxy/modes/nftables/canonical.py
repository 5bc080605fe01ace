"""nftables text in a canonical order, for comparisons (kube-proxy's ``sortNFTablesTransaction``).

:func:`sort_transaction` orders ``add``-form lines as kube-proxy's ``helpers_test.go`` does: blank
and ``#`` lines dropped; tables first, then chains, rules, sets, maps, elements; within a type by
object name; rules of one chain keep their order; anything else by the whole line.
:func:`canonical_listing` reads ``nft list table`` output into a form where chain order and the
order of set elements (which follow hash order in the kernel) do not matter.
"""

from __future__ import annotations

import re

__all__ = ["canonical_listing", "sort_transaction"]

_ORDER = {"table": 10, "chain": 9, "rule": 8, "set": 7, "map": 6, "element": 5}


def sort_transaction(text: str) -> str:
    """``text`` sorted as kube-proxy's ``sortNFTablesTransaction`` sorts it, lines joined by newlines."""
    lines = [line for line in text.split("\n") if line and not line.startswith("#")]

    def key(item: tuple[int, str]) -> tuple[int, str, int, str]:
        index, line = item
        words = line.split(" ")
        if len(words) < 5:
            return (0, "", index, "")
        kind = words[1]
        rule = kind == "rule"
        return (-_ORDER.get(kind, 0), words[4], index if rule else 0, "" if rule else line)

    return "\n".join(line for _, line in sorted(enumerate(lines), key=key))


_BLOCK = re.compile(r"^\t(chain|set|map) (\S+) \{$")


def canonical_listing(text: str) -> dict[str, tuple[str, ...]]:
    """``{"chain NAME" | "set NAME" | "map NAME": lines}`` of one ``nft list table`` output.

    Lines are stripped; a set's or map's ``elements = { ... }`` (over one or more lines) becomes
    one sorted ``elements`` line, so insertion history does not show.
    """
    out: dict[str, tuple[str, ...]] = {}
    current: str | None = None
    body: list[str] = []
    elements: list[str] | None = None
    for raw in text.splitlines():
        m = _BLOCK.match(raw)
        if m:
            current, body = f"{m.group(1)} {m.group(2)}", []
            continue
        if current is None:
            continue
        line = raw.strip()
        if line.startswith("elements = {"):
            elements = []
            line = line[len("elements = {"):]
        if elements is not None:
            done = line.endswith("}")
            elements.extend(e.strip() for e in line.rstrip("}").split(",") if e.strip())
            if done:
                body.append("elements " + " , ".join(sorted(elements)))
                elements = None
            continue
        if line == "}" and raw.startswith("\t}"):
            out[current] = tuple(body)
            current = None
        elif line:
            body.append(line)
    return out
