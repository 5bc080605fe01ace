"""The address table's outputs: the changes logged at each apply, and the JSON map file.

:func:`table_changes` tells what changed between two tables (entries added, removed and moved) for
the one log line of an apply; :func:`check_map_path` refuses an ``--address-map`` that can never
be written, at start-up; :func:`write_atomically` replaces the map file in one step.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kproxy.errors import ConfigError
from kproxy.model.names import join_host_port

if TYPE_CHECKING:
    from kproxy.modes.userspace.proxy import AddressEntry

__all__ = ["ADDRESS_MAP_MODE", "TABLE_CHANGES_SHOWN", "check_map_path", "table_changes", "write_atomically"]


#: Entries named per kind in the address-table log line; the rest are counted ("and 180 more").
TABLE_CHANGES_SHOWN = 10


def table_changes(old: Sequence[AddressEntry], new: Sequence[AddressEntry]) -> dict[str, list[str]]:
    """What changed between two address tables, for the log: ``{"added"|"removed"|"moved": [text]}``.

    An entry is keyed by (service, protocol, ClusterIP); ``moved`` is a key whose listen address
    changed. Each list names at most :data:`TABLE_CHANGES_SHOWN` entries, then ``"and N more"``;
    empty kinds are left out.
    """
    def key(e: AddressEntry) -> tuple[str, str, str]:
        return (e.service, e.protocol, e.cluster_ip)

    before, after = {key(e): e for e in old}, {key(e): e for e in new}
    changes = {
        "added": [f"{e.service} {e.protocol} {join_host_port(e.cluster_ip, e.port)} at {e.listen}"
                  for k, e in after.items() if k not in before],
        "removed": [f"{e.service} {e.protocol} {join_host_port(e.cluster_ip, e.port)} was at {e.listen}"
                    for k, e in before.items() if k not in after],
        "moved": [f"{e.service} {e.protocol} {before[k].listen} -> {e.listen}"
                  for k, e in after.items() if k in before and before[k].listen != e.listen],
    }
    out = {}
    for kind, lines in changes.items():
        if lines:
            extra = len(lines) - TABLE_CHANGES_SHOWN
            out[kind] = lines[:TABLE_CHANGES_SHOWN] + ([f"and {extra} more"] if extra > 0 else [])
    return out


#: Mode of the address map file, less the process umask (applied by open(2)): world-readable.
ADDRESS_MAP_MODE = 0o644


def check_map_path(path: str) -> None:
    """Refuse an address map path that can never be written: a folder, or in a missing folder.

    Raises:
        ConfigError: naming ``--address-map``, the path and the fix.
    """
    if os.path.isdir(path):
        raise ConfigError(f"--address-map: {path!r} is a folder; give the path of a file to write "
                          f"the address table to, e.g. {os.path.join(path, 'addresses.json')!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"--address-map: folder {folder!r} of {path!r} does not exist; create it first")


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same directory and ``os.replace``.

    The temp file is created with :data:`ADDRESS_MAP_MODE` (the kernel removes the umask bits),
    where ``mkstemp`` would give 0600 and hide the map from other users.
    """
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for attempt in itertools.count():
        tmp = os.path.join(directory, f".{base}.{os.getpid()}.{attempt}.tmp")
        try:
            fd = os.open(tmp, flags, ADDRESS_MAP_MODE)
        except FileExistsError:  # left over by a crashed process with the same pid
            if attempt >= 100:
                raise
            continue
        break
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
