"""The kernel's instruction encoding: 8-byte slots, lddw in two, fields in place."""

from __future__ import annotations

import pytest

from emulation.bpf import R1, R2, R10, Asm, AsmError, Insn, decode, encode


def test_mov64_imm_encodes_as_the_kernel_does() -> None:
    """``r1 = 7`` is b7 01 0000 07000000, as the kernel's BPF_MOV64_IMM macro writes it."""
    assert Asm().mov(R1, 7).assemble() == bytes.fromhex("b701000007000000")


def test_register_nibbles_put_dst_low_and_src_high() -> None:
    """``r1 = r2`` stores dst in the low nibble and src in the high one (bf 21)."""
    assert Asm().mov(R1, R2).assemble()[:2] == bytes.fromhex("bf21")


def test_lddw_takes_two_slots_with_the_high_half_in_the_second() -> None:
    """A 64-bit immediate is split into two slots, low half first."""
    code = Asm().ld_imm64(R1, 0x1122334455667788).assemble()
    assert code == bytes.fromhex("18010000" "88776655" "00000000" "44332211")


def test_negative_offsets_and_immediates_round_trip() -> None:
    """decode(encode(x)) is x for signed offsets and immediates."""
    insns = Asm().stx(8, R10, -8, R1).st(4, R10, -16, -1).insns()
    assert decode(encode(insns)) == insns
    assert insns[1].imm == -1 and insns[0].off == -8


def test_a_jump_label_resolves_to_a_relative_offset() -> None:
    """A forward jump's offset counts the slots between, lddw as two."""
    a = Asm().jeq(R1, 0, "out").ld_imm64(R2, 1).label("out").exit()
    assert a.insns()[0].off == 2


def test_an_undefined_label_is_refused_with_its_name() -> None:
    """Assembling a jump to a label never defined names the label."""
    with pytest.raises(AsmError, match="nowhere"):
        Asm().ja("nowhere").assemble()


def test_a_map_name_without_an_fd_is_refused() -> None:
    """A map the program loads must be given an fd."""
    with pytest.raises(AsmError, match="services"):
        Asm().ld_map(R1, "services").assemble({})


def test_bytecode_of_a_wrong_length_does_not_decode() -> None:
    """Bytecode is a multiple of 8 bytes."""
    with pytest.raises(ValueError, match="multiple of 8"):
        decode(b"\x00" * 9)


def test_the_immediate_is_a_32_bit_field() -> None:
    """An immediate past 32 bits is refused, an unsigned 32-bit one wraps to signed."""
    with pytest.raises(ValueError):
        Insn(opcode=0xB7, imm=1 << 32)
    assert Insn(opcode=0xB7, imm=0xFFFF_FFFF).imm == -1
