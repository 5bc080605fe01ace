"""BPF maps with the kernel's semantics: hash, array, LRU hash, LPM trie, array and hash of maps.

Sources: torvalds/linux ``kernel/bpf/hashtab.c`` (``htab_map_update_elem``: ``BPF_NOEXIST`` on a
present key is ``EEXIST``, ``BPF_EXIST`` on a missing key ``ENOENT``, a full map ``E2BIG``; the
LRU flavour evicts instead of failing), ``kernel/bpf/arraymap.c`` (every index exists, zeroed;
an index past ``max_entries`` is ``E2BIG``, ``BPF_NOEXIST`` is always ``EEXIST``, delete is
``EINVAL``), ``kernel/bpf/lpm_trie.c`` (key = ``u32 prefixlen`` + data, longest-prefix lookup,
exact-prefix delete, ``BPF_F_NO_PREALLOC`` required) and ``kernel/bpf/map_in_map.c`` (values are
inner map fds written from user space, inner maps returned to programs).

Values live in ``bytearray`` objects that a program's pointer (from ``map_lookup_elem``) writes
in place, as a kernel program writes the map value. The LRU here is exact (least recently
looked-up or updated goes first); the kernel's per-CPU LRU lists are approximate, so an LRU map
close to full may evict other entries in the kernel.
"""

from __future__ import annotations

import errno
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum, IntFlag

from emulation.errors import EmulationError

__all__ = [
    "BpfMap",
    "MapError",
    "MapSpec",
    "MapType",
    "UpdateFlag",
    "new_map",
]


class MapError(EmulationError, OSError):
    """A map operation the kernel refuses; ``errno`` is the kernel's."""

    def __init__(self, err: int, message: str) -> None:
        super().__init__(err, f"{message} ({errno.errorcode.get(err, err)})")


class MapType(IntEnum):
    """bpf.h ``enum bpf_map_type`` (the types modelled here)."""

    HASH = 1
    ARRAY = 2
    LRU_HASH = 9
    LPM_TRIE = 11
    ARRAY_OF_MAPS = 12
    HASH_OF_MAPS = 13


class UpdateFlag(IntFlag):
    """``map_update_elem`` flags (bpf.h ``BPF_ANY``, ``BPF_NOEXIST``, ``BPF_EXIST``)."""

    ANY = 0
    NOEXIST = 1
    EXIST = 2


#: bpf.h ``BPF_F_NO_PREALLOC``.
F_NO_PREALLOC = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class MapSpec:
    """What ``BPF_MAP_CREATE`` takes.

    Attributes:
        type: the map type.
        key_size: bytes per key (array maps: 4).
        value_size: bytes per value (maps of maps: 4, an fd).
        max_entries: capacity.
        flags: ``map_flags`` (LPM tries need ``BPF_F_NO_PREALLOC`` = 1).
        name: up to 15 characters, as the kernel keeps it.
        inner: for maps of maps, the spec every inner map must match.
    """

    type: MapType
    key_size: int
    value_size: int
    max_entries: int
    flags: int = 0
    name: str = ""
    inner: MapSpec | None = None

    def __post_init__(self) -> None:
        if self.key_size <= 0 or self.value_size <= 0 or self.max_entries <= 0:
            raise MapError(errno.EINVAL, f"map {self.name!r}: sizes and max_entries must be > 0, got "
                           f"{self.key_size=} {self.value_size=} {self.max_entries=}")
        if self.type in (MapType.ARRAY, MapType.ARRAY_OF_MAPS) and self.key_size != 4:
            raise MapError(errno.EINVAL, f"array map {self.name!r} needs key_size 4, got {self.key_size}")
        of_maps = self.type in (MapType.ARRAY_OF_MAPS, MapType.HASH_OF_MAPS)
        if of_maps and (self.value_size != 4 or self.inner is None):
            raise MapError(errno.EINVAL, f"map of maps {self.name!r} needs value_size 4 and an inner spec")
        if self.type == MapType.LPM_TRIE:
            if not self.flags & F_NO_PREALLOC:
                raise MapError(errno.EINVAL, f"LPM trie {self.name!r} needs BPF_F_NO_PREALLOC")
            if self.key_size <= 4:
                raise MapError(errno.EINVAL, f"LPM trie {self.name!r}: key is u32 prefixlen + data")
        if len(self.name) > 15:
            raise MapError(errno.EINVAL, f"a map name is at most 15 characters, got {self.name!r}")

    def compatible(self, other: MapSpec) -> bool:
        """Whether ``other`` may be an inner map of this spec's inner (type, sizes, flags)."""
        inner = self.inner
        return inner is not None and (inner.type, inner.key_size, inner.value_size, inner.flags) == (
            other.type, other.key_size, other.value_size, other.flags)


