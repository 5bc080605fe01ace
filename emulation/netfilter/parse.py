"""Parsing ``iptables-save`` / ``iptables-restore`` text into commands.

:func:`parse_lines` turns the text into :class:`Line` commands (``*table``, ``:CHAIN``,
``-A``/``-I``/``-D``/``-N``/``-X``/``-F``/``-P``, ``COMMIT``), keeping line numbers; it checks
only the framing. :func:`parse_rule` (from :mod:`emulation.netfilter.rulespec`) turns the words
of one rule into a :class:`Rule`. ``iter_commands`` is the same scan yielding light tuples,
for ``apply_restore`` on inputs of hundreds of thousands of lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from emulation.errors import NetfilterError
from emulation.netfilter.rulespec import EXTENSION_TARGETS, parse_rule
from emulation.netfilter.tokens import split_words

__all__ = ["EXTENSION_TARGETS", "Command", "Line", "iter_commands", "parse_lines", "parse_rule"]

_COUNTERS = re.compile(r"\[(\d+):(\d+)\]")
_CHAIN_NAME = re.compile(r"[^\s!]{1,28}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Line:
    """One command of a restore input.

    Attributes:
        kind: ``table``, ``chain``, ``rule`` (``-A``/``-I``/``-D``), ``new``, ``delete``,
            ``flush``, ``policy`` or ``commit``.
        number: 1-based line number; ``text`` the line itself.
        table, chain: what it applies to (``chain`` may be ``""`` for ``-F``/``-X`` of all).
        words: the rest of the words (the rule spec, or ``[policy]``).
        op: for rules, ``-A``, ``-I`` or ``-D``; ``position`` for ``-I n``/``-D n``.
        counters: ``[packets:bytes]`` given on the line.
    """

    kind: str
    number: int
    text: str
    table: str = ""
    chain: str = ""
    words: tuple[str, ...] = ()
    op: str = ""
    position: int | None = None
    counters: tuple[int, int] = (0, 0)


def _chain_arg(words: list[str], i: int, number: int, text: str) -> str:
    if i >= len(words):
        raise NetfilterError("missing chain name", line=number, text=text)
    name = words[i]
    if not _CHAIN_NAME.fullmatch(name) or name.startswith("-"):
        raise NetfilterError(
            f"invalid chain name {name!r} (1-28 characters, no spaces)", line=number, text=text
        )
    return name


class Command(NamedTuple):
    """A :class:`Line` as a plain tuple (same fields, same meaning), cheap to make in bulk."""

    kind: str
    number: int
    text: str
    table: str = ""
    chain: str = ""
    words: tuple[str, ...] = ()
    op: str = ""
    position: int | None = None
    counters: tuple[int, int] = (0, 0)


_RULE_OPS = {"-A": "-A", "--append": "-A", "-I": "-I", "--insert": "-I", "-D": "-D", "--delete": "-D"}
_valid_chain_names: set[str] = set()


def parse_lines(text: str) -> list[Line]:
    """Split restore text into commands, checking its framing.

    Raises:
        NetfilterError: a command outside ``*table ... COMMIT``, a missing ``COMMIT``, an
            unknown command or table, or an unterminated quote (naming the line).
    """
    return [
        Line(
            kind=c.kind,
            number=c.number,
            text=c.text,
            table=c.table,
            chain=c.chain,
            words=c.words,
            op=c.op,
            position=c.position,
            counters=c.counters,
        )
        for c in iter_commands(text)
    ]


def _rule_chain(words: list[str], number: int, raw: str) -> str:
    name = words[1] if len(words) > 1 else ""
    if name in _valid_chain_names:
        return name
    name = _chain_arg(words, 1, number, raw)
    if len(_valid_chain_names) < 1 << 20:
        _valid_chain_names.add(name)
    return name


def iter_commands(text: str) -> Iterator[Command]:
    """:func:`parse_lines` as a generator of :class:`Command` tuples (same checks, same errors)."""
    table = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        first = line[0]
        if first == "-" and table:
            # The common case: a rule, then -N/-X/-F/-P (below, after the framing checks).
            try:
                words = split_words(line)
            except NetfilterError as e:
                raise NetfilterError(str(e), line=number, text=raw) from None
            op = _RULE_OPS.get(words[0])
            if op is not None:
                yield _rule_command(words, op, number, raw, table, (0, 0))
                continue
        elif first == "*":
            if table:
                raise NetfilterError(f"*{line[1:]} before COMMIT of table {table}", line=number, text=raw)
            table = line[1:].strip()
            if table not in ("raw", "mangle", "filter", "nat", "security"):
                raise NetfilterError(f"unknown table {table!r}", line=number, text=raw)
            yield Command("table", number, raw, table)
            continue
        if not table:
            raise NetfilterError("command outside a *table ... COMMIT block", line=number, text=raw)
        if line == "COMMIT":
            yield Command("commit", number, raw, table)
            table = ""
            continue
        if first == ":":
            parts = line[1:].split()
            if len(parts) not in (2, 3):
                raise NetfilterError("expected ':CHAIN POLICY [packets:bytes]'", line=number, text=raw)
            counters = (0, 0)
            if len(parts) == 3 and parts[2] != "[0:0]":
                m = _COUNTERS.fullmatch(parts[2])
                if not m:
                    raise NetfilterError(f"bad counters {parts[2]!r}", line=number, text=raw)
                counters = (int(m[1]), int(m[2]))
            name = _chain_arg(parts, 0, number, raw)
            yield Command("chain", number, raw, table, name, (parts[1],), counters=counters)
            continue
        try:
            words = split_words(line)
        except NetfilterError as e:
            raise NetfilterError(str(e), line=number, text=raw) from None
        counters = (0, 0)
        if words and words[0][:1] == "[":
            m = _COUNTERS.fullmatch(words[0])
            if m:
                counters = (int(m[1]), int(m[2]))
                words = words[1:]
        if not words:
            raise NetfilterError("empty command", line=number, text=raw)
        cmd = words[0]
        op = _RULE_OPS.get(cmd)
        if op is not None:
            yield _rule_command(words, op, number, raw, table, counters)
        elif cmd in ("-N", "--new-chain"):
            yield Command("new", number, raw, table, _chain_arg(words, 1, number, raw))
        elif cmd in ("-X", "--delete-chain", "-F", "--flush"):
            chain = _chain_arg(words, 1, number, raw) if len(words) > 1 else ""
            kind = "delete" if cmd in ("-X", "--delete-chain") else "flush"
            yield Command(kind, number, raw, table, chain)
        elif cmd in ("-P", "--policy"):
            if len(words) != 3:
                raise NetfilterError("expected -P CHAIN ACCEPT|DROP", line=number, text=raw)
            yield Command("policy", number, raw, table, words[1], (words[2],))
        else:
            raise NetfilterError(
                f"unknown command {cmd!r}; expected -A, -I, -D, -N, -X, -F, -P or COMMIT",
                line=number,
                text=raw,
            )
    if table:
        raise NetfilterError(f"table {table} is missing its COMMIT line")


def _rule_command(
    words: list[str], op: str, number: int, raw: str, table: str, counters: tuple[int, int]
) -> Command:
    chain = _rule_chain(words, number, raw)
    rest = words[2:]
    position = None
    if op != "-A" and rest and rest[0].isdigit():
        position = int(rest[0])
        rest = rest[1:]
        if position < 1:
            raise NetfilterError(f"rule number {position} must be at least 1", line=number, text=raw)
    return Command("rule", number, raw, table, chain, tuple(rest), op, position, counters)
