"""JMP and JMP32: compares, signedness, calls and exit."""

from __future__ import annotations

import pytest

from emulation.bpf import R0, R1, R2, R6, R10, Asm, BpfFault, Machine


def _taken(op: str, a: int, b: int, *, jmp32: bool = False) -> bool:
    asm = Asm().ld_imm64(R1, a).mov(R0, 0)
    asm.jump(getattr(__import__("emulation.bpf", fromlist=["JmpOp"]).JmpOp, op), R1, b,
                         "yes", jmp32=jmp32)
    asm.exit().label("yes").mov(R0, 1).exit()
    return Machine({}).run(asm.assemble()).ret == 1


@pytest.mark.parametrize(
    ("op", "a", "b", "jmp32", "taken"),
    [
        ("JEQ", 5, 5, False, True),
        ("JNE", 5, 5, False, False),
        ("JGT", -1, 1, False, True),  # unsigned: 2**64-1 > 1
        ("JSGT", -1, 1, False, False),  # signed: -1 < 1
        ("JSLT", -1, 1, False, True),
        ("JGE", 3, 3, False, True),
        ("JLT", 2, 3, False, True),
        ("JLE", 4, 3, False, False),
        ("JSGE", -3, -3, False, True),
        ("JSLE", -4, -3, False, True),
        ("JSET", 0b1010, 0b0100, False, False),
        ("JSET", 0b1010, 0b0010, False, True),
        ("JEQ", 0x1_0000_0005, 5, True, True),  # JMP32 compares the low halves
        ("JEQ", 0x1_0000_0005, 5, False, False),
        ("JSLT", 0x8000_0000, 0, True, True),  # JMP32 signed sees bit 31
    ],
)
def test_conditional_jump(op: str, a: int, b: int, jmp32: bool, taken: bool) -> None:
    """A compare jumps exactly when the kernel's would."""
    assert _taken(op, a, b, jmp32=jmp32) is taken


def test_gotol_and_ja_skip_forward() -> None:
    """JA and its 32-bit-offset twin skip the slots in between."""
    a = Asm().mov(R0, 1).ja("a").mov(R0, 2).label("a").gotol("b").mov(R0, 3).label("b").exit()
    assert Machine({}).run(a.assemble()).ret == 1


def test_local_call_saves_callee_registers_and_gets_its_own_stack() -> None:
    """A local call returns r0; r6-r9 survive; the callee's frame is a new 512 bytes."""
    a = Asm().mov(R6, 40).st(8, R10, -8, 9).call_local("f").add(R0, R6)
    a.ldx(8, R1, R10, -8).add(R0, R1).exit()
    a.label("f").mov(R6, 1000).st(8, R10, -8, 7).ldx(8, R0, R10, -8).add(R0, 2).exit()
    assert Machine({}).run(a.assemble()).ret == 40 + 9 + 9


def test_a_loop_is_bounded() -> None:
    """A program that never exits is stopped at the instruction bound with a clear error."""
    a = Asm().mov(R0, 0).label("top").add(R0, 1).ja("top")
    with pytest.raises(BpfFault, match="instructions executed"):
        Machine({}, max_insns=1000).run(a.assemble())


def test_a_bounded_loop_runs() -> None:
    """A counted loop (allowed since 5.3) runs to its end."""
    a = Asm().mov(R0, 0).mov(R1, 10).label("top").add(R0, R1).sub(R1, 1).jne(R1, 0, "top").exit()
    assert Machine({}).run(a.assemble()).ret == 55


def test_exit_with_a_pointer_in_r0_is_refused() -> None:
    """r0 must be a scalar at exit (the verifier: R0 leaks addr)."""
    with pytest.raises(BpfFault, match="not a scalar"):
        Machine({}).run(Asm().mov(R0, R10).exit().assemble())


def test_reading_an_unwritten_register_is_refused() -> None:
    """r2 was never written: the verifier's '!read_ok'."""
    with pytest.raises(BpfFault, match="r2 is read before"):
        Machine({}).run(Asm().mov(R0, R2).exit().assemble())
