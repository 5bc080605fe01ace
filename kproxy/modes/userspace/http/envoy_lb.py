"""Envoy's ring hash and Maglev load balancers, built exactly as Envoy builds them.

Ring hash (``source/extensions/load_balancing_policies/ring_hash/ring_hash_lb.cc``):

* Weights are normalised (``weight / sum``, ``normalizeHostWeights``); ``scale =
  min(ceil(min_w * min_ring) / min_w, max_ring)`` in IEEE doubles; walking the hosts in the given
  order, ``target += scale * w`` and host ``key`` adds points ``XXH64(f"{key}_{i}")`` while
  ``current < target``. The ring is sorted by hash. With N equal hosts each gets
  ``ceil(min_ring / N)`` points, so a change of N changes every host's point count.
* Lookup (ketama's ``ketama_get_server``): the first point with ``hash >= h``, wrapping to the
  first point. A retry (``attempt > 0``) takes the point ``attempt`` places further on.

Maglev (``source/extensions/load_balancing_policies/maglev/maglev_lb.cc``, the paper's listing 1):

* Hosts are sorted by key; ``offset = XXH64(key, 0) % M``, ``skip = XXH64(key, 1) % (M - 1) + 1``.
  Iterations start at 1; in each, a host takes a turn when ``iteration * w >= target`` (target
  starts at 0 and grows by the largest normalised weight per turn) and claims the next free slot
  of ``(offset + skip * next) % M``. ``M`` must be prime (default 65537, at most 5000011).
* Lookup: ``table[h % M]``; a retry first XORs ``h`` with ``2**64 - attempt``.

A host key is its ``ip:port`` (Envoy's ``address()->asString()``; IPv6 bracketed).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

from kproxy.errors import InvalidArgument
from kproxy.modes.userspace.http.envoy_hash import xxh64

__all__ = [
    "DEFAULT_MAGLEV_TABLE_SIZE",
    "DEFAULT_MAX_RING_SIZE",
    "DEFAULT_MIN_RING_SIZE",
    "MAX_MAGLEV_TABLE_SIZE",
    "Maglev",
    "RingHash",
    "is_prime",
    "normalized_weights",
]

DEFAULT_MIN_RING_SIZE = 1024
DEFAULT_MAX_RING_SIZE = 1024 * 1024 * 8
DEFAULT_MAGLEV_TABLE_SIZE = 65537
MAX_MAGLEV_TABLE_SIZE = 5000011
_MASK64 = (1 << 64) - 1


def is_prime(n: int) -> bool:
    """Trial division (table sizes are at most a few million)."""
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def normalized_weights(hosts: Sequence[tuple[str, int]]) -> list[tuple[str, float]]:
    """``normalizeHostWeights`` for one locality: ``[(key, weight * 1.0 / sum)]`` in host order.

    Raises:
        InvalidArgument: no host, an empty key, or a weight below 1.
    """
    if not hosts:
        raise InvalidArgument("an Envoy hashing balancer needs at least one host: hosts=[]")
    for key, weight in hosts:
        if not key or not isinstance(weight, int) or weight < 1:
            raise InvalidArgument(f"Envoy host {key!r} needs a key and a weight >= 1: {weight=}")
    total = sum(w for _, w in hosts)
    return [(key, w * 1.0 / total) for key, w in hosts]


def _as_hosts(hosts: Sequence[str] | Mapping[str, int] | Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    if isinstance(hosts, Mapping):
        return list(hosts.items())
    return [(h, 1) if isinstance(h, str) else (h[0], h[1]) for h in hosts]


class RingHash:
    """An Envoy ring-hash ring.

    Args:
        hosts: host keys (weight 1), ``{key: weight}`` or ``[(key, weight)]``, in host-set order.
        min_ring_size, max_ring_size: ``minimum_ring_size`` and ``maximum_ring_size``.

    Raises:
        InvalidArgument: no host, or ``min_ring_size > max_ring_size`` (Envoy's config error).
    """

    __slots__ = ("_hashes", "_hosts", "min_ring_size")

    def __init__(self, hosts: Sequence[str] | Mapping[str, int] | Sequence[tuple[str, int]], *,
                 min_ring_size: int = DEFAULT_MIN_RING_SIZE,
                 max_ring_size: int = DEFAULT_MAX_RING_SIZE) -> None:
        if min_ring_size > max_ring_size or min_ring_size < 1:
            raise InvalidArgument(f"ring hash: minimum_ring_size ({min_ring_size}) > maximum_ring_size "
                                  f"({max_ring_size}) or below 1")
        weights = normalized_weights(_as_hosts(hosts))
        min_w = min(w for _, w in weights)
        scale = min(math.ceil(min_w * min_ring_size) / min_w, float(max_ring_size))
        ring: list[tuple[int, str]] = []
        current = target = 0.0
        for key, w in weights:
            target += scale * w
            i = 0
            while current < target:
                ring.append((xxh64(f"{key}_{i}"), key))
                i += 1
                current += 1
        ring.sort(key=lambda p: p[0])
        self._hashes = [h for h, _ in ring]
        self._hosts = [k for _, k in ring]
        self.min_ring_size = min_ring_size

    def __len__(self) -> int:
        return len(self._hashes)

    def points(self) -> list[tuple[int, str]]:
        """The ring, ``[(hash, host key)]`` sorted by hash."""
        return list(zip(self._hashes, self._hosts, strict=True))

    def choose(self, h: int, attempt: int = 0) -> str:
        """The host key for 64-bit hash ``h`` (``Ring::chooseHost``)."""
        i = bisect.bisect_left(self._hashes, h)
        if i == len(self._hashes):
            i = 0
        if attempt > 0:
            i = (i + attempt) % len(self._hashes)
        return self._hosts[i]


class Maglev:
    """An Envoy Maglev table.

    Args:
        hosts: host keys (weight 1), ``{key: weight}`` or ``[(key, weight)]`` (order is irrelevant:
            Envoy sorts by key).
        table_size: ``M``, a prime up to :data:`MAX_MAGLEV_TABLE_SIZE`.

    Raises:
        InvalidArgument: no host, or a table size that is not prime ("The table size of maglev
            must be prime number") or too large.
    """

    __slots__ = ("table", "table_size")

    def __init__(self, hosts: Sequence[str] | Mapping[str, int] | Sequence[tuple[str, int]], *,
                 table_size: int = DEFAULT_MAGLEV_TABLE_SIZE) -> None:
        if not is_prime(table_size) or table_size > MAX_MAGLEV_TABLE_SIZE:
            raise InvalidArgument(f"The table size of maglev must be prime number (at most "
                                  f"{MAX_MAGLEV_TABLE_SIZE}): {table_size=}")
        entries = sorted(normalized_weights(_as_hosts(hosts)))
        max_w = max(w for _, w in entries)
        m = table_size
        offsets = [xxh64(k) % m for k, _ in entries]
        skips = [xxh64(k, 1) % (m - 1) + 1 for k, _ in entries]
        nexts = [0] * len(entries)
        targets = [0.0] * len(entries)
        table: list[int] = [-1] * m
        filled = 0
        iteration = 1
        while filled < m:
            for i, (_, w) in enumerate(entries):
                if filled >= m:
                    break
                if iteration * w < targets[i]:
                    continue
                targets[i] += max_w
                c = (offsets[i] + skips[i] * nexts[i]) % m
                while table[c] != -1:
                    nexts[i] += 1
                    c = (offsets[i] + skips[i] * nexts[i]) % m
                table[c] = i
                nexts[i] += 1
                filled += 1
            iteration += 1
        keys = [k for k, _ in entries]
        self.table: tuple[str, ...] = tuple(keys[i] for i in table)
        self.table_size = m

    def choose(self, h: int, attempt: int = 0) -> str:
        """The host key for 64-bit hash ``h`` (``MaglevTable::chooseHost``)."""
        if attempt > 0:
            h ^= (_MASK64 - attempt + 1) & _MASK64
        return self.table[h % self.table_size]
