"""The map types' semantics, as kernel/bpf/hashtab.c, arraymap.c and lpm_trie.c define them."""

from __future__ import annotations

import errno

import pytest

from emulation.bpf import MapError, MapSpec, MapType, UpdateFlag, new_map


def _hash(kind: MapType = MapType.HASH, max_entries: int = 2) -> object:
    return new_map(MapSpec(type=kind, key_size=4, value_size=4, max_entries=max_entries, name="h"), 1)


def _k(i: int) -> bytes:
    return i.to_bytes(4, "little")


def test_hash_update_flags_follow_the_kernel() -> None:
    """NOEXIST on a present key is EEXIST, EXIST on a missing key ENOENT, a full map E2BIG."""
    m = new_map(MapSpec(type=MapType.HASH, key_size=4, value_size=4, max_entries=2), 1)
    m.update(_k(1), _k(10), UpdateFlag.NOEXIST)
    with pytest.raises(MapError) as e:
        m.update(_k(1), _k(11), UpdateFlag.NOEXIST)
    assert e.value.errno == errno.EEXIST
    with pytest.raises(MapError) as e:
        m.update(_k(2), _k(11), UpdateFlag.EXIST)
    assert e.value.errno == errno.ENOENT
    m.update(_k(2), _k(20))
    with pytest.raises(MapError) as e:
        m.update(_k(3), _k(30))
    assert e.value.errno == errno.E2BIG
    m.update(_k(2), _k(21))  # replacing in a full map is fine
    assert m.lookup(_k(2)) == _k(21)


def test_hash_delete_of_a_missing_key_is_enoent() -> None:
    """Deleting what is not there fails with ENOENT."""
    m = new_map(MapSpec(type=MapType.HASH, key_size=4, value_size=4, max_entries=2), 1)
    with pytest.raises(MapError) as e:
        m.delete(_k(1))
    assert e.value.errno == errno.ENOENT


def test_array_entries_always_exist_zeroed_and_cannot_be_deleted() -> None:
    """An array index below max_entries reads as zeros; past it E2BIG; delete EINVAL."""
    m = new_map(MapSpec(type=MapType.ARRAY, key_size=4, value_size=8, max_entries=4), 1)
    assert m.lookup(_k(3)) == bytes(8)
    assert m.lookup(_k(4)) is None
    with pytest.raises(MapError) as e:
        m.update(_k(4), bytes(8))
    assert e.value.errno == errno.E2BIG
    with pytest.raises(MapError) as e:
        m.update(_k(0), bytes(8), UpdateFlag.NOEXIST)
    assert e.value.errno == errno.EEXIST
    with pytest.raises(MapError) as e:
        m.delete(_k(0))
    assert e.value.errno == errno.EINVAL
    assert len(list(m.keys())) == 4


def test_lru_hash_evicts_the_least_recently_used() -> None:
    """A full LRU map makes room by dropping the entry least recently looked up."""
    m = new_map(MapSpec(type=MapType.LRU_HASH, key_size=4, value_size=4, max_entries=2), 1)
    m.update(_k(1), _k(1))
    m.update(_k(2), _k(2))
    assert m.lookup_ref(_k(1)) is not None  # 1 is now the most recent
    m.update(_k(3), _k(3))
    assert m.lookup(_k(2)) is None and m.lookup(_k(1)) == _k(1) and m.lookup(_k(3)) == _k(3)


def _lpm_key(plen: int, addr: str) -> bytes:
    return plen.to_bytes(4, "little") + bytes(int(x) for x in addr.split("."))


def test_lpm_trie_matches_the_longest_prefix() -> None:
    """A /32 lookup finds the longest stored prefix covering it, or nothing."""
    m = new_map(MapSpec(type=MapType.LPM_TRIE, key_size=8, value_size=1, max_entries=8, flags=1), 1)
    m.update(_lpm_key(8, "10.0.0.0"), b"\x08")
    m.update(_lpm_key(24, "10.1.2.0"), b"\x18")
    assert m.lookup(_lpm_key(32, "10.1.2.3")) == b"\x18"
    assert m.lookup(_lpm_key(32, "10.9.9.9")) == b"\x08"
    assert m.lookup(_lpm_key(32, "11.0.0.1")) is None


def test_lpm_trie_ignores_bits_past_the_prefix_and_needs_no_prealloc() -> None:
    """10.1.2.77/24 is the same entry as 10.1.2.0/24; the trie must be created NO_PREALLOC."""
    m = new_map(MapSpec(type=MapType.LPM_TRIE, key_size=8, value_size=1, max_entries=8, flags=1), 1)
    m.update(_lpm_key(24, "10.1.2.77"), b"\x01")
    m.delete(_lpm_key(24, "10.1.2.0"))
    assert len(m) == 0
    with pytest.raises(MapError):
        MapSpec(type=MapType.LPM_TRIE, key_size=8, value_size=1, max_entries=8)


def test_hash_of_maps_holds_inner_maps_of_the_declared_shape() -> None:
    """An inner map must match the declared inner spec; user space reads back its id."""
    inner_spec = MapSpec(type=MapType.ARRAY, key_size=4, value_size=8, max_entries=1)
    outer = new_map(MapSpec(type=MapType.HASH_OF_MAPS, key_size=2, value_size=4, max_entries=4,
                            inner=inner_spec), 1)
    inner = new_map(inner_spec, 7)
    outer.update(b"\x01\x00", inner)
    assert outer.lookup(b"\x01\x00") == (7).to_bytes(4, "little")
    assert outer.lookup_ref(b"\x01\x00") is inner
    wrong = new_map(MapSpec(type=MapType.ARRAY, key_size=4, value_size=4, max_entries=1), 8)
    with pytest.raises(MapError) as e:
        outer.update(b"\x02\x00", wrong)
    assert e.value.errno == errno.EINVAL


def test_keys_of_the_wrong_size_are_einval() -> None:
    """A key must be exactly key_size bytes."""
    m = new_map(MapSpec(type=MapType.HASH, key_size=4, value_size=4, max_entries=2), 1)
    with pytest.raises(MapError) as e:
        m.lookup(b"\x00")
    assert e.value.errno == errno.EINVAL
