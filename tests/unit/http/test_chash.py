"""lua-resty-balancer's resty.chash ring, as ingress-nginx's balanced affinity and upstream-hash-by use it."""

from __future__ import annotations

import math
import struct
import zlib
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kproxy.errors import InvalidArgument
from kproxy.modes.userspace.http.chash import CONSISTENT_POINTS, RestyChash

node_ids = st.builds(lambda a, b, p: f"10.{a}.{b}.1:{p}", st.integers(0, 255), st.integers(0, 255),
                     st.integers(1, 65535))


def _reference_find(nodes: dict[str, int], key: str) -> str:
    """chash.c + chash.lua written out literally: C-style CRC update, then ``_find_id``'s index scan."""
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        table.append(c)

    def update(crc: int, data: bytes) -> int:
        for b in data:
            crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
        return crc

    points = []
    for node in sorted(nodes):
        base = update(0xFFFFFFFF, node.encode())  # bxor(crc32(id), 0xffffffff): the unfinalised state
        prev = 0
        for _ in range(CONSISTENT_POINTS * nodes[node]):
            h = update(base, struct.pack("<I", prev)) ^ 0xFFFFFFFF
            points.append((h, node))
            prev = h
    points.sort(key=lambda p: p[0])
    h = update(0xFFFFFFFF, key.encode("latin-1")) ^ 0xFFFFFFFF
    n = len(points)
    index = min(math.floor(h / (2**32 / n)), n - 1)
    if points[index][0] >= h:
        for i in range(index, 0, -1):
            if points[i - 1][0] < h:
                return points[i][1]
        return points[0][1]
    for i in range(index + 1, n):
        if h <= points[i][0]:
            return points[i][1]
    return points[0][1]


def test_published_distribution_of_lua_resty_balancer_chash_t_test_1() -> None:
    """Nodes weighted 10, 2 and 1 and keys 1..100000 split 77075 / 14743 / 8182 over 2080 points."""
    ring = RestyChash({"server1": 10, "server2": 2, "server3": 1})
    counts = Counter(ring.find(str(i)) for i in range(1, 100_001))
    assert counts == {"server1": 77075, "server2": 14743, "server3": 8182}
    assert ring.npoints == 2080


def test_first_point_is_crc32_of_id_and_four_zero_bytes() -> None:
    """Point k hashes the id followed by point k-1 in little endian, starting from zero."""
    ring = RestyChash({"10.0.0.1:80": 1})
    first = zlib.crc32(b"10.0.0.1:80" + b"\0\0\0\0")
    second = zlib.crc32(b"10.0.0.1:80" + struct.pack("<I", first))
    assert first in ring._hashes and second in ring._hashes
    assert ring.npoints == CONSISTENT_POINTS


def test_any_key_maps_to_a_node_even_one_no_node_produced() -> None:
    """A tampered key still lands on a node (ingress-nginx#3317: balanced cookies are never rejected)."""
    ring = RestyChash({"10.0.0.1:80": 1, "10.0.0.2:80": 1})
    assert ring.find("not-a-real-key\x00\xff") in {"10.0.0.1:80", "10.0.0.2:80"}


def test_removing_a_node_moves_only_its_keys() -> None:
    """Each node's points depend on its id alone, so only the removed node's keys move."""
    nodes = {f"10.0.0.{i}:8080": 1 for i in range(1, 6)}
    before = RestyChash(nodes)
    after = RestyChash({k: 1 for k in nodes if k != "10.0.0.3:8080"})
    for i in range(5000):
        old = before.find(f"k{i}")
        if old != "10.0.0.3:8080":
            assert after.find(f"k{i}") == old


def test_empty_or_bad_weights_are_refused() -> None:
    """A ring needs a node with a positive integer weight."""
    with pytest.raises(InvalidArgument):
        RestyChash({})
    with pytest.raises(InvalidArgument):
        RestyChash({"a": 0})


@given(nodes=st.dictionaries(node_ids, st.integers(1, 2), min_size=1, max_size=4),
       key=st.text(st.characters(max_codepoint=255), min_size=1, max_size=40))
def test_find_equals_the_literal_c_and_lua_reference(nodes: dict[str, int], key: str) -> None:
    """For any node set and header-byte key, the bisect lookup picks what chash.c and _find_id pick."""
    assert RestyChash(nodes).find(key) == _reference_find(nodes, key)
