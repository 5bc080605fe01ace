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


def split_words(line: str) -> list[str]:
    """Split one restore line into words.

    Raises:
        NetfilterError: an unterminated double quote.
    """
    words: list[str] = []
    buf: list[str] = []
    in_word = False
    quoted = False
    escaped = False
    for ch in line:
        if quoted:
            if escaped:
                buf.append(ch)
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
                words.append("".join(buf))
                buf, in_word = [], False
            else:
                buf.append(ch)
            continue
        if ch == '"':
            quoted, in_word = True, True
        elif ch in " \t\r\n":
            if in_word:
                words.append("".join(buf))
                buf, in_word = [], False
        else:
            buf.append(ch)
            in_word = True
    if quoted:
        raise NetfilterError("unterminated double quote")
    if in_word:
        words.append("".join(buf))
    return words


def quote(value: str) -> str:
    """Quote a free-text value (a comment, a log prefix) as iptables-save prints it."""
    if _BARE.fullmatch(value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("'", "\\'")
    return f'"{escaped}"'
