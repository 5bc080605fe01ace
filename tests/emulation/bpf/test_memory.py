"""LD, LDX, ST, STX and atomics over the stack; bounds and pointer checks."""

from __future__ import annotations

import pytest

from emulation.bpf import R0, R1, R2, R10, Asm, AtomicOp, BpfFault, Machine


def _ret(a: Asm) -> int:
    return Machine({}).run(a.exit().assemble()).ret


def test_store_then_load_each_width_little_endian() -> None:
    """A 64-bit store read back as bytes, halves and words is little-endian."""
    a = Asm().ld_imm64(R1, 0x1122334455667788).stx(8, R10, -8, R1)
    a.ldx(1, R0, R10, -8).ldx(2, R2, R10, -6).lsh(R2, 8).or_(R0, R2)
    assert _ret(a) == 0x88 | (0x5566 << 8)


def test_sign_extending_load() -> None:
    """LDX MEMSX of a byte 0xff gives -1."""
    a = Asm().st(1, R10, -1, 0xFF).ldx(1, R0, R10, -1, signed=True)
    assert _ret(a) == (1 << 64) - 1


def test_reading_stack_never_written_is_refused() -> None:
    """Uninitialised stack reads fail as the verifier's 'invalid read from stack'."""
    with pytest.raises(BpfFault, match="never written"):
        _ret(Asm().ldx(4, R0, R10, -4))


def test_stack_access_past_the_frame_is_out_of_bounds() -> None:
    """The frame is 512 bytes below r10 and nothing above."""
    with pytest.raises(BpfFault, match="out of bounds"):
        _ret(Asm().st(4, R10, 0, 1).mov(R0, 0))
    with pytest.raises(BpfFault, match="out of bounds"):
        _ret(Asm().st(4, R10, -516, 1).mov(R0, 0))


def test_r10_is_read_only() -> None:
    """Writing the frame pointer is refused."""
    with pytest.raises(BpfFault, match="r10 is read-only"):
        _ret(Asm().mov(R10, 0))


def test_dereferencing_a_scalar_is_refused() -> None:
    """A load through a register holding a number (a missing NULL check) fails."""
    with pytest.raises(BpfFault, match="not a pointer"):
        _ret(Asm().mov(R1, 0).ldx(4, R0, R1, 0))


def test_pointer_spill_and_fill_through_the_stack() -> None:
    """A pointer stored to an aligned stack slot comes back as the same pointer."""
    a = Asm().st(8, R10, -16, 99).mov(R1, R10).add(R1, -16).stx(8, R10, -8, R1)
    a.ldx(8, R2, R10, -8).ldx(8, R0, R2, 0)
    assert _ret(a) == 99


def test_pointer_arithmetic_other_than_add_is_refused() -> None:
    """Multiplying a pointer is prohibited."""
    with pytest.raises(BpfFault, match="prohibited"):
        _ret(Asm().mov(R1, R10).mul(R1, 2).mov(R0, 0))


def test_pointer_difference_is_a_scalar() -> None:
    """Two pointers into one region subtract to their distance."""
    a = Asm().mov(R1, R10).mov(R0, R10).add(R1, -24).sub(R0, R1)
    assert _ret(a) == 24


@pytest.mark.parametrize(
    ("op", "start", "operand", "memory", "fetched"),
    [
        (AtomicOp.ADD | AtomicOp.FETCH, 10, 5, 15, 10),
        (AtomicOp.OR | AtomicOp.FETCH, 0b0101, 0b0011, 0b0111, 0b0101),
        (AtomicOp.AND | AtomicOp.FETCH, 0b0101, 0b0011, 0b0001, 0b0101),
        (AtomicOp.XOR | AtomicOp.FETCH, 0b0101, 0b0011, 0b0110, 0b0101),
        (AtomicOp.XCHG, 10, 5, 5, 10),
    ],
)
def test_atomic_fetch_operations(op: int, start: int, operand: int, memory: int, fetched: int) -> None:
    """An atomic op leaves the combined value in memory and the old one in src with FETCH."""
    a = Asm().st(8, R10, -8, start).mov(R1, operand).atomic(8, op, R10, -8, R1)
    a.ldx(8, R0, R10, -8).lsh(R0, 32).or_(R0, R1)
    assert _ret(a) == (memory << 32) | fetched


def test_cmpxchg_swaps_only_on_a_match() -> None:
    """CMPXCHG writes src when memory equals r0, and r0 gets the old value either way."""
    a = Asm().st(8, R10, -8, 7).mov(R0, 7).mov(R1, 9).atomic(8, AtomicOp.CMPXCHG, R10, -8, R1)
    a.mov(R0, 8).atomic(8, AtomicOp.CMPXCHG, R10, -8, R1).ldx(8, R1, R10, -8).lsh(R0, 8).or_(R0, R1)
    assert _ret(a) == (9 << 8) | 9


def test_xadd_without_fetch_leaves_src() -> None:
    """Plain atomic add changes memory only."""
    a = Asm().st(4, R10, -4, 1).mov(R1, 2).xadd(4, R10, -4, R1).ldx(4, R0, R10, -4).add(R0, R1)
    assert _ret(a) == 3 + 2
