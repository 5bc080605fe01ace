"""Maglev lookup tables exactly as Cilium's ``pkg/maglev`` computes them.

The theory, from ``maglev.go`` (and the Maglev paper, NSDI 2016, section 3.4):

- Every backend has an identity string that never changes (``setHashString``):
  ``[ip:port/PROTO,State:active]``, ``[[ip6]:port/PROTO,State:active]``, with ``/i`` after the
  protocol for an internal-scope address and ``@cluster`` after the address for a ClusterMesh
  backend. Backends are sorted by it, so every node builds the same table although backend ids
  are node-local.
- ``h1, h2 = MurmurHash3_x64_128(identity, seed)`` with the seed's first big-endian word;
  ``offset = h1 % M`` and ``skip = h2 % (M - 1) + 1``; backend ``i`` prefers the slots
  ``(offset + j * skip) % M`` in order.
- The table is filled in ``M`` turns: turn ``n`` starts at backend ``n % N``, which claims its
  next free preferred slot. With weights (only when ``sum(w) // N > 1``, integer division), a
  backend whose ``(n + 1) * w < trunc(counter)`` passes its turn to the next one; a backend
  that takes a turn adds ``sum(w)`` to its counter, which starts at ``w / N`` (a float).
  Kubernetes backends all weigh 100 (``DefaultBackendWeight``), so no turn is ever skipped.

Only the table sizes of :data:`SUPPORTED_TABLE_SIZES` are accepted, and the seed must be
base64 of exactly 12 bytes (``UserConfig.ToConfig``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass

import mmh3

from kproxy.config.defaults import DEFAULT_MAGLEV_HASH_SEED, DEFAULT_MAGLEV_TABLE_SIZE, MAGLEV_TABLE_SIZES
from kproxy.errors import ConfigError, InvalidArgument
from kproxy.model import Protocol

__all__ = [
    "DEFAULT_BACKEND_WEIGHT",
    "DEFAULT_HASH_SEED",
    "DEFAULT_TABLE_SIZE",
    "SUPPORTED_TABLE_SIZES",
    "MaglevBackend",
    "MaglevConfig",
    "backend_hash_string",
    "lookup_table",
    "offset_and_skip",
]

#: ``maglev.DefaultTableSize``.
DEFAULT_TABLE_SIZE = DEFAULT_MAGLEV_TABLE_SIZE
#: ``maglev.DefaultHashSeed`` (``head -c12 /dev/urandom | base64 -w0``).
DEFAULT_HASH_SEED = DEFAULT_MAGLEV_HASH_SEED
#: ``maglevSupportedTableSizes``: primes, each about twice the one before.
SUPPORTED_TABLE_SIZES = MAGLEV_TABLE_SIZES
#: ``loadbalancer.DefaultBackendWeight``.
DEFAULT_BACKEND_WEIGHT = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class MaglevConfig:
    """``--bpf-lb-maglev-table-size`` and ``--bpf-lb-maglev-hash-seed``, validated.

    Attributes:
        table_size: M, one of :data:`SUPPORTED_TABLE_SIZES`.
        hash_seed: base64 of 12 bytes.
        seed_murmur, seed_jhash0, seed_jhash1: the three big-endian words of the seed (the
            permutation's murmur3 seed, and the datapath's ``HASH_INIT4_SEED``/``HASH_INIT6_SEED``).

    Raises:
        ConfigError: a table size Cilium refuses, or a seed that is not base64 of 12 bytes
            (the message names the flag, as Cilium's does).
    """

    table_size: int = DEFAULT_TABLE_SIZE
    hash_seed: str = DEFAULT_HASH_SEED
    seed_murmur: int = 0
    seed_jhash0: int = 0
    seed_jhash1: int = 0

    def __post_init__(self) -> None:
        if self.table_size not in SUPPORTED_TABLE_SIZES:
            raise ConfigError(f"invalid value for --bpf-lb-maglev-table-size: {self.table_size}, "
                              f"supported values are: {list(SUPPORTED_TABLE_SIZES)}")
        try:
            raw = base64.b64decode(self.hash_seed, validate=True)
        except (binascii.Error, ValueError) as err:
            raise ConfigError(f"--bpf-lb-maglev-hash-seed: cannot decode base64 Maglev hash seed "
                              f"{self.hash_seed!r}: {err}") from err
        if len(raw) != 12:
            raise ConfigError(f"--bpf-lb-maglev-hash-seed: decoded hash seed is {len(raw)} bytes "
                              "(not 12 bytes); make one with: head -c12 /dev/urandom | base64 -w0")
        words = [int.from_bytes(raw[i:i + 4], "big") for i in (0, 4, 8)]
        object.__setattr__(self, "seed_murmur", words[0])
        object.__setattr__(self, "seed_jhash0", words[1])
        object.__setattr__(self, "seed_jhash1", words[2])


def backend_hash_string(address: str, port: int, protocol: Protocol | str, *,
                        internal: bool = False, cluster_id: int = 0) -> str:
    """A backend's Maglev identity, as ``BackendInfo.setHashString`` writes it.

    ``address`` must be canonical (as the model keeps addresses); ``protocol`` is ``TCP``,
    ``UDP`` or ``SCTP``.
    """
    host = f"{address}@{cluster_id}" if cluster_id else address
    host = f"[{host}]" if ":" in address else host
    scope = "/i" if internal else ""
    return f"[{host}:{port}/{protocol}{scope},State:active]"


@dataclass(frozen=True, slots=True, kw_only=True)
class MaglevBackend:
    """One backend of a Maglev table (Cilium's ``maglev.BackendInfo``).

    Attributes:
        backend_id: the value written into the table (the node-local backend id).
        hash_string: the identity hashed and sorted on (:func:`backend_hash_string`).
        weight: 1..65535; 0 (maintenance) is refused, Cilium leaves such backends out.
    """

    backend_id: int
    hash_string: str
    weight: int = DEFAULT_BACKEND_WEIGHT

    def __post_init__(self) -> None:
        if not 1 <= self.weight <= 0xFFFF:
            raise InvalidArgument(f"MaglevBackend weight={self.weight} must be 1..65535")


def offset_and_skip(hash_string: str, table_size: int, seed: int) -> tuple[int, int]:
    """``getOffsetAndSkip``: ``(h1 % M, h2 % (M - 1) + 1)`` of murmur3 x64_128."""
    h1, h2 = mmh3.hash64(hash_string.encode(), seed, x64arch=True, signed=False)
    return h1 % table_size, h2 % (table_size - 1) + 1


def lookup_table(backends: Iterable[MaglevBackend], config: MaglevConfig) -> tuple[int, ...]:
    """The Maglev table: M backend ids, as ``Maglev.GetLookupTable`` computes them.

    Args:
        backends: the backends (any order; duplicates of one identity are refused).
        config: the table size and seed.

    Returns:
        ``M`` backend ids; empty when there is no backend (Cilium then deletes the table).

    Raises:
        InvalidArgument: two backends share an identity string.
    """
    bes = sorted(backends, key=lambda b: b.hash_string)
    if not bes:
        return ()
    if len({b.hash_string for b in bes}) != len(bes):
        raise InvalidArgument("Maglev backends must have distinct identity strings")
    m = config.table_size
    count = len(bes)
    offsets: list[int] = []
    skips: list[int] = []
    for be in bes:
        offset, skip = offset_and_skip(be.hash_string, m, config.seed_murmur)
        offsets.append(offset)
        skips.append(skip)
    weights = [b.weight for b in bes]
    weight_sum = sum(weights)
    counters = [w / count for w in weights]
    weights_used = weight_sum // count > 1
    nexts = [0] * count
    entry = [-1] * m
    ids = [b.backend_id for b in bes]
    for n in range(m):
        i = n % count
        if weights_used:
            # Pass the turn on while this backend is ahead of its share; each backend's
            # counter grows by weight_sum per turn taken, so at most N passes happen.
            while (n + 1) * weights[i] < int(counters[i]):
                i = (i + 1) % count
            counters[i] += weight_sum
        offset, skip, j = offsets[i], skips[i], nexts[i]
        c = (offset + j * skip) % m
        while entry[c] >= 0:
            j += 1
            c = (offset + j * skip) % m
        entry[c] = ids[i]
        nexts[i] = j + 1
    return tuple(entry)
