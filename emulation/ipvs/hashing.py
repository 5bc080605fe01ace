"""The kernel's hash functions that decide which real server a client lands on.

* :func:`hash_32` -- ``include/linux/hash.h`` (generic ``__hash_32``: multiply by
  ``GOLDEN_RATIO_32`` and keep the top ``bits``), used by ``ip_vs_sh.c`` and ``ip_vs_dh.c``.
* :func:`hsiphash` -- ``lib/siphash.c`` on 64-bit kernels, where ``hsiphash`` is SipHash-1-3
  with 64-bit words truncated to 32 bits (``HPREAMBLE``/``HPOSTAMBLE``), used by ``ip_vs_mh.c``.
* :func:`jhash` / :func:`jhash_3words` -- ``include/linux/jhash.h`` (Bob Jenkins' lookup3 as
  the kernel adapted it), used by ``ip_vs_conn.c`` for the connection hash table.
* :func:`fold_address` -- the ``addr_fold`` of ``ip_vs_sh_hashkey``/``ip_vs_mh_hashkey``: an
  IPv4 address as is, an IPv6 address as the XOR of its four 32-bit words.

All values are unsigned 32-bit integers; byte strings are read little-endian, as on x86-64.
"""

from __future__ import annotations

__all__ = [
    "GOLDEN_RATIO_32",
    "JHASH_INITVAL",
    "fold_address",
    "hash_32",
    "hsiphash",
    "hsiphash_u32",
    "jhash",
    "jhash_3words",
]

GOLDEN_RATIO_32 = 0x61C88647
JHASH_INITVAL = 0xDEADBEEF
_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


def hash_32(value: int, bits: int) -> int:
    """``hash_32(val, bits)``: ``(val * 0x61C88647 mod 2**32) >> (32 - bits)``."""
    return ((value * GOLDEN_RATIO_32) & _M32) >> (32 - bits)


def fold_address(version: int, value: int) -> int:
    """``ntohl(addr_fold)``: the IPv4 address, or the XOR of an IPv6 address's 32-bit words."""
    if version == 4:
        return value
    return (value >> 96 ^ value >> 64 ^ value >> 32 ^ value) & _M32


def _rol64(x: int, n: int) -> int:
    return ((x << n) | (x >> (64 - n))) & _M64


def _sipround(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    # SIPHASH_PERMUTATION in include/linux/siphash.h
    v0 = (v0 + v1) & _M64
    v1 = _rol64(v1, 13) ^ v0
    v0 = _rol64(v0, 32)
    v2 = (v2 + v3) & _M64
    v3 = _rol64(v3, 16) ^ v2
    v0 = (v0 + v3) & _M64
    v3 = _rol64(v3, 21) ^ v0
    v2 = (v2 + v1) & _M64
    v1 = _rol64(v1, 17) ^ v2
    v2 = _rol64(v2, 32)
    return v0, v1, v2, v3


def hsiphash(data: bytes, key: tuple[int, int]) -> int:
    """``hsiphash(data, len, key)`` of a 64-bit kernel: SipHash-1-3, low 32 bits of the result.

    ``key`` is the ``hsiphash_key_t`` (two ``unsigned long``); ``lib/siphash.c``
    ``__hsiphash_aligned`` with ``HPREAMBLE(len)`` and ``HPOSTAMBLE``.
    """
    k0, k1 = key
    v0 = 0x736F6D6570736575 ^ k0
    v1 = 0x646F72616E646F6D ^ k1
    v2 = 0x6C7967656E657261 ^ k0
    v3 = 0x7465646279746573 ^ k1
    n = len(data)
    end = n - n % 8
    for i in range(0, end, 8):
        m = int.from_bytes(data[i : i + 8], "little")
        v3 ^= m
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 ^= m
    b = (n << 56 | int.from_bytes(data[end:], "little")) & _M64
    return _hpostamble(v0, v1, v2, v3, b)


def _hpostamble(v0: int, v1: int, v2: int, v3: int, b: int) -> int:
    v3 ^= b
    v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    v0 ^= b
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return (v0 ^ v1 ^ v2 ^ v3) & _M32


def hsiphash_u32(value: int, key: tuple[int, int]) -> int:
    """``hsiphash(&v, sizeof(u32), key)`` for a host-order ``u32`` (as ``ip_vs_mh_hashkey`` calls it)."""
    k0, k1 = key
    return _hpostamble(
        0x736F6D6570736575 ^ k0,
        0x646F72616E646F6D ^ k1,
        0x6C7967656E657261 ^ k0,
        0x7465646279746573 ^ k1,
        4 << 56 | (value & _M32),
    )


def _rol32(x: int, n: int) -> int:
    return ((x << n) | (x >> (32 - n))) & _M32


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    # __jhash_mix
    a = (a - c) & _M32
    a ^= _rol32(c, 4)
    c = (c + b) & _M32
    b = (b - a) & _M32
    b ^= _rol32(a, 6)
    a = (a + c) & _M32
    c = (c - b) & _M32
    c ^= _rol32(b, 8)
    b = (b + a) & _M32
    a = (a - c) & _M32
    a ^= _rol32(c, 16)
    c = (c + b) & _M32
    b = (b - a) & _M32
    b ^= _rol32(a, 19)
    a = (a + c) & _M32
    c = (c - b) & _M32
    c ^= _rol32(b, 4)
    b = (b + a) & _M32
    return a, b, c


def _final(a: int, b: int, c: int) -> int:
    # __jhash_final; returns c
    c ^= b
    c = (c - _rol32(b, 14)) & _M32
    a ^= c
    a = (a - _rol32(c, 11)) & _M32
    b ^= a
    b = (b - _rol32(a, 25)) & _M32
    c ^= b
    c = (c - _rol32(b, 16)) & _M32
    a ^= c
    a = (a - _rol32(c, 4)) & _M32
    b ^= a
    b = (b - _rol32(a, 14)) & _M32
    c ^= b
    return (c - _rol32(b, 24)) & _M32


def jhash(data: bytes, initval: int) -> int:
    """``jhash(key, length, initval)`` (``include/linux/jhash.h``), bytes read little-endian."""
    n = len(data)
    a = b = c = (JHASH_INITVAL + n + initval) & _M32
    i = 0
    while n - i > 12:
        a = (a + int.from_bytes(data[i : i + 4], "little")) & _M32
        b = (b + int.from_bytes(data[i + 4 : i + 8], "little")) & _M32
        c = (c + int.from_bytes(data[i + 8 : i + 12], "little")) & _M32
        a, b, c = _mix(a, b, c)
        i += 12
    tail = data[i:]
    if not tail:
        return c
    tail = tail + bytes(12 - len(tail))
    a = (a + int.from_bytes(tail[0:4], "little")) & _M32
    b = (b + int.from_bytes(tail[4:8], "little")) & _M32
    c = (c + int.from_bytes(tail[8:12], "little")) & _M32
    return _final(a, b, c)


def jhash_3words(a: int, b: int, c: int, initval: int) -> int:
    """``jhash_3words(a, b, c, initval)``: ``__jhash_nwords`` with ``initval + JHASH_INITVAL + 12``."""
    iv = (initval + JHASH_INITVAL + (3 << 2)) & _M32
    return _final((a + iv) & _M32, (b + iv) & _M32, (c + iv) & _M32)
