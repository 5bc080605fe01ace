"""Splitting ``iptables-restore`` lines into words and quoting words back for ``iptables-save``.

Both follow iptables userspace: the restore tokenizer (``add_param_to_argv`` in
iptables/xshared.c) knows only double quotes, with backslash escapes inside them; single quotes
are ordinary characters. ``xtables_save_string`` (libxtables/xtables.c) prints a value bare when
it is non-empty and made only of ``[A-Za-z0-9_-]``, else in double quotes with ``" \\ '``
escaped by a backslash.
"""

from __future__ import annotations

import re

from emulation.errors import NetfilterError

__all__ = ["quote", "split_words"]

_BARE = re.compile(r"[A-Za-z0-9_\-]+")


_QUOTED_OR_BARE = re.compile(r'([^ \t\r\n"]*)"((?:[^"\\]|\\.)*)"|[^ \t\r\n"]+', re.DOTALL)
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


def split_words(line: str) -> list[str]:
    """Split one restore line into words.

    Words are separated by spaces, tabs, CR and LF. A double quote starts a quoted part that
    runs to the next unescaped double quote (``\\`` escapes any character inside) and ends
    the word there: ``a"b c"d`` is the two words ``ab c`` and ``d``.

    Raises:
        NetfilterError: an unterminated double quote.
    """
    if '"' not in line:
        if line.isascii() and line.isprintable():
            return line.split()  # no tab, CR, LF nor the other separators str.split knows
        if "\t" in line or "\r" in line or "\n" in line:
            line = line.replace("\t", " ").replace("\r", " ").replace("\n", " ")
        return [w for w in line.split(" ") if w]
    words: list[str] = []
    end = 0
    for m in _QUOTED_OR_BARE.finditer(line):
        if '"' in line[end : m.start()]:
            raise NetfilterError("unterminated double quote")
        end = m.end()
        inner = m.group(2)
        if inner is None:
            words.append(m.group(0))
        else:
            words.append(m.group(1) + (_ESCAPE.sub(r"\1", inner) if "\\" in inner else inner))
    if '"' in line[end:]:
        raise NetfilterError("unterminated double quote")
    return words


def quote(value: str) -> str:
    """Quote a free-text value (a comment, a log prefix) as iptables-save prints it."""
    if _BARE.fullmatch(value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("'", "\\'")
    return f'"{escaped}"'
