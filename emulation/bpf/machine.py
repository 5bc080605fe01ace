"""The BPF machine: runs the same bytecode the kernel loads, against emulated maps.

Theory of operation. :meth:`Machine.run` decodes the bytecode (:mod:`emulation.bpf.isa`) and
interprets it slot by slot with eleven 64-bit registers, as the kernel's interpreter
(kernel/bpf/core.c ``___bpf_prog_run``) does, following the instruction-set document for every
class: ALU and ALU64 (32-bit results zero-extended; shifts masked to 31 or 63; division by zero
gives 0 and modulo by zero leaves the dividend; SDIV/SMOD and MOVSX by offset), JMP and JMP32
(signed and unsigned compares, JSET, ``gotol``, helper calls, local calls with their own 512-byte
frame), LD (``lddw``, map fds and map values, legacy ABS/IND packet loads), LDX/ST/STX (MEMSX
too) and the atomics (ADD/OR/AND/XOR with FETCH, XCHG, CMPXCHG).

Registers carry tagged values (:mod:`emulation.bpf.memory`), so what the verifier proves
statically is checked at run time: pointer arithmetic other than pointer +/- scalar, reading an
uninitialised register or stack byte, out-of-bounds access, writing r10. A fault raises
:class:`BpfFault` with the pc and instruction. Runs are bounded (``max_insns``, the kernel's
1M-instruction verifier budget by default).

Randomness is injected: sample mode draws ``bpf_get_prandom_u32`` from a ``random.Random``;
:meth:`Machine.enumerate` instead follows every outcome of ``prandom % n`` with its exact
probability, each path on its own copy of the maps.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from emulation.bpf.context import SkBuff, SockAddr
from emulation.bpf.helpers import Chooser, Env, RandSym, TraceEvent, TraceKind, call_helper
from emulation.bpf.isa import AluOp, AtomicOp, Class, Insn, JmpOp, Mode, PseudoSrc, Size, decode
from emulation.bpf.maps import BpfMap, MapType
from emulation.bpf.memory import (
    UNINIT,
    BpfFault,
    MapRef,
    Ptr,
    Region,
    RegionKind,
    Value,
    stack_region,
)

__all__ = ["Machine", "RunResult"]

# The opcode fields as plain ints: enum member lookups are slow in the interpreter's loop.
_A_ADD = int(AluOp.ADD)
_A_AND = int(AluOp.AND)
_A_ARSH = int(AluOp.ARSH)
_A_DIV = int(AluOp.DIV)
_A_END = int(AluOp.END)
_A_LSH = int(AluOp.LSH)
_A_MOD = int(AluOp.MOD)
_A_MOV = int(AluOp.MOV)
_A_MUL = int(AluOp.MUL)
_A_NEG = int(AluOp.NEG)
_A_OR = int(AluOp.OR)
_A_RSH = int(AluOp.RSH)
_A_SUB = int(AluOp.SUB)
_A_XOR = int(AluOp.XOR)
_X_ADD = int(AtomicOp.ADD)
_X_AND = int(AtomicOp.AND)
_X_CMPXCHG = int(AtomicOp.CMPXCHG)
_X_FETCH = int(AtomicOp.FETCH)
_X_OR = int(AtomicOp.OR)
_X_XCHG = int(AtomicOp.XCHG)
_X_XOR = int(AtomicOp.XOR)
_J_CALL = int(JmpOp.CALL)
_J_EXIT = int(JmpOp.EXIT)
_J_JA = int(JmpOp.JA)
_J_JEQ = int(JmpOp.JEQ)
_J_JGE = int(JmpOp.JGE)
_J_JGT = int(JmpOp.JGT)
_J_JLE = int(JmpOp.JLE)
_J_JLT = int(JmpOp.JLT)
_J_JNE = int(JmpOp.JNE)
_J_JSET = int(JmpOp.JSET)
_J_JSGE = int(JmpOp.JSGE)
_J_JSGT = int(JmpOp.JSGT)
_J_JSLE = int(JmpOp.JSLE)
_J_JSLT = int(JmpOp.JSLT)
_M_ABS = int(Mode.ABS)
_M_ATOMIC = int(Mode.ATOMIC)
_M_IMM = int(Mode.IMM)
_M_IND = int(Mode.IND)
_M_MEM = int(Mode.MEM)
_M_MEMSX = int(Mode.MEMSX)
_P_CALL = int(PseudoSrc.CALL)
_P_MAP_FD = int(PseudoSrc.MAP_FD)
_P_MAP_VALUE = int(PseudoSrc.MAP_VALUE)


_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
#: kernel/bpf/verifier.c ``BPF_COMPLEXITY_LIMIT_INSNS``.
MAX_INSNS = 1_000_000
#: kernel/bpf/core.c ``MAX_CALL_FRAMES``.
MAX_FRAMES = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """What one run did.

    Attributes:
        ret: r0 at exit (u64; hooks read its low 32 bits: 1 allow / 0 reject for sock_addr,
            a ``TC_ACT_*`` for tc).
        ctx: the context as the program left it (a rewritten :class:`SockAddr`), or None.
        packet: the packet as the program left it (tc), else ``b""``.
        trace: the map accesses, random draws, helpers and the exit, in order.
        insns: instructions executed.
        redirect: ``(ifindex, flags)`` when ``bpf_redirect`` was called.
        retval: the error a cgroup program set with ``bpf_set_retval``, or None.
        probability: this outcome's probability (1 in sample mode).
        maps: enumerate mode: this path's maps after the run (fd -> map); else empty.
    """

    ret: int
    ctx: SockAddr | SkBuff | None
    packet: bytes
    trace: tuple[TraceEvent, ...]
    insns: int
    redirect: tuple[int, int] | None = None
    retval: int | None = None
    probability: Fraction = Fraction(1)
    maps: Mapping[int, BpfMap] | None = None

    @property
    def ret32(self) -> int:
        """The low 32 bits of r0, as the hooks read it."""
        return self.ret & _M32


def _sx(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


#: Load/store widths by the opcode's size bits.
_NBYTES = {0x00: 4, 0x08: 2, 0x10: 1, 0x18: 8}
_ALU_CLASSES = (int(Class.ALU), int(Class.ALU64))
_JMP_CLASSES = (int(Class.JMP), int(Class.JMP32))
_LDX, _ALU64, _JMP32 = int(Class.LDX), int(Class.ALU64), int(Class.JMP32)
_STORES = (int(Class.ST), int(Class.STX))


class _Frame:
    __slots__ = ("ret_pc", "saved", "stack")

    def __init__(self, ret_pc: int, saved: list[Value], stack: Region) -> None:
        self.ret_pc, self.saved, self.stack = ret_pc, saved, stack


class Machine:
    """A BPF machine over an fd table of maps.

    Args:
        maps: fd -> map, what the bytecode's ``lddw rX, map_fd`` name.
        names: fd -> a name for the trace (defaults to the maps' own names).
        clock_ns: ``bpf_ktime_get_ns`` (monotonic nanoseconds); injected.
        rng: sample mode's random source (``random.Random(0)`` when omitted).
        max_insns: the bound of one run.
    """

    def __init__(self, maps: Mapping[int, BpfMap], *, names: Mapping[int, str] | None = None,
                 clock_ns: Callable[[], int] = lambda: 0, rng: random.Random | None = None,
                 max_insns: int = MAX_INSNS) -> None:
        self.maps = dict(maps)
        self.names = dict(names or {})
        self.clock_ns = clock_ns
        self.rng = rng if rng is not None else random.Random(0)
        self.max_insns = max_insns
        self._decoded: dict[bytes, tuple[Insn, ...]] = {}

    def _insns(self, code: bytes | tuple[Insn, ...]) -> tuple[Insn, ...]:
        if not isinstance(code, bytes | bytearray):
            return tuple(code)
        key = bytes(code)
        insns = self._decoded.get(key)
        if insns is None:
            if len(self._decoded) > 64:
                self._decoded.clear()
            insns = self._decoded[key] = decode(key)
        return insns

    # ---- public -------------------------------------------------------------------
    def run(self, code: bytes | tuple[Insn, ...], ctx: SockAddr | SkBuff | None = None) -> RunResult:
        """Run once, sampling random draws; the maps change in place.

        Raises:
            BpfFault: the program did what the kernel refuses (message names pc and insn).
        """
        return self._run(self._insns(code), ctx, self.maps, Env(maps=self.maps, names=self.names,
                                                              rng=self.rng, clock_ns=self.clock_ns))

    def enumerate(self, code: bytes | tuple[Insn, ...], ctx: SockAddr | SkBuff | None = None,
                  *, max_paths: int = 4096) -> tuple[RunResult, ...]:
        """Every outcome of the ``prandom % n`` draws, each with its probability.

        Each path runs on a deep copy of the maps (returned in ``RunResult.maps``); the
        machine's own maps do not change. The probabilities sum to 1.

        Raises:
            BpfFault: as :meth:`run`; also when the random value is used other than ``% n``,
                or the paths exceed ``max_paths``.
        """
        insns = self._insns(code)
        out: list[RunResult] = []
        pending: list[tuple[int, ...]] = [()]
        while pending:
            forced = pending.pop()
            if len(out) >= max_paths:
                raise BpfFault(f"enumerate: more than {max_paths=} random paths")
            maps = copy.deepcopy(self.maps)
            chooser = Chooser(forced=forced)
            env = Env(maps=maps, names=self.names, chooser=chooser, clock_ns=self.clock_ns)
            res = self._run(insns, copy.deepcopy(ctx), maps, env)
            out.append(res)
            for depth in range(len(forced), len(chooser.widths)):
                for r in range(1, chooser.widths[depth]):
                    pending.append((*tuple(chooser.taken[:depth]), r))
        return tuple(sorted(out, key=lambda r: -r.probability))

    # ---- the interpreter ----------------------------------------------------------
    def _run(self, insns: tuple[Insn, ...], ctx: SockAddr | SkBuff | None,
             maps: Mapping[int, BpfMap], env: Env) -> RunResult:
        regs: list[Value] = [UNINIT] * 11
        stack = stack_region()
        regs[10] = Ptr(stack, len(stack.data))
        packet: Region | None = None
        ctx_region: Region | None = None
        if isinstance(ctx, SkBuff):
            packet = Region(RegionKind.PACKET, bytearray(ctx.packet), "packet")
            ctx_region = ctx.region(packet)
        elif isinstance(ctx, SockAddr):
            ctx_region = ctx.region()
        if ctx_region is not None:
            regs[1] = Ptr(ctx_region, 0)
        env.ctx, env.packet = ctx, packet
        frames: list[_Frame] = []
        pc = count = 0
        n = len(insns)
        while True:
            if not 0 <= pc < n:
                raise BpfFault(f"pc {pc}: jumped out of the program (0..{n - 1})")
            count += 1
            if count > self.max_insns:
                raise BpfFault(f"more than {self.max_insns} instructions executed (a loop?)")
            insn = insns[pc]
            try:
                step = self._step(insn, pc, insns, regs, env, frames, packet)
            except BpfFault as e:
                if str(e).startswith("pc "):
                    raise
                raise BpfFault(f"pc {pc} ({_show(insn)}): {e}") from None
            if step is None:  # exit of the main frame
                r0 = regs[0]
                if not isinstance(r0, int):
                    raise BpfFault(f"pc {pc}: exit with r0 = {r0!r}, not a scalar")
                env.trace.append(TraceEvent(kind=TraceKind.EXIT, pc=pc, result=r0))
                out_ctx: SockAddr | SkBuff | None = ctx
                if isinstance(ctx, SockAddr) and ctx_region is not None:
                    out_ctx = ctx.read_back(ctx_region)
                return RunResult(ret=r0, ctx=out_ctx, packet=bytes(packet.data) if packet else b"",
                                 trace=tuple(env.trace), insns=count, redirect=env.redirect,
                                 retval=env.retval,
                                 probability=env.chooser.probability if env.chooser else Fraction(1),
                                 maps=maps if env.chooser else None)
            pc = step

    def _step(self, insn: Insn, pc: int, insns: tuple[Insn, ...], regs: list[Value], env: Env,
              frames: list[_Frame], packet: Region | None) -> int | None:
        op = insn.opcode
        cls = op & 0x07
        if cls in _ALU_CLASSES:
            _alu(insn, regs, env, cls == _ALU64)
            return pc + 1
        if cls in _JMP_CLASSES:
            return self._jmp(insn, pc, regs, env, frames, cls == _JMP32)
        if cls == _LDX:
            src = _ptr(regs, insn.src)
            size = _NBYTES[op & 0x18]
            v = src.region.load(src.off + insn.off, size)
            if op & 0xE0 == _M_MEMSX and isinstance(v, int):
                v = _sx(v, size * 8) & _M64
            elif op & 0xE0 not in (_M_MEM, _M_MEMSX):
                raise BpfFault(f"unknown LDX mode {op & 0xE0:#x}")
            _set(regs, insn.dst, v)
            return pc + 1
        if cls in _STORES:
            dst = _ptr(regs, insn.dst)
            size = _NBYTES[op & 0x18]
            mode = op & 0xE0
            if mode == _M_ATOMIC and cls == Class.STX:
                _atomic(insn, dst, size, regs)
                return pc + 1
            if mode != _M_MEM:
                raise BpfFault(f"unknown store mode {mode:#x}")
            value = insn.imm & _M64 if cls == Class.ST else _get(regs, insn.src)
            if isinstance(value, RandSym):
                raise BpfFault("enumerate mode: the random value may only be used as prandom % n")
            dst.region.store(dst.off + insn.off, size, value)
            return pc + 1
        return self._ld(insn, pc, insns, regs, env, packet)

    def _ld(self, insn: Insn, pc: int, insns: tuple[Insn, ...], regs: list[Value], env: Env,
            packet: Region | None) -> int | None:
        op = insn.opcode
        mode = op & 0xE0
        if op == Class.LD | Size.DW | _M_IMM:
            if pc + 1 >= len(insns):
                raise BpfFault("lddw without its second slot")
            hi = insns[pc + 1]
            if insn.src == 0:
                _set(regs, insn.dst, ((hi.imm & _M32) << 32) | (insn.imm & _M32))
            elif insn.src in (_P_MAP_FD, _P_MAP_VALUE):
                fd = insn.imm
                m = env.maps.get(fd)
                if m is None:
                    raise BpfFault(f"lddw: fd {fd} is not a map (known {sorted(env.maps)})")
                if insn.src == _P_MAP_FD:
                    _set(regs, insn.dst, MapRef(m, fd))
                else:
                    if m.spec.type != MapType.ARRAY:
                        raise BpfFault("BPF_PSEUDO_MAP_VALUE needs an array map")
                    value = m.lookup_ref(bytes(4))
                    assert isinstance(value, bytearray)
                    name = env.names.get(fd, m.spec.name)
                    _set(regs, insn.dst, Ptr(Region(RegionKind.MAP_VALUE, value, f"map {name} value"),
                                             hi.imm))
            else:
                raise BpfFault(f"lddw with src_reg {insn.src} is not modelled")
            return pc + 2
        if mode in (_M_ABS, _M_IND):
            if packet is None:
                raise BpfFault("legacy packet load outside a packet program")
            off = insn.imm
            if mode == _M_IND:
                off += _int(regs, insn.src)
            size = Size(op & 0x18).nbytes
            for r in range(1, 6):
                regs[r] = UNINIT
            if off < 0 or off + size > len(packet.data):
                regs[0] = 0  # out of the packet: the program ends returning 0, as the kernel's
                return None
            regs[0] = int.from_bytes(packet.data[off:off + size], "big")
            return pc + 1
        raise BpfFault(f"unknown opcode {op:#04x}")

    def _jmp(self, insn: Insn, pc: int, regs: list[Value], env: Env, frames: list[_Frame],
             is32: bool) -> int | None:
        op = insn.opcode & 0xF0
        if op == _J_JA:
            return pc + 1 + (insn.imm if is32 else insn.off)
        if op == _J_EXIT:
            if not frames:
                return None
            f = frames.pop()
            regs[6:11] = f.saved
            return f.ret_pc
        if op == _J_CALL:
            if insn.src == _P_CALL:
                if len(frames) + 1 >= MAX_FRAMES:
                    raise BpfFault(f"more than {MAX_FRAMES} call frames")
                stack = stack_region(len(frames) + 1)
                frames.append(_Frame(pc + 1, regs[6:11], stack))
                regs[10] = Ptr(stack, len(stack.data))
                return pc + 1 + insn.imm
            args = [regs[r] for r in range(1, 6)]
            result = call_helper(env, pc, insn.imm, args)
            for r in range(1, 6):
                regs[r] = UNINIT
            regs[0] = result
            return pc + 1
        a = _get(regs, insn.dst)
        b: Value = _get(regs, insn.src) if insn.opcode & 0x08 else insn.imm & _M64
        return pc + 1 + insn.off if _compare(op, a, b, is32) else pc + 1


def _show(insn: Insn) -> str:
    return f"op {insn.opcode:#04x} dst r{insn.dst} src r{insn.src} off {insn.off} imm {insn.imm}"


def _get(regs: list[Value], r: int) -> Value:
    if r > 10:
        raise BpfFault(f"register r{r} does not exist")
    v = regs[r]
    if v is UNINIT:
        raise BpfFault(f"r{r} is read before it was written (!read_ok)")
    return v


def _set(regs: list[Value], r: int, v: Value) -> None:
    if r >= 10:
        raise BpfFault(f"r{r} is read-only" if r == 10 else f"register r{r} does not exist")
    regs[r] = v


def _int(regs: list[Value], r: int) -> int:
    v = _get(regs, r)
    if not isinstance(v, int):
        raise BpfFault(f"r{r} must be a scalar here, it holds {v!r}")
    return v


def _ptr(regs: list[Value], r: int) -> Ptr:
    v = _get(regs, r)
    if not isinstance(v, Ptr):
        raise BpfFault(f"r{r} is dereferenced but holds {v!r}, not a pointer (a NULL check missing?)")
    return v


def _alu(insn: Insn, regs: list[Value], env: Env, wide: bool) -> None:
    op = insn.opcode & 0xF0
    dst = insn.dst
    if op == _A_END:
        v = _int(regs, dst)
        bits = insn.imm
        if bits not in (16, 32, 64):
            raise BpfFault(f"byte swap of {bits} bits")
        v &= (1 << bits) - 1
        swap = wide or bool(insn.opcode & 0x08)  # ALU64|END is bswap; ALU|END|X is to-big-endian
        _set(regs, dst, int.from_bytes(v.to_bytes(bits // 8, "little"), "big") if swap else v)
        return
    src: Value = _get(regs, insn.src) if insn.opcode & 0x08 else insn.imm & _M64
    if op == _A_MOV:
        if isinstance(src, int):
            if insn.off in (8, 16, 32):
                src = _sx(src, insn.off) & _M64
            src = src if wide else src & _M32
        elif not wide and not isinstance(src, RandSym):
            raise BpfFault(f"32-bit move of a pointer ({src!r})")
        _set(regs, dst, src)
        return
    a = _get(regs, dst)
    if isinstance(a, RandSym) and op == _A_MOD and isinstance(src, int) and src & (_M64 if wide else _M32):
        assert env.chooser is not None
        n = src & (_M64 if wide else _M32)
        r = env.chooser.choose(n)
        env.trace.append(TraceEvent(kind=TraceKind.RANDOM, pc=a.pc, result=r,
                                    detail=f"prandom % {n} = {r}"))
        _set(regs, dst, r)
        return
    if isinstance(a, RandSym) or isinstance(src, RandSym):
        raise BpfFault("enumerate mode: the random value may only be used as prandom % n")
    if isinstance(a, Ptr) or isinstance(src, Ptr) or isinstance(a, MapRef) or isinstance(src, MapRef):
        _set(regs, dst, _ptr_alu(op, a, src, wide))
        return
    assert isinstance(a, int) and isinstance(src, int)
    _set(regs, dst, _scalar_alu(op, a, src, wide, insn.off))


def _ptr_alu(op: int, a: Value, b: Value, wide: bool) -> Value:
    if wide and isinstance(a, Ptr) and isinstance(b, int) and op in (_A_ADD, _A_SUB):
        d = _sx(b, 64)
        return a.moved(d if op == _A_ADD else -d)
    if wide and op == _A_ADD and isinstance(a, int) and isinstance(b, Ptr):
        return b.moved(_sx(a, 64))
    if wide and op == _A_SUB and isinstance(a, Ptr) and isinstance(b, Ptr) and a.region is b.region:
        return (a.off - b.off) & _M64
    raise BpfFault(f"pointer arithmetic {AluOp(op).name} on {a!r} and {b!r} is prohibited")


def _scalar_alu(op: int, a: int, b: int, wide: bool, off: int) -> int:
    bits = 64 if wide else 32
    mask = _M64 if wide else _M32
    a &= mask
    b &= mask
    if op == _A_ADD:
        r = a + b
    elif op == _A_SUB:
        r = a - b
    elif op == _A_MUL:
        r = a * b
    elif op in (_A_DIV, _A_MOD):
        if off == 1:  # SDIV / SMOD: truncating toward zero, as C
            sa, sb = _sx(a, bits), _sx(b, bits)
            if sb == 0:
                r = 0 if op == _A_DIV else a
            elif op == _A_DIV:
                r = abs(sa) // abs(sb) * (1 if (sa < 0) == (sb < 0) else -1)
            else:
                r = sa - sb * (abs(sa) // abs(sb) * (1 if (sa < 0) == (sb < 0) else -1))
        elif b == 0:
            r = 0 if op == _A_DIV else a
        else:
            r = a // b if op == _A_DIV else a % b
    elif op == _A_OR:
        r = a | b
    elif op == _A_AND:
        r = a & b
    elif op == _A_XOR:
        r = a ^ b
    elif op == _A_LSH:
        r = a << (b & (bits - 1))
    elif op == _A_RSH:
        r = a >> (b & (bits - 1))
    elif op == _A_ARSH:
        r = _sx(a, bits) >> (b & (bits - 1))
    elif op == _A_NEG:
        r = -a
    else:
        raise BpfFault(f"unknown ALU operation {op:#x}")
    return r & mask


def _compare(op: int, a: Value, b: Value, is32: bool) -> bool:
    if isinstance(a, RandSym) or isinstance(b, RandSym):
        raise BpfFault("enumerate mode: the random value may only be used as prandom % n")
    if not (isinstance(a, int) and isinstance(b, int)):
        if isinstance(a, Ptr) and isinstance(b, Ptr) and a.region is b.region and not is32:
            a, b = a.off & _M64, b.off & _M64
        elif isinstance(b, int) and b == 0 and op in (_J_JEQ, _J_JNE) and not is32:
            return op == _J_JNE  # a pointer or map is never NULL
        else:
            raise BpfFault(f"comparing {a!r} with {b!r} (pointers compare only within one region)")
    bits = 32 if is32 else 64
    mask = (1 << bits) - 1
    a, b = a & mask, b & mask
    if op == _J_JEQ:
        return a == b
    if op == _J_JNE:
        return a != b
    if op == _J_JGT:
        return a > b
    if op == _J_JGE:
        return a >= b
    if op == _J_JLT:
        return a < b
    if op == _J_JLE:
        return a <= b
    if op == _J_JSET:
        return bool(a & b)
    sa, sb = _sx(a, bits), _sx(b, bits)
    if op == _J_JSGT:
        return sa > sb
    if op == _J_JSGE:
        return sa >= sb
    if op == _J_JSLT:
        return sa < sb
    if op == _J_JSLE:
        return sa <= sb
    raise BpfFault(f"unknown jump operation {op:#x}")


def _atomic(insn: Insn, dst: Ptr, size: int, regs: list[Value]) -> None:
    if size not in (4, 8):
        raise BpfFault(f"atomic operations are 4 or 8 bytes, not {size}")
    if dst.region.kind not in (RegionKind.STACK, RegionKind.MAP_VALUE):
        raise BpfFault(f"atomic operation on {dst.region.name}")
    mask = (1 << (8 * size)) - 1
    off = dst.off + insn.off
    old = dst.region.load(off, size)
    src = _int(regs, insn.src) & mask
    if not isinstance(old, int):
        raise BpfFault("atomic operation on a spilled pointer")
    imm = insn.imm & 0xFF
    if imm == _X_XCHG:
        dst.region.store(off, size, src)
        _set(regs, insn.src, old)
        return
    if imm == _X_CMPXCHG:
        r0 = _int(regs, 0) & mask
        if old == r0:
            dst.region.store(off, size, src)
        regs[0] = old
        return
    base = imm & ~_X_FETCH
    ops: dict[int, Callable[[int, int], int]] = {
        _X_ADD: lambda x, y: x + y, _X_OR: lambda x, y: x | y,
        _X_AND: lambda x, y: x & y, _X_XOR: lambda x, y: x ^ y}
    if base not in ops:
        raise BpfFault(f"unknown atomic operation {insn.imm:#x}")
    dst.region.store(off, size, ops[base](old, src) & mask)
    if imm & _X_FETCH:
        _set(regs, insn.src, old)
