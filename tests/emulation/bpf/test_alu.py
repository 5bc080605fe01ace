"""ALU and ALU64: arithmetic as the instruction-set document defines it."""

from __future__ import annotations

import pytest

from emulation.bpf import R0, R1, Asm

from .helpers import r0_of

M64 = (1 << 64) - 1


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda a: a.mov(R0, 5).add(R0, 7), 12),
        (lambda a: a.mov(R0, 5).sub(R0, 7), (5 - 7) & M64),
        (lambda a: a.mov(R0, -1).add32(R0, 2), 1),  # 32-bit wraps and zero-extends
        (lambda a: a.mov(R0, 6).mul(R0, 7), 42),
        (lambda a: a.mov(R0, 43).div(R0, 7), 6),
        (lambda a: a.mov(R0, 43).mod(R0, 7), 1),
        (lambda a: a.mov(R0, 43).div(R0, 0), 0),  # division by zero gives 0
        (lambda a: a.mov(R0, 43).mod(R0, 0), 43),  # modulo by zero keeps the dividend
        (lambda a: a.mov(R0, -7).div(R0, 2, signed=True), (-3) & M64),  # SDIV truncates
        (lambda a: a.mov(R0, -7).mod(R0, 2, signed=True), (-1) & M64),
        (lambda a: a.mov(R0, 0b1100).and_(R0, 0b1010), 0b1000),
        (lambda a: a.mov(R0, 0b1100).or_(R0, 0b1010), 0b1110),
        (lambda a: a.mov(R0, 0b1100).xor(R0, 0b1010), 0b0110),
        (lambda a: a.mov(R0, 1).lsh(R0, 65), 2),  # 64-bit shifts mask the amount to 63
        (lambda a: a.mov32(R0, 1).alu(0x60, R0, 33, wide=False), 2),  # 32-bit masks to 31
        (lambda a: a.mov(R0, -16).rsh(R0, 60), 0xF),
        (lambda a: a.mov(R0, -16).arsh(R0, 2), (-4) & M64),
        (lambda a: a.mov(R0, 5).neg(R0), (-5) & M64),
        (lambda a: a.mov(R0, -1).mov32(R0, R0), 0xFFFF_FFFF),  # mov32 zeroes the upper half
        (lambda a: a.mov(R1, 0x80).movsx(R0, R1, 8), (-128) & M64),
        (lambda a: a.mov(R0, 0x1234).endian(R0, 16, big=True), 0x3412),
        (lambda a: a.ld_imm64(R0, 0x1122334455667788).endian(R0, 32, big=False), 0x55667788),
        (lambda a: a.ld_imm64(R0, 0x1122334455667788).bswap(R0, 64), 0x8877665544332211),
        (lambda a: a.mov(R0, 3).mov(R1, 4).mul(R0, R1), 12),
    ],
)
def test_alu_result(build: object, expected: int) -> None:
    """Each operation leaves the result the kernel's interpreter computes."""
    a = Asm()
    build(a)  # type: ignore[operator]
    assert r0_of(a) == expected
