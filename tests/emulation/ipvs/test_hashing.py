"""The kernel's hash functions, checked against their published test vectors."""

from __future__ import annotations

import struct

import pytest

from emulation.ipvs import fold_address, hash_32, hsiphash, hsiphash_u32, jhash, jhash_3words

# lib/test_siphash.c (64-bit): test_key_hsiphash and test_vectors_hsiphash[0..63], input 00 01 .. n-1.
KEY = (0x0706050403020100, 0x0F0E0D0C0B0A0908)
HSIPHASH_VECTORS = [
    0x050FC4DC, 0x7D57CA93, 0x4DC7D44D, 0xE7DDF7FB, 0x88D38328, 0x49533B67, 0xC59F22A7, 0x9BB11140,
    0x8D299A8E, 0x6C063DE4, 0x92FF097F, 0xF94DC352, 0x57B4D9A2, 0x1229FFA7, 0xC0F95D34, 0x2A519956,
    0x7D908B66, 0x63DBD80C, 0xB473E63E, 0x8D297D1C, 0xA6CCE040, 0x2B45F844, 0xA320872E, 0xDAE6C123,
    0x67349C8C, 0x705B0979, 0xCA9913A5, 0x4ADE3B35, 0xEF6CD00D, 0x4AB1E1F4, 0x43C5E663, 0x8C21D1BC,
    0x16A7B60D, 0x7A8FF9BF, 0x1F2A753E, 0xBF186B91, 0xADA26206, 0xA3C33057, 0xAE3A36A1, 0x7B108392,
    0x99E41531, 0x3F1AD944, 0xC8138825, 0xC28949A6, 0xFAF8876B, 0x9F042196, 0x68B1D623, 0x8B5114FD,
    0xDF074C46, 0x12CC86B3, 0x0A52098F, 0x9D292F9A, 0xA2F41F12, 0x43A71ED0, 0x73F0BCE6, 0x70A7E980,
    0x243C6D75, 0xFDB71513, 0xA67D8A08, 0xB7E8F148, 0xF7A644EE, 0x0F1837F2, 0x4B6694E0, 0xB7BBB3A8,
]  # fmt: skip


@pytest.mark.parametrize("n", range(64))
def test_hsiphash_matches_kernel_vector(n: int) -> None:
    """hsiphash of bytes 0..n-1 equals lib/test_siphash.c's 64-bit vector n."""
    assert hsiphash(bytes(range(n)), KEY) == HSIPHASH_VECTORS[n]


def test_hsiphash_u32_is_hsiphash_of_four_le_bytes() -> None:
    """hsiphash_u32(v) is hsiphash(&v, 4) on a little-endian host (vector 4: bytes 00 01 02 03)."""
    assert hsiphash_u32(0x03020100, KEY) == HSIPHASH_VECTORS[4]


@pytest.mark.parametrize(
    ("data", "initval", "expected"),
    [
        (b"", 0, 0xDEADBEEF),
        (b"", 0xDEADBEEF, 0xBD5B7DDE),
        (b"Four score and seven years ago", 0, 0x17770551),
        (b"Four score and seven years ago", 1, 0xCD628161),
    ],
)
def test_jhash_matches_lookup3_driver_vectors(data: bytes, initval: int, expected: int) -> None:
    """jhash equals Bob Jenkins' lookup3 hashlittle on its published driver vectors."""
    assert jhash(data, initval) == expected


def test_jhash_3words_equals_jhash_of_twelve_bytes() -> None:
    """jhash_3words(a, b, c) is jhash over the three words' little-endian bytes (same init and final)."""
    a, b, c, iv = 0x0A000005, 0x9C40, 6, 0x12345678
    assert jhash_3words(a, b, c, iv) == jhash(struct.pack("<3I", a, b, c), iv)


def test_hash_32_takes_the_top_bits_of_the_golden_ratio_product() -> None:
    """hash_32(x, 8) is the top byte of x * 0x61C88647 (include/linux/hash.h)."""
    assert hash_32(1, 8) == 0x61
    assert hash_32(0x0A000005, 8) == ((0x0A000005 * 0x61C88647) & 0xFFFFFFFF) >> 24


def test_ipv6_address_folds_to_xor_of_words() -> None:
    """addr_fold of an IPv6 address is the XOR of its four 32-bit words."""
    assert fold_address(6, 0x11111111_22222222_44444444_88888888) == 0xFFFFFFFF
