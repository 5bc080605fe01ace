"""The BPF machine: the kernel's instruction format, an assembler, maps and an interpreter.

Standalone (no ``kproxy`` import): :mod:`~emulation.bpf.isa` encodes and decodes the kernel's
8-byte instructions, :mod:`~emulation.bpf.asm` assembles programs written as Python calls,
:mod:`~emulation.bpf.maps` has the map types with the kernel's semantics, and
:class:`~emulation.bpf.machine.Machine` runs the same bytecode the kernel loads, with the
helpers of :mod:`~emulation.bpf.helpers` and the contexts of :mod:`~emulation.bpf.context`.
"""

from emulation.bpf.asm import R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, Asm, AsmError, Reg
from emulation.bpf.context import AttachType, ProgType, SkBuff, SockAddr
from emulation.bpf.helpers import Helper, TraceEvent, TraceKind
from emulation.bpf.isa import AluOp, AtomicOp, Class, Insn, JmpOp, Mode, Size, decode, encode
from emulation.bpf.machine import Machine, RunResult
from emulation.bpf.maps import BpfMap, MapError, MapSpec, MapType, UpdateFlag, new_map
from emulation.bpf.memory import BpfFault

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
    "AluOp",
    "Asm",
    "AsmError",
    "AtomicOp",
    "AttachType",
    "BpfFault",
    "BpfMap",
    "Class",
    "Helper",
    "Insn",
    "JmpOp",
    "Machine",
    "MapError",
    "MapSpec",
    "MapType",
    "Mode",
    "ProgType",
    "Reg",
    "RunResult",
    "Size",
    "SkBuff",
    "SockAddr",
    "TraceEvent",
    "TraceKind",
    "UpdateFlag",
    "decode",
    "encode",
    "new_map",
]
