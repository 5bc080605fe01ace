"""Order ``iptables-restore`` text the way kube-proxy's tests compare it.

kube-proxy writes Services in Go map order, so its tests sort before comparing
(``sortIPTablesRules``): tables by name; in each table KUBE-NODEPORTS first, then
KUBE-SERVICES, then the other ``KUBE-*`` chains alphabetically, then the rest; every chain
declaration first, then each chain's rules in that chain order. Rules keep their order
within a chain, except in KUBE-NODEPORTS and KUBE-SERVICES (both tables), which are
stable-sorted by the Service named in their comment (up to the first space or colon), the
"must be the last rule" tail call staying last. ``-X`` lines follow the rules, sorted.
"""

from __future__ import annotations

import shlex

__all__ = ["comment_of", "sort_restore_text"]

_SORTED_CHAINS = ("KUBE-NODEPORTS", "KUBE-SERVICES")
_LAST = "must be the last rule"


def comment_of(rule: str) -> str | None:
    """The value of a rule's ``--comment``, unquoted, or None."""
    if "--comment" not in rule:
        return None
    words = shlex.split(rule)
    for i, word in enumerate(words[:-1]):
        if word == "--comment":
            return words[i + 1]
    return None


def _service_of(rule: str) -> str:
    comment = comment_of(rule) or ""
    for i, ch in enumerate(comment):
        if ch in " :":
            return comment[:i]
    return comment


def _chain_order(name: str) -> tuple[int, str]:
    if name in _SORTED_CHAINS:
        return (_SORTED_CHAINS.index(name), "")
    return (2 if name.startswith("KUBE-") else 3, name)


def _sort_table(name: str, chains: dict[str, list[str]], deleted: list[str]) -> list[str]:
    order = sorted(chains, key=_chain_order)
    out = [f"*{name}"]
    out.extend(f":{c} - [0:0]" for c in order)
    for c in order:
        rules = chains[c]
        if c in _SORTED_CHAINS:
            rules = sorted(rules, key=lambda r: (_LAST in (comment_of(r) or ""), _service_of(r)))
        out.extend(rules)
    out.extend(f"-X {c}" for c in sorted(deleted))
    out.append("COMMIT")
    return out


def sort_restore_text(text: str) -> str:
    """Return ``text`` in kube-proxy's canonical test order (see the module docstring).

    Raises:
        ValueError: a line outside a table, or a rule for an undeclared chain.
    """
    tables: dict[str, tuple[dict[str, list[str]], list[str]]] = {}
    current: tuple[dict[str, list[str]], list[str]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            current = tables.setdefault(line[1:], ({}, []))
        elif current is None:
            raise ValueError(f"line {number}: {line!r} is outside a table")
        elif line == "COMMIT":
            current = None
        elif line.startswith(":"):
            current[0].setdefault(line[1:].split(" ", 1)[0], [])
        elif line.startswith("-X "):
            current[1].append(line[3:].strip())
        else:
            parts = line.split(" ", 2)
            if len(parts) < 2 or parts[0] not in ("-A", "-I") or parts[1] not in current[0]:
                raise ValueError(f"line {number}: {line!r} is not a rule of a declared chain")
            current[0][parts[1]].append(line)
    lines: list[str] = []
    for name in sorted(tables):
        lines.extend(_sort_table(name, *tables[name]))
    return "\n".join(lines) + "\n"
