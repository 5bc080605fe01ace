"""A tiny ``iptables-restore --noflush`` model for tests: chains as lists of rule lines.

Semantics: ``*table`` starts a table; ``:CHAIN`` creates the chain or flushes it; ``-A CHAIN``
appends (the chain must exist); ``-X CHAIN`` deletes it (it must exist); chains not named are
kept. Jumps to chains that do not exist after a restore are errors, as in the kernel.
"""

from __future__ import annotations

from collections.abc import Mapping

Tables = dict[str, dict[str, list[str]]]

BUILTIN_TARGETS = frozenset({"ACCEPT", "DROP", "REJECT", "RETURN", "MARK", "DNAT", "SNAT", "MASQUERADE"})


def apply_noflush(state: Mapping[str, Mapping[str, list[str]]], text: str) -> Tables:
    """Return ``state`` after restoring ``text`` with ``--noflush`` (``state`` is not changed)."""
    out: Tables = {t: {c: list(r) for c, r in chains.items()} for t, chains in state.items()}
    table: dict[str, list[str]] | None = None
    for line in text.splitlines():
        if line.startswith("*"):
            table = out.setdefault(line[1:], {})
        elif line == "COMMIT":
            table = None
        else:
            assert table is not None, f"{line!r} outside a table"
            if line.startswith(":"):
                table[line[1:].split(" ", 1)[0]] = []
            elif line.startswith("-X "):
                del table[line[3:]]
            else:
                op, chain, _ = line.split(" ", 2)
                assert op == "-A" and chain in table, f"rule for a missing chain: {line!r}"
                table[chain].append(line)
    check_jumps(out)
    return out


def check_jumps(tables: Tables) -> None:
    """Every ``-j`` target is a built-in target or an existing chain of the same table."""
    for name, chains in tables.items():
        for rules in chains.values():
            for rule in rules:
                words = rule.split()
                if "-j" in words:
                    target = words[words.index("-j") + 1]
                    assert target in BUILTIN_TARGETS or target in chains, f"{name}: dangling jump in {rule!r}"
