"""The BPF machine computes what the kernel computes, instruction by instruction: seeded random
ALU/ALU64 operations (immediate and register operands, byte swaps, sign extension, signed
division), JMP/JMP32 compares and atomics run in one program through BPF_PROG_TEST_RUN and on
the machine, and every result (written to an array map) must agree."""

from __future__ import annotations

import random

import pytest

from emulation.bpf import (
    R0,
    R1,
    R2,
    R3,
    R9,
    R10,
    AluOp,
    Asm,
    AtomicOp,
    Helper,
    JmpOp,
    MapSpec,
    MapType,
    ProgType,
)
from kproxy.kernel.bpf import BpfKernel, EmulatedBpf, ProgramSpec
from kproxy.kernel.linux_bpf import LinuxBpf
from tests.conftest import require_kernel

CASES = 160
OUT = MapSpec(type=MapType.ARRAY, key_size=4, value_size=8 * CASES, max_entries=1, name="out")
_ALU = [AluOp.ADD, AluOp.SUB, AluOp.MUL, AluOp.DIV, AluOp.OR, AluOp.AND, AluOp.LSH, AluOp.RSH,
        AluOp.MOD, AluOp.XOR, AluOp.ARSH]
_JMP = [JmpOp.JEQ, JmpOp.JGT, JmpOp.JGE, JmpOp.JSET, JmpOp.JNE, JmpOp.JSGT, JmpOp.JSGE,
        JmpOp.JLT, JmpOp.JLE, JmpOp.JSLT, JmpOp.JSLE]
_EDGES = [0, 1, 2, 7, 31, 32, 63, 64, 0x7FFF_FFFF, 0x8000_0000, 0xFFFF_FFFF, 1 << 32,
          (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 2]


def _value(rng: random.Random) -> int:
    return rng.choice(_EDGES) if rng.random() < 0.4 else rng.getrandbits(rng.choice([8, 16, 32, 64]))


def _case(a: Asm, rng: random.Random, i: int) -> None:
    x, y = _value(rng), _value(rng)
    a.ld_imm64(R1, x).ld_imm64(R2, y)
    kind = rng.randrange(8)
    wide = rng.random() < 0.5
    if kind <= 1:  # ALU with a register or an immediate operand
        op = rng.choice(_ALU)
        signed = op in (AluOp.DIV, AluOp.MOD) and rng.random() < 0.3
        if kind == 0:
            a.alu(op, R1, R2, wide=wide, off=int(signed))
        else:
            imm = rng.randrange(0, 64 if wide else 32) if op in (AluOp.LSH, AluOp.RSH, AluOp.ARSH) \
                else rng.choice([rng.randrange(1, 1 << 31), -rng.randrange(1, 1 << 31), 3, -1])
            a.alu(op, R1, imm, wide=wide, off=int(signed))
    elif kind == 2:  # byte order, negation, sign-extending moves
        choice = rng.randrange(4)
        if choice == 0:
            a.endian(R1, rng.choice([16, 32, 64]), big=rng.random() < 0.5)
        elif choice == 1:
            a.bswap(R1, rng.choice([16, 32, 64]))
        elif choice == 2:
            a.alu(AluOp.NEG, R1, 0, wide=wide)
        else:
            a.movsx(R1, R2, rng.choice([8, 16, 32]) if wide else rng.choice([8, 16]), wide=wide)
    elif kind in (3, 4):  # compares, JMP and JMP32, register or immediate
        op = rng.choice(_JMP)
        src = R2 if kind == 3 else rng.choice([0, 1, -1, 0x7FFF_FFFF, -0x8000_0000, rng.getrandbits(16)])
        a.jump(op, R1, src, f"t{i}", jmp32=wide).mov(R1, 0).ja(f"e{i}").label(f"t{i}").mov(R1, 1)
        a.label(f"e{i}")
    elif kind == 6:  # sign-extending and narrow loads of a stored value
        a.stx(8, R9, 8 * i, R1)
        size = rng.choice([1, 2, 4])
        a.ldx(size, R1, R9, 8 * i + rng.randrange(0, 8, size), signed=rng.random() < 0.6)
    elif kind == 7:  # a local call: r0 = r1 * 3 - r2 in the callee, its stack its own
        a.stx(8, R10, -16, R2).call_local("callee").ldx(8, R2, R10, -16).add(R0, R2).mov(R1, R0)
    else:  # atomics on the output slot itself
        a.stx(8, R9, 8 * i, R1)
        op = rng.choice([AtomicOp.ADD, AtomicOp.OR, AtomicOp.AND, AtomicOp.XOR])
        size = rng.choice([4, 8])
        if size == 4:
            a.stx(4, R9, 8 * i + 4, R2)
        a.atomic(size, op | AtomicOp.FETCH, R9, 8 * i, R2)
        a.ldx(8, R1, R9, 8 * i).xor(R1, R2)  # fold the fetched value in
    a.stx(8, R9, 8 * i, R1)


def _program(seed: int) -> Asm:
    rng = random.Random(seed)
    a = Asm().st(4, R10, -4, 0).ld_map(R1, "out").mov(R2, R10).add(R2, -4)
    a.call(Helper.MAP_LOOKUP_ELEM).jne(R0, 0, "go").mov(R0, 0).exit().label("go").mov(R9, R0)
    for i in range(CASES):
        _case(a, rng, i)
    a.mov(R3, 0).mov(R0, R3).exit()
    a.label("callee").stx(8, R10, -16, R1).mul(R1, 3).sub(R1, R2).ldx(8, R2, R10, -16).xor(R1, R2)
    a.mov(R0, R1).exit()
    return a


def _results(k: BpfKernel, seed: int) -> bytes | None:
    out = k.create_map(OUT)
    prog = k.load_program(ProgramSpec(type=ProgType.SCHED_CLS, name="isa",
                                      code=_program(seed).assemble({"out": out})))
    try:
        assert k.test_run(prog, bytes(64)).retval == 0
        return k.lookup(out, bytes(4))
    finally:
        k.close(prog)
        k.close(out)


@pytest.mark.kernel
@pytest.mark.parametrize("seed", range(6))
def test_machine_and_kernel_compute_the_same_results(seed: int) -> None:
    """Every one of the program's results is the same on the machine and in the kernel."""
    require_kernel()
    kernel, machine = _results(LinuxBpf(), seed), _results(EmulatedBpf(), seed)
    assert kernel is not None and machine is not None
    differ = [(i, kernel[8 * i:8 * i + 8].hex(), machine[8 * i:8 * i + 8].hex())
              for i in range(CASES) if kernel[8 * i:8 * i + 8] != machine[8 * i:8 * i + 8]]
    assert not differ, f"case, kernel, machine: {differ[:5]}"
