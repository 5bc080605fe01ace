"""Maglev tables against Cilium's published vectors (``pkg/maglev/maglev_test.go``) and the
disruption properties of the Maglev paper (NSDI 2016, section 3.4)."""

from __future__ import annotations

import ipaddress
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.errors import ConfigError, InvalidArgument
from kproxy.modes.ebpf.maglev import (
    MaglevBackend,
    MaglevConfig,
    backend_hash_string,
    lookup_table,
    offset_and_skip,
)


def _mk(i: int) -> str:
    """The identity of ``mkAddr(i)`` in Cilium's test: IPv4 ``i`` (big-endian), port ``i``, TCP."""
    return backend_hash_string(str(ipaddress.ip_address(i)), i % 65535, "TCP")


def _rle(ids: tuple[int, ...]) -> str:
    runs: list[str] = []
    current, count = ids[0], 1
    for x in ids[1:]:
        if x == current:
            count += 1
        else:
            runs.append(f"{current}({count})")
            current, count = x, 1
    runs.append(f"{current}({count})")
    return ",".join(runs)


#: ``TestReproducible``: M=251, default seed, weights 2, 13, 111, 10.
_REPRODUCIBLE = (
    "2(5),3(1),2(3),1(1),2(2),0(1),2(1),3(1),2(1),3(1),2(1),1(1),2(7),1(1),2(14),3(1),2(1),"
    "1(2),2(12),3(1),2(3),1(1),2(4),3(1),2(8),3(1),2(2),1(1),2(16),1(2),2(3),3(1),2(11),1(2),2(4),3(1),2(3),"
    "1(1),2(4),3(1),2(1),0(1),1(1),2(8),1(1),2(7),1(1),2(4),3(1),2(1),3(1),2(9),1(2),2(5),1(1),2(7),3(1),2(1),"
    "3(1),1(1),2(8),1(1),2(4),0(1),2(1),1(1),2(5),3(1),2(3),1(1),2(4),3(1),2(3),1(1),2(12),0(1),3(1),2(3),3(1),"
    "2(4),3(1),2(2),1(1),2(7)")


def test_identity_strings_are_ciliums() -> None:
    assert backend_hash_string("10.0.0.1", 80, "TCP") == "[10.0.0.1:80/TCP,State:active]"
    assert backend_hash_string("fd00::1", 53, "UDP") == "[[fd00::1]:53/UDP,State:active]"
    assert backend_hash_string("10.0.0.1", 80, "TCP", internal=True) == "[10.0.0.1:80/TCP/i,State:active]"


def test_reproducible_table_matches_ciliums_vector() -> None:
    bes = [MaglevBackend(backend_id=i, hash_string=_mk(a), weight=w)
           for i, (a, w) in enumerate([(1, 2), (3, 13), (4, 111), (5, 10)])]
    assert _rle(lookup_table(bes, MaglevConfig(table_size=251))) == _REPRODUCIBLE


def test_weighted_table_with_the_default_seed_and_m_1021_matches_ciliums_counts() -> None:
    bes = [MaglevBackend(backend_id=i + 1, hash_string=_mk(i + 1), weight=w)
           for i, w in enumerate([2, 13, 111, 10])]
    before = lookup_table(bes, MaglevConfig(table_size=1021))
    assert Counter(before) == {1: 16, 2: 98, 3: 832, 4: 75}
    after = lookup_table(bes[1:], MaglevConfig(table_size=1021))
    moved = sum(1 for b, a in zip(before, after, strict=True) if b != 1 and a != b)
    assert set(after) == {2, 3, 4}
    assert moved / 1021 < 0.01


def test_backend_removal_moves_less_than_one_percent_of_the_survivors_slots() -> None:
    bes = [MaglevBackend(backend_id=i, hash_string=_mk(i), weight=1) for i in (1, 2, 3)]
    before = lookup_table(bes, MaglevConfig(table_size=1021))
    after = lookup_table(bes[:2], MaglevConfig(table_size=1021))
    assert set(after) == {1, 2}
    moved = sum(1 for b, a in zip(before, after, strict=True) if b in (1, 2) and a != b)
    assert moved / 1021 < 0.01


def test_permutation_follows_offset_and_skip() -> None:
    m = 251
    offset, skip = offset_and_skip(_mk(7), m, MaglevConfig(table_size=m).seed_murmur)
    assert 0 <= offset < m and 1 <= skip < m
    table = lookup_table([MaglevBackend(backend_id=9, hash_string=_mk(7))], MaglevConfig(table_size=m))
    assert table == (9,) * m


def test_the_seed_and_size_are_validated_as_cilium_does() -> None:
    assert MaglevConfig().table_size == 16381
    assert MaglevConfig().seed_murmur == int.from_bytes(b"\x24\xb7\xef\x82", "big")
    with pytest.raises(ConfigError, match="table-size"):
        MaglevConfig(table_size=1000)
    with pytest.raises(ConfigError, match="12 bytes"):
        MaglevConfig(hash_seed="AAAA")
    with pytest.raises(ConfigError, match="base64"):
        MaglevConfig(hash_seed="not base64!!")
    with pytest.raises(InvalidArgument):
        lookup_table([MaglevBackend(backend_id=1, hash_string="x"),
                      MaglevBackend(backend_id=2, hash_string="x")], MaglevConfig(table_size=251))
    assert lookup_table([], MaglevConfig(table_size=251)) == ()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(min_value=2, max_value=12), gone=st.data())
def test_removing_one_backend_reassigns_its_slots_and_keeps_most_others(n: int, gone: st.DataObject) -> None:
    m = 1021
    bes = [MaglevBackend(backend_id=i + 1, hash_string=_mk(1000 + i)) for i in range(n)]
    victim = gone.draw(st.integers(min_value=0, max_value=n - 1))
    before = lookup_table(bes, MaglevConfig(table_size=m))
    after = lookup_table(bes[:victim] + bes[victim + 1:], MaglevConfig(table_size=m))
    share = Counter(before)
    # Equal weights: every backend holds floor(M/N) or ceil(M/N) slots.
    assert max(share.values()) - min(share.values()) <= 1 and len(share) == n
    assert victim + 1 not in after
    kept = sum(1 for b, a in zip(before, after, strict=True) if b != victim + 1 and a == b)
    survivors = sum(c for bid, c in share.items() if bid != victim + 1)
    assert kept / survivors > 0.9