class BpfMap:
    """One map. Keys and values are bytes of exactly the spec's sizes.

    Programs see :meth:`lookup_ref` (the stored value, writable in place, or an inner map);
    user space sees :meth:`lookup` (a copy, or an inner map's id for maps of maps).
    """

    def __init__(self, spec: MapSpec, map_id: int) -> None:
        self.spec = spec
        self.id = map_id
        self._data: OrderedDict[bytes, bytearray | BpfMap] = OrderedDict()

    # ---- shared checks -----------------------------------------------------------
    def _check_key(self, key: bytes) -> bytes:
        if len(key) != self.spec.key_size:
            raise MapError(errno.EINVAL, f"map {self.spec.name!r}: key of {len(key)} bytes, "
                           f"expected {self.spec.key_size}")
        return bytes(key)

    def _index(self, key: bytes) -> int:
        return int.from_bytes(self._check_key(key), "little")

    def __len__(self) -> int:
        """The number of entries present (array maps: ``max_entries``)."""
        if self.spec.type == MapType.ARRAY:
            return self.spec.max_entries
        return len(self._data)

    # ---- program side -----------------------------------------------------------
    def lookup_ref(self, key: bytes) -> bytearray | BpfMap | None:
        """The stored value itself (a program's pointer target) or inner map, or None."""
        t = self.spec.type
        if t == MapType.ARRAY:
            i = self._index(key)
            if i >= self.spec.max_entries:
                return None
            return self._data.setdefault(i.to_bytes(4, "little"), bytearray(self.spec.value_size))
        if t == MapType.ARRAY_OF_MAPS:
            i = self._index(key)
            return self._data.get(i.to_bytes(4, "little")) if i < self.spec.max_entries else None
        if t == MapType.LPM_TRIE:
            found = self._lpm_match(self._check_key(key))
            return None if found is None else self._data[found]
        k = self._check_key(key)
        value = self._data.get(k)
        if value is not None and t == MapType.LRU_HASH:
            self._data.move_to_end(k)
        return value

    # ---- user space (and update/delete from programs) --------------------------
    def lookup(self, key: bytes) -> bytes | None:
        """A copy of the value (maps of maps: the inner map's id as u32), or None.

        Raises:
            MapError: a key of the wrong size.
        """
        value = self.lookup_ref(key)
        if value is None:
            return None
        if isinstance(value, BpfMap):
            return value.id.to_bytes(4, "little")
        return bytes(value)

    def update(self, key: bytes, value: bytes | BpfMap, flags: int = UpdateFlag.ANY) -> None:
        """Insert or replace, with the kernel's flag rules.

        Args:
            value: ``value_size`` bytes, or for maps of maps the inner map.

        Raises:
            MapError: EINVAL (sizes, flags, an incompatible inner map), EEXIST, ENOENT, E2BIG.
        """
        k = self._check_key(key)
        if flags not in (UpdateFlag.ANY, UpdateFlag.NOEXIST, UpdateFlag.EXIST):
            raise MapError(errno.EINVAL, f"map {self.spec.name!r}: update {flags=}")
        stored = self._value(value)
        t = self.spec.type
        if t in (MapType.ARRAY, MapType.ARRAY_OF_MAPS):
            i = int.from_bytes(k, "little")
            if i >= self.spec.max_entries:
                raise MapError(errno.E2BIG, f"array {self.spec.name!r}: index {i} >= {self.spec.max_entries}")
            if flags == UpdateFlag.NOEXIST:
                raise MapError(errno.EEXIST, f"array {self.spec.name!r}: every index exists")
            if isinstance(stored, bytearray) and k in self._data:
                target = self._data[k]
                assert isinstance(target, bytearray)
                target[:] = stored  # in place: a program's pointer sees the new value
            else:
                self._data[k] = stored
            return
        if t == MapType.LPM_TRIE:
            k = self._lpm_normal(k)
        present = k in self._data
        if flags == UpdateFlag.NOEXIST and present:
            raise MapError(errno.EEXIST, f"map {self.spec.name!r}: key {k.hex()} exists")
        if flags == UpdateFlag.EXIST and not present:
            raise MapError(errno.ENOENT, f"map {self.spec.name!r}: key {k.hex()} is missing")
        if not present and len(self._data) >= self.spec.max_entries:
            if t != MapType.LRU_HASH:
                raise MapError(errno.E2BIG, f"map {self.spec.name!r} is full ({self.spec.max_entries})")
            self._data.popitem(last=False)
        if present and isinstance(stored, bytearray):
            target = self._data[k]
            assert isinstance(target, bytearray)
            target[:] = stored
        else:
            self._data[k] = stored
        if t == MapType.LRU_HASH:
            self._data.move_to_end(k)

    def delete(self, key: bytes) -> None:
        """Remove an entry.

        Raises:
            MapError: ENOENT when absent; EINVAL for array maps (their entries cannot go).
        """
        k = self._check_key(key)
        if self.spec.type == MapType.ARRAY:
            raise MapError(errno.EINVAL, f"array {self.spec.name!r}: entries cannot be deleted")
        if self.spec.type == MapType.ARRAY_OF_MAPS and int.from_bytes(k, "little") >= self.spec.max_entries:
            raise MapError(errno.E2BIG, f"array {self.spec.name!r}: index out of range")
        if self.spec.type == MapType.LPM_TRIE:
            k = self._lpm_normal(k)
        if k not in self._data:
            raise MapError(errno.ENOENT, f"map {self.spec.name!r}: key {k.hex()} is missing")
        del self._data[k]

    def keys(self) -> Iterator[bytes]:
        """The keys present, as ``BPF_MAP_GET_NEXT_KEY`` walks them (array maps: every index)."""
        if self.spec.type == MapType.ARRAY:
            return (i.to_bytes(4, "little") for i in range(self.spec.max_entries))
        return iter(list(self._data))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value copy)`` for every entry (maps of maps: the inner id)."""
        for k in self.keys():
            v = self.lookup(k)
            if v is not None:
                yield k, v

    # ---- internals ---------------------------------------------------------------
    def _value(self, value: bytes | BpfMap) -> bytearray | BpfMap:
        if self.spec.type in (MapType.ARRAY_OF_MAPS, MapType.HASH_OF_MAPS):
            if not isinstance(value, BpfMap) or not self.spec.compatible(value.spec):
                raise MapError(errno.EINVAL, f"map {self.spec.name!r}: the value must be an inner map "
                               f"matching {self.spec.inner}")
            return value
        if isinstance(value, BpfMap) or len(value) != self.spec.value_size:
            raise MapError(errno.EINVAL, f"map {self.spec.name!r}: value must be "
                           f"{self.spec.value_size} bytes")
        return bytearray(value)

    def _lpm_normal(self, key: bytes) -> bytes:
        """The key with the data bits past its prefix cleared (the trie compares only those)."""
        plen = int.from_bytes(key[:4], "little")
        bits = (self.spec.key_size - 4) * 8
        if plen > bits:
            raise MapError(errno.EINVAL, f"LPM trie {self.spec.name!r}: prefixlen {plen} > {bits}")
        mask = ((1 << plen) - 1) << (bits - plen) if plen else 0
        data = int.from_bytes(key[4:], "big") & mask
        return key[:4] + data.to_bytes(bits // 8, "big")

    def _lpm_match(self, key: bytes) -> bytes | None:
        want = int.from_bytes(key[4:], "big")
        bits = (self.spec.key_size - 4) * 8
        want_len = min(int.from_bytes(key[:4], "little"), bits)
        best: tuple[int, bytes] | None = None
        for k in self._data:
            plen = int.from_bytes(k[:4], "little")
            if plen > want_len:
                continue
            mask = ((1 << plen) - 1) << (bits - plen) if plen else 0
            if (int.from_bytes(k[4:], "big") ^ want) & mask == 0 and (best is None or plen > best[0]):
                best = (plen, k)
        return None if best is None else best[1]


def new_map(spec: MapSpec, map_id: int) -> BpfMap:
    """A new, empty map for ``spec`` with the kernel id ``map_id``."""
    return BpfMap(spec, map_id)
