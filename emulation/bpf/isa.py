"""The BPF instruction format, as the kernel documents it.

Source: torvalds/linux ``Documentation/bpf/standardization/instruction-set.rst`` and
``include/uapi/linux/bpf.h``. An instruction is 8 bytes, little-endian as on x86-64:
``u8 opcode; u8 dst_reg:4, src_reg:4; s16 offset; s32 imm``. The wide load ``lddw``
(``BPF_LD | BPF_IMM | BPF_DW``) takes two slots: the second carries the upper 32 bits of the
immediate in its ``imm`` and zeros elsewhere.

The opcode's low three bits are its class. For ALU and JMP classes the next bit is the source
(``K`` = immediate, ``X`` = register) and the high nibble the operation; for loads and stores bits
3-4 are the size and bits 5-7 the mode.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "INSN_SIZE",
    "AluOp",
    "AtomicOp",
    "Class",
    "Insn",
    "JmpOp",
    "Mode",
    "PseudoSrc",
    "Size",
    "Source",
    "decode",
    "encode",
]

#: Bytes per instruction slot.
INSN_SIZE = 8

_STRUCT = struct.Struct("<BBhi")


class Class(IntEnum):
    """The instruction class (opcode bits 0-2)."""

    LD = 0x00
    LDX = 0x01
    ST = 0x02
    STX = 0x03
    ALU = 0x04
    JMP = 0x05
    JMP32 = 0x06
    ALU64 = 0x07


class Source(IntEnum):
    """Where an ALU or jump operand comes from (opcode bit 3)."""

    K = 0x00
    X = 0x08


class AluOp(IntEnum):
    """Arithmetic operations (opcode bits 4-7 of ALU and ALU64)."""

    ADD = 0x00
    SUB = 0x10
    MUL = 0x20
    DIV = 0x30
    OR = 0x40
    AND = 0x50
    LSH = 0x60
    RSH = 0x70
    NEG = 0x80
    MOD = 0x90
    XOR = 0xA0
    MOV = 0xB0
    ARSH = 0xC0
    END = 0xD0


class JmpOp(IntEnum):
    """Jump operations (opcode bits 4-7 of JMP and JMP32)."""

    JA = 0x00
    JEQ = 0x10
    JGT = 0x20
    JGE = 0x30
    JSET = 0x40
    JNE = 0x50
    JSGT = 0x60
    JSGE = 0x70
    CALL = 0x80
    EXIT = 0x90
    JLT = 0xA0
    JLE = 0xB0
    JSLT = 0xC0
    JSLE = 0xD0


class Size(IntEnum):
    """Load and store sizes (opcode bits 3-4); :meth:`nbytes` gives the width."""

    W = 0x00
    H = 0x08
    B = 0x10
    DW = 0x18

    @property
    def nbytes(self) -> int:
        """The width in bytes (4, 2, 1, 8)."""
        return {Size.W: 4, Size.H: 2, Size.B: 1, Size.DW: 8}[self]

    @classmethod
    def of(cls, nbytes: int) -> Size:
        """The size code of a width in bytes.

        Raises:
            ValueError: ``nbytes`` is not 1, 2, 4 or 8.
        """
        table = {1: cls.B, 2: cls.H, 4: cls.W, 8: cls.DW}
        if nbytes not in table:
            raise ValueError(f"a BPF access is 1, 2, 4 or 8 bytes wide, not {nbytes=}")
        return table[nbytes]


class Mode(IntEnum):
    """Load and store modes (opcode bits 5-7)."""

    IMM = 0x00
    ABS = 0x20
    IND = 0x40
    MEM = 0x60
    MEMSX = 0x80
    ATOMIC = 0xC0


class AtomicOp(IntEnum):
    """The ``imm`` of an atomic instruction; ``FETCH`` (0x01) may be or-ed into ADD/OR/AND/XOR."""

    ADD = 0x00
    OR = 0x40
    AND = 0x50
    XOR = 0xA0
    FETCH = 0x01
    XCHG = 0xE0 | 0x01
    CMPXCHG = 0xF0 | 0x01


class PseudoSrc(IntEnum):
    """``src_reg`` values with a special meaning (bpf.h ``BPF_PSEUDO_*``)."""

    MAP_FD = 1  # lddw: imm is a map fd; the register gets the map
    MAP_VALUE = 2  # lddw: imm is a map fd, next imm an offset into its value 0
    CALL = 1  # call: imm is the pc-relative offset of a local function
    KFUNC_CALL = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Insn:
    """One decoded instruction slot (the second slot of ``lddw`` decodes as its own Insn).

    Attributes:
        opcode: the 8-bit opcode.
        dst: destination register 0-10.
        src: source register 0-10 (or a :class:`PseudoSrc` value).
        off: signed 16-bit offset.
        imm: signed 32-bit immediate.
    """

    opcode: int
    dst: int = 0
    src: int = 0
    off: int = 0
    imm: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.opcode <= 0xFF:
            raise ValueError(f"an opcode is 8 bits, got {self.opcode=:#x}")
        if not (0 <= self.dst <= 15 and 0 <= self.src <= 15):
            raise ValueError(f"registers are 4-bit fields, got {self.dst=} {self.src=}")
        if not -0x8000 <= self.off <= 0x7FFF:
            raise ValueError(f"the offset is a signed 16-bit field, got {self.off=}")
        if not -0x8000_0000 <= self.imm <= 0xFFFF_FFFF:
            raise ValueError(f"the immediate is a 32-bit field, got {self.imm=}")
        if self.imm > 0x7FFF_FFFF:
            object.__setattr__(self, "imm", self.imm - (1 << 32))

    @property
    def cls(self) -> Class:
        """The instruction class."""
        return Class(self.opcode & 0x07)

    def encode(self) -> bytes:
        """The 8 bytes of this slot."""
        return _STRUCT.pack(self.opcode, (self.src << 4) | self.dst, self.off, self.imm)


def encode(insns: tuple[Insn, ...] | list[Insn]) -> bytes:
    """The bytecode of ``insns``: ``8 * len(insns)`` bytes, as ``BPF_PROG_LOAD`` takes it."""
    return b"".join(i.encode() for i in insns)


def decode(code: bytes) -> tuple[Insn, ...]:
    """The instruction slots of ``code`` (the inverse of :func:`encode`).

    Raises:
        ValueError: the length is not a multiple of 8.
    """
    if len(code) % INSN_SIZE:
        raise ValueError(f"BPF bytecode is a multiple of {INSN_SIZE} bytes, got {len(code)}")
    out = []
    for pos in range(0, len(code), INSN_SIZE):
        opcode, regs, off, imm = _STRUCT.unpack_from(code, pos)
        out.append(Insn(opcode=opcode, dst=regs & 0x0F, src=regs >> 4, off=off, imm=imm))
    return tuple(out)
