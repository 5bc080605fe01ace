"""lua-resty-balancer's ``resty.chash``: the CRC32 consistent-hash ring of ingress-nginx.

Theory of operation (openresty/lua-resty-balancer ``lib/resty/chash.lua`` and ``chash.c`` at
1cd4363, the version ingress-nginx vendors):

* A node ``id`` (ingress-nginx passes ``"<address>:<port>"``, weight 1) owns ``160 * weight``
  points (``CONSISTENT_POINTS``). The base hash is the CRC32 of the id with its final
  complement undone (``bxor(crc32(id), 0xffffffff)``), so point ``k`` is the CRC32 of the id
  followed by the four little-endian bytes of point ``k - 1`` (0 for the first): in Python,
  ``zlib.crc32(id + prev.to_bytes(4, "little"))``.
* The points are sorted by hash (``chash_point_sort``); a lookup hashes ``tostring(key)`` with
  CRC32 and takes the first point whose hash is ``>=`` it, wrapping to the first point
  (``_find_id``: "find the first points >= hash").
* Ties between equal point hashes keep insertion order in chash.c, and insertion order comes from
  Lua's ``pairs()``, which is not specified. Here nodes are inserted in sorted id order, so the
  ring is a function of the node set alone (a CRC32 tie among a few thousand points is rare).

lua-resty-balancer's ``t/chash.t`` TEST 1 (nodes ``server1``, ``server2``, ``server3`` weighted
10, 2 and 1; keys ``1`` to ``100000``) gives 77075 / 14743 / 8182 and 2080 points; the unit tests
check exactly that.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Mapping

from kproxy.errors import InvalidArgument

__all__ = ["CONSISTENT_POINTS", "RestyChash", "crc32", "wire_bytes"]

#: Points per unit of weight (``CONSISTENT_POINTS`` in chash.lua).
CONSISTENT_POINTS = 160


def wire_bytes(text: str | bytes) -> bytes:
    """The bytes nginx would see for ``text``.

    The HTTP plane decodes header bytes as latin-1, so text of code points below 256 is encoded
    back as latin-1 (the bytes on the wire); other text (only from a library caller) as UTF-8,
    lone surrogates passed through.
    """
    if isinstance(text, bytes):
        return text
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def crc32(data: str | bytes) -> int:
    """Return nginx's ``ngx.crc32_short`` of ``data`` (the standard CRC-32, as an unsigned int).

    Args:
        data: bytes, or text turned into bytes by :func:`wire_bytes`.
    """
    return zlib.crc32(wire_bytes(data))


class RestyChash:
    """An immutable ``resty.chash`` ring over weighted node ids.

    Args:
        nodes: ``{id: weight}``; ids are non-empty strings, weights positive ints.

    Raises:
        InvalidArgument: no node, an empty id, or a weight that is not a positive int.
    """

    __slots__ = ("_hashes", "_ids", "_nodes")

    def __init__(self, nodes: Mapping[str, int]) -> None:
        if not nodes:
            raise InvalidArgument("RestyChash needs at least one node: nodes={} (ingress-nginx "
                                  "answers 503 before it would build a balancer with none)")
        points: list[tuple[int, int]] = []
        ids = sorted(nodes)
        for index, node_id in enumerate(ids):
            weight = nodes[node_id]
            if not node_id or not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
                raise InvalidArgument(f"RestyChash node {node_id!r} needs a positive int weight: {weight=}")
            raw = wire_bytes(node_id)
            prev = 0
            for _ in range(CONSISTENT_POINTS * weight):
                prev = zlib.crc32(raw + prev.to_bytes(4, "little"))
                points.append((prev, index))
        points.sort(key=lambda p: p[0])  # stable: ties keep insertion (sorted id) order
        self._hashes = [h for h, _ in points]
        self._ids = [ids[i] for _, i in points]
        self._nodes = dict(nodes)

    @property
    def npoints(self) -> int:
        """The number of points on the ring (``chash.npoints``): 160 times the total weight."""
        return len(self._hashes)

    @property
    def nodes(self) -> Mapping[str, int]:
        """A copy of the ``{id: weight}`` the ring was built from."""
        return dict(self._nodes)

    def find(self, key: str | bytes) -> str:
        """Return the node id for ``key``: the first point at or after ``crc32(key)``, wrapping.

        Any key, even one no node ever produced (a tampered cookie), maps to some node, as in
        ``resty.chash``'s ``find``.
        """
        h = crc32(key)
        i = bisect.bisect_left(self._hashes, h)
        return self._ids[0 if i == len(self._hashes) else i]
