"""``ipset save`` / ``ipset restore`` text.

Lines: ``create NAME TYPE [family inet|inet6] [OPTION [VALUE]]...``, ``add NAME ELEM [comment
"TEXT"]``, ``del NAME ELEM``, ``flush [NAME]``, ``destroy [NAME]``, ``-exist`` (as ``ipset
-exist restore``), ``COMMIT`` (ignored). Output is ``ipset save``'s: per set one ``create``
line (``family`` first for hash types, then the options as created) followed by its ``add``
lines.
"""

from __future__ import annotations

import shlex

from emulation.ipset.errors import IpsetError
from emulation.ipset.ipset import IpsetTable

__all__ = ["format_save", "load_save"]

_VALUED = frozenset({"hashsize", "maxelem", "range", "timeout", "netmask", "bucketsize", "initval",
                     "markmask", "size"})  # fmt: skip
_FLAGS = frozenset({"comment", "counters", "skbinfo", "forceadd"})


def _create(table: IpsetTable, words: list[str], exist: bool) -> None:
    if len(words) < 3:
        raise IpsetError("create needs NAME TYPE")
    name, type_name = words[1], words[2]
    family = 4
    options: list[tuple[str, str | None]] = []
    i = 3
    while i < len(words):
        w = words[i]
        if w == "family":
            if i + 1 >= len(words) or words[i + 1] not in ("inet", "inet6"):
                raise IpsetError("family must be inet or inet6")
            family = 6 if words[i + 1] == "inet6" else 4
            i += 2
        elif w in _VALUED:
            if i + 1 >= len(words):
                raise IpsetError(f"option {w} needs a value")
            options.append((w, words[i + 1]))
            i += 2
        elif w in _FLAGS:
            options.append((w, None))
            i += 1
        else:
            raise IpsetError(f"unknown create option {w!r}")
    if exist and name in table.sets:
        return
    table.create(name, type_name, family=family, options=tuple(options))


def load_save(text: str, table: IpsetTable | None = None, *, exist: bool = False) -> IpsetTable:
    """Apply ``ipset save`` / restore text.

    Raises:
        IpsetError: naming the line, for an unknown command, option or a refused element.
    """
    table = table if table is not None else IpsetTable()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or line == "COMMIT":
            continue
        try:
            words = shlex.split(line)
            if words[0] == "-exist":
                exist = True
                words = words[1:]
                if not words:
                    continue
            cmd = words[0]
            if cmd in ("create", "-N", "n"):
                _create(table, words, exist)
            elif cmd in ("add", "-A", "a", "del", "-D", "d"):
                if len(words) < 3:
                    raise IpsetError(f"{cmd} needs NAME ELEMENT")
                s = table.get(words[1])
                rest = words[3:]
                comment: str | None = None
                if rest[:1] == ["comment"] and len(rest) == 2:
                    comment = rest[1]
                elif rest:
                    raise IpsetError(f"unknown element option(s) {rest}")
                if cmd in ("add", "-A", "a"):
                    s.add(words[2], comment, exist=exist)
                else:
                    s.delete(words[2], exist=exist)
            elif cmd in ("flush", "-F"):
                for s in [table.get(words[1])] if len(words) > 1 else list(table.sets.values()):
                    s.members.clear()
            elif cmd in ("destroy", "-X", "x"):
                if len(words) > 1:
                    table.destroy(words[1])
                else:
                    table.sets.clear()
            else:
                raise IpsetError(f"unknown ipset command {cmd!r}")
        except IpsetError as e:
            raise IpsetError(str(e), line=n, text=line) from None
        except ValueError as e:
            raise IpsetError(str(e), line=n, text=line) from None
    return table


def format_save(table: IpsetTable) -> str:
    """``ipset save`` text of every set, in creation order."""
    out = []
    for s in table.sets.values():
        head = f"create {s.name} {s.stype.name}"
        if not s.stype.is_bitmap:
            head += f" family {'inet6' if s.family == 6 else 'inet'}"
        for k, v in s.options:
            head += f" {k}" if v is None else f" {k} {v}"
        out.append(head)
        for elem, comment in zip(s.elements(), s.members.values(), strict=True):
            out.append(f"add {s.name} {elem}" + (f' comment "{comment}"' if comment is not None else ""))
    return "".join(line + "\n" for line in out)
