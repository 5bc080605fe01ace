"""A small assembler: BPF programs written as Python calls, labels and map names resolved.

Programs are built instruction by instruction on an :class:`Asm`::

    a = Asm()
    a.mov(R6, R1)                       # r6 = ctx
    a.ldx(4, R2, R6, 4)                 # r2 = *(u32 *)(r6 + 4)
    a.jeq(R2, 0, "out")                 # a label, resolved when assembled
    a.ld_map(R1, "services")            # lddw r1, map fd of "services"
    a.call(Helper.MAP_LOOKUP_ELEM)
    a.label("out")
    a.mov(R0, 1)
    a.exit()
    code = a.assemble({"services": fd})   # the kernel's bytes (8 per slot, lddw 16)

Operands are a register (:data:`R0` .. :data:`R10`, instances of :class:`Reg`) or an int
immediate; ALU methods are 64-bit, their ``32`` twins (``add32``) the 32-bit class. The jump
methods take a label name; ``jmp32=True`` picks the JMP32 class. The encoding follows the
kernel's instruction-set document (see :mod:`emulation.bpf.isa`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from emulation.bpf.isa import (
    AluOp,
    AtomicOp,
    Class,
    Insn,
    JmpOp,
    Mode,
    PseudoSrc,
    Size,
    Source,
    encode,
)
from emulation.errors import EmulationError

__all__ = [
    "R0",
    "R1",
    "R2",
    "R3",
    "R4",
    "R5",
    "R6",
    "R7",
    "R8",
    "R9",
    "R10",
    "Asm",
    "AsmError",
    "Reg",
]


class AsmError(EmulationError, ValueError):
    """A program that does not assemble: an unknown or duplicate label, a jump out of range, a
    map name with no fd."""


class Reg(IntEnum):
    """A BPF register: r0 return value, r1-r5 arguments, r6-r9 callee-saved, r10 frame pointer."""

    R0 = 0
    R1 = 1
    R2 = 2
    R3 = 3
    R4 = 4
    R5 = 5
    R6 = 6
    R7 = 7
    R8 = 8
    R9 = 9
    R10 = 10


R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = tuple(Reg)

Operand = Reg | int


@dataclass(slots=True)
class _Jump:
    insn: Insn
    label: str
    wide: bool = False  # JMP32 | JA: the offset sits in imm (gotol)


@dataclass(slots=True)
class _MapLoad:
    dst: int
    name: str
    pseudo: int
    value_off: int = 0


_Slot = Insn | _Jump | _MapLoad


@dataclass(slots=True)
class Asm:
    """A program under construction; every method appends and returns ``self``."""

    _slots: list[_Slot] = field(default_factory=list)
    _labels: dict[str, int] = field(default_factory=dict)
    _pc: int = 0

    # ---- structure -------------------------------------------------------------------
    def label(self, name: str) -> Asm:
        """Mark the next instruction as ``name``.

        Raises:
            AsmError: ``name`` is already defined.
        """
        if name in self._labels:
            raise AsmError(f"label {name!r} is defined twice")
        self._labels[name] = self._pc
        return self

    def raw(self, insn: Insn) -> Asm:
        """Append one slot as is (tests use it for opcodes the methods do not spell)."""
        return self._add(insn)

    def _add(self, slot: _Slot, width: int = 1) -> Asm:
        self._slots.append(slot)
        self._pc += width
        return self

    @property
    def map_names(self) -> frozenset[str]:
        """The map names the program loads (what :meth:`assemble` needs fds for)."""
        return frozenset(s.name for s in self._slots if isinstance(s, _MapLoad))

    def __len__(self) -> int:
        """The number of 8-byte slots so far."""
        return self._pc

    # ---- ALU ----------------------------------------------------------------------
    def alu(self, op: AluOp, dst: Reg, src: Operand, *, wide: bool = True, off: int = 0) -> Asm:
        """``dst = dst OP src`` in ALU64 (``wide``) or ALU (32-bit) class."""
        cls = Class.ALU64 if wide else Class.ALU
        if isinstance(src, Reg):
            return self._add(Insn(opcode=cls | Source.X | op, dst=dst, src=src, off=off))
        return self._add(Insn(opcode=cls | Source.K | op, dst=dst, off=off, imm=src))

    def mov(self, dst: Reg, src: Operand) -> Asm:
        """``dst = src`` (64-bit)."""
        return self.alu(AluOp.MOV, dst, src)

    def mov32(self, dst: Reg, src: Operand) -> Asm:
        """``dst = (u32) src``, upper half zeroed."""
        return self.alu(AluOp.MOV, dst, src, wide=False)

    def movsx(self, dst: Reg, src: Reg, bits: int, *, wide: bool = True) -> Asm:
        """``dst = (s8/s16/s32) src`` sign-extended (MOVSX, offset 8, 16 or 32)."""
        return self.alu(AluOp.MOV, dst, src, wide=wide, off=bits)

    def add(self, dst: Reg, src: Operand) -> Asm:
        """``dst += src``."""
        return self.alu(AluOp.ADD, dst, src)

    def add32(self, dst: Reg, src: Operand) -> Asm:
        """``dst = (u32)(dst + src)``."""
        return self.alu(AluOp.ADD, dst, src, wide=False)

    def sub(self, dst: Reg, src: Operand) -> Asm:
        """``dst -= src``."""
        return self.alu(AluOp.SUB, dst, src)

    def mul(self, dst: Reg, src: Operand) -> Asm:
        """``dst *= src``."""
        return self.alu(AluOp.MUL, dst, src)

    def div(self, dst: Reg, src: Operand, *, signed: bool = False) -> Asm:
        """``dst /= src`` (``signed``: SDIV, offset 1)."""
        return self.alu(AluOp.DIV, dst, src, off=int(signed))

    def mod(self, dst: Reg, src: Operand, *, signed: bool = False) -> Asm:
        """``dst %= src`` (``signed``: SMOD, offset 1)."""
        return self.alu(AluOp.MOD, dst, src, off=int(signed))

    def mod32(self, dst: Reg, src: Operand) -> Asm:
        """``dst = (u32)dst % (u32)src``."""
        return self.alu(AluOp.MOD, dst, src, wide=False)

    def and_(self, dst: Reg, src: Operand) -> Asm:
        """``dst &= src``."""
        return self.alu(AluOp.AND, dst, src)

    def or_(self, dst: Reg, src: Operand) -> Asm:
        """``dst |= src``."""
        return self.alu(AluOp.OR, dst, src)

    def xor(self, dst: Reg, src: Operand) -> Asm:
        """``dst ^= src``."""
        return self.alu(AluOp.XOR, dst, src)

    def lsh(self, dst: Reg, src: Operand) -> Asm:
        """``dst <<= src``."""
        return self.alu(AluOp.LSH, dst, src)

    def rsh(self, dst: Reg, src: Operand) -> Asm:
        """``dst >>= src`` (logical)."""
        return self.alu(AluOp.RSH, dst, src)

    def arsh(self, dst: Reg, src: Operand) -> Asm:
        """``dst >>= src`` (arithmetic)."""
        return self.alu(AluOp.ARSH, dst, src)

    def neg(self, dst: Reg) -> Asm:
        """``dst = -dst``."""
        return self.alu(AluOp.NEG, dst, 0)

    def endian(self, dst: Reg, bits: int, *, big: bool) -> Asm:
        """Byte order conversion of the low ``bits`` (16, 32, 64): ``be16`` etc. (ALU | END)."""
        src = Source.X if big else Source.K
        return self._add(Insn(opcode=Class.ALU | src | AluOp.END, dst=dst, imm=bits))

    def bswap(self, dst: Reg, bits: int) -> Asm:
        """Unconditional byte swap of the low ``bits`` (ALU64 | END, instruction set v4)."""
        return self._add(Insn(opcode=Class.ALU64 | AluOp.END, dst=dst, imm=bits))

    # ---- loads and stores ---------------------------------------------------------
    def ld_imm64(self, dst: Reg, value: int) -> Asm:
        """``dst = value`` (any 64-bit value; two slots)."""
        value &= (1 << 64) - 1
        lo, hi = value & 0xFFFF_FFFF, value >> 32
        self._add(Insn(opcode=Class.LD | Size.DW | Mode.IMM, dst=dst, imm=lo))
        return self._add(Insn(opcode=0, imm=hi))

    def ld_map(self, dst: Reg, name: str) -> Asm:
        """``dst = &map`` (lddw with ``BPF_PSEUDO_MAP_FD``; the fd comes at :meth:`assemble`)."""
        return self._add(_MapLoad(dst=dst, name=name, pseudo=PseudoSrc.MAP_FD), 2)

    def ld_map_value(self, dst: Reg, name: str, off: int = 0) -> Asm:
        """``dst = &map[0] + off`` (``BPF_PSEUDO_MAP_VALUE``, for array maps)."""
        return self._add(_MapLoad(dst=dst, name=name, pseudo=PseudoSrc.MAP_VALUE, value_off=off), 2)

    def ldx(self, nbytes: int, dst: Reg, src: Reg, off: int, *, signed: bool = False) -> Asm:
        """``dst = *(uN *)(src + off)`` (``signed``: MEMSX, sign-extending)."""
        mode = Mode.MEMSX if signed else Mode.MEM
        return self._add(Insn(opcode=Class.LDX | Size.of(nbytes) | mode, dst=dst, src=src, off=off))

    def stx(self, nbytes: int, dst: Reg, off: int, src: Reg) -> Asm:
        """``*(uN *)(dst + off) = src``."""
        return self._add(Insn(opcode=Class.STX | Size.of(nbytes) | Mode.MEM, dst=dst, src=src, off=off))

    def st(self, nbytes: int, dst: Reg, off: int, imm: int) -> Asm:
        """``*(uN *)(dst + off) = imm``."""
        return self._add(Insn(opcode=Class.ST | Size.of(nbytes) | Mode.MEM, dst=dst, off=off, imm=imm))

    def atomic(self, nbytes: int, op: int, dst: Reg, off: int, src: Reg) -> Asm:
        """An atomic read-modify-write of ``*(uN *)(dst + off)`` with ``src`` (:class:`AtomicOp`)."""
        return self._add(
            Insn(opcode=Class.STX | Size.of(nbytes) | Mode.ATOMIC, dst=dst, src=src, off=off, imm=op)
        )

    def xadd(self, nbytes: int, dst: Reg, off: int, src: Reg) -> Asm:
        """``lock *(uN *)(dst + off) += src``."""
        return self.atomic(nbytes, AtomicOp.ADD, dst, off, src)

    def ld_abs(self, nbytes: int, imm: int) -> Asm:
        """Legacy packet load: ``r0 = ntoh(*(uN *)(skb->data + imm))``."""
        return self._add(Insn(opcode=Class.LD | Size.of(nbytes) | Mode.ABS, imm=imm))

    def ld_ind(self, nbytes: int, src: Reg, imm: int) -> Asm:
        """Legacy packet load: ``r0 = ntoh(*(uN *)(skb->data + src + imm))``."""
        return self._add(Insn(opcode=Class.LD | Size.of(nbytes) | Mode.IND, src=src, imm=imm))

    # ---- jumps ----------------------------------------------------------------------
    def jump(self, op: JmpOp, dst: Reg, src: Operand, label: str, *, jmp32: bool = False) -> Asm:
        """``if dst OP src goto label``."""
        cls = Class.JMP32 if jmp32 else Class.JMP
        if isinstance(src, Reg):
            insn = Insn(opcode=cls | Source.X | op, dst=dst, src=src)
        else:
            insn = Insn(opcode=cls | Source.K | op, dst=dst, imm=src)
        return self._add(_Jump(insn=insn, label=label))

    def ja(self, label: str) -> Asm:
        """``goto label``."""
        return self._add(_Jump(insn=Insn(opcode=Class.JMP | JmpOp.JA), label=label))

    def gotol(self, label: str) -> Asm:
        """``goto label`` with a 32-bit offset (JMP32 | JA)."""
        return self._add(_Jump(insn=Insn(opcode=Class.JMP32 | JmpOp.JA), label=label, wide=True))

    def jeq(self, dst: Reg, src: Operand, label: str, *, jmp32: bool = False) -> Asm:
        """``if dst == src goto label``."""
        return self.jump(JmpOp.JEQ, dst, src, label, jmp32=jmp32)

    def jne(self, dst: Reg, src: Operand, label: str, *, jmp32: bool = False) -> Asm:
        """``if dst != src goto label``."""
        return self.jump(JmpOp.JNE, dst, src, label, jmp32=jmp32)

    def jgt(self, dst: Reg, src: Operand, label: str, *, jmp32: bool = False) -> Asm:
        """``if dst > src goto label`` (unsigned)."""
        return self.jump(JmpOp.JGT, dst, src, label, jmp32=jmp32)

    def jge(self, dst: Reg, src: Operand, label: str, *, jmp32: bool = False) -> Asm:
        """``if dst >= src goto label`` (unsigned)."""
        return self.jump(JmpOp.JGE, dst, src, label, jmp32=jmp32)

    def jlt(self, dst: Reg, src: Operand, label: str, *, jmp32: bool = False) -> Asm:
        """``if dst < src goto label`` (unsigned)."""
        return self.jump(JmpOp.JLT, dst, src, label, jmp32=jmp32)

    def jle(self, dst: Reg, src: Operand, label: str, *, jmp32: bool = False) -> Asm:
        """``if dst <= src goto label`` (unsigned)."""
        return self.jump(JmpOp.JLE, dst, src, label, jmp32=jmp32)

    def jset(self, dst: Reg, src: Operand, label: str, *, jmp32: bool = False) -> Asm:
        """``if dst & src goto label``."""
        return self.jump(JmpOp.JSET, dst, src, label, jmp32=jmp32)

    def call(self, helper: int) -> Asm:
        """Call helper number ``helper`` (bpf.h ``BPF_FUNC_*``): r1-r5 in, r0 out."""
        return self._add(Insn(opcode=Class.JMP | JmpOp.CALL, imm=int(helper)))

    def call_local(self, label: str) -> Asm:
        """Call the program-local function at ``label`` (``BPF_PSEUDO_CALL``)."""
        insn = Insn(opcode=Class.JMP | JmpOp.CALL, src=PseudoSrc.CALL)
        return self._add(_Jump(insn=insn, label=label, wide=True))

    def exit(self) -> Asm:
        """Return r0."""
        return self._add(Insn(opcode=Class.JMP | JmpOp.EXIT))

    # ---- output -------------------------------------------------------------------
    def insns(self, map_fds: Mapping[str, int] | None = None) -> tuple[Insn, ...]:
        """The resolved slots: labels become offsets, map names become fds.

        Args:
            map_fds: map name -> fd (kernel or emulated); may be omitted for programs without maps.

        Raises:
            AsmError: an undefined label, a jump offset past 16 bits, a map name missing.
        """
        fds = map_fds or {}
        out: list[Insn] = []
        for slot in self._slots:
            pc = len(out)
            if isinstance(slot, Insn):
                out.append(slot)
            elif isinstance(slot, _MapLoad):
                if slot.name not in fds:
                    raise AsmError(f"map {slot.name!r} has no fd (given: {sorted(fds)})")
                out.append(Insn(opcode=Class.LD | Size.DW | Mode.IMM, dst=slot.dst,
                                src=slot.pseudo, imm=fds[slot.name]))
                out.append(Insn(opcode=0, imm=slot.value_off))
            else:
                out.append(self._resolve(slot, pc))
        return tuple(out)

    def _resolve(self, jump: _Jump, pc: int) -> Insn:
        if jump.label not in self._labels:
            raise AsmError(f"jump at {pc} to undefined label {jump.label!r}")
        rel = self._labels[jump.label] - pc - 1
        i = jump.insn
        if jump.wide:
            return Insn(opcode=i.opcode, dst=i.dst, src=i.src, off=0, imm=rel)
        if not -0x8000 <= rel <= 0x7FFF:
            raise AsmError(f"jump at {pc} to {jump.label!r} is {rel} slots away, past 16 bits")
        return Insn(opcode=i.opcode, dst=i.dst, src=i.src, off=rel, imm=i.imm)

    def assemble(self, map_fds: Mapping[str, int] | None = None) -> bytes:
        """The bytecode, as ``BPF_PROG_LOAD`` takes it (see :meth:`insns`).

        Raises:
            AsmError: as :meth:`insns`.
        """
        return encode(self.insns(map_fds))
