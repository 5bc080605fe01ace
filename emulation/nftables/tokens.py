"""Splitting nft text into tokens with their line numbers, as nft's scanner (``src/scanner.l``) does
for the syntax kube-proxy's knftables and ``nft list ruleset`` write.

Words run until whitespace or one of ``{ } ; ,``; a quoted string is one token (quotes kept);
``#`` starts a comment to the end of the line; a newline is a token of its own (it ends a rule
or a command, as ``;`` does). ``.`` and ``:`` are tokens when they stand alone (a
concatenation, a map's ``key : data``), and stay inside a word otherwise (``10.0.0.1:80``).
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.errors import InputError

__all__ = ["NEWLINE", "Token", "tokenize"]

NEWLINE = "\n"
_PUNCT = "{};,"


@dataclass(frozen=True, slots=True)
class Token:
    """One token: its ``text`` and the 1-based ``line`` it is on."""

    text: str
    line: int


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text`` (see the module docstring).

    Raises:
        InputError: a quoted string is not closed on its line.
    """
    out: list[Token] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        i, n = 0, len(raw)
        while i < n:
            c = raw[i]
            if c in " \t\r":
                i += 1
            elif c == "#":
                break
            elif c in _PUNCT:
                out.append(Token(c, number))
                i += 1
            elif c == '"':
                end = raw.find('"', i + 1)
                if end < 0:
                    raise InputError("unterminated string", line=number, text=raw.strip())
                out.append(Token(raw[i : end + 1], number))
                i = end + 1
            else:
                j = i
                while j < n and raw[j] not in " \t\r#" and raw[j] not in _PUNCT:
                    j += 1
                out.append(Token(raw[i:j], number))
                i = j
        out.append(Token(NEWLINE, number))
    return out
