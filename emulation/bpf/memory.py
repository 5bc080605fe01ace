"""The machine's memory: regions (stack, context, packet, map value) and tagged pointers.

A register holds a scalar (an ``int`` in ``0 .. 2**64-1``), a :class:`Ptr` into one region, a
:class:`MapRef` (what ``lddw BPF_PSEUDO_MAP_FD`` loads), or nothing (:data:`UNINIT`: the kernel's
``NOT_INIT``, as r1-r5 after a call). Every access is checked at run time against its region, as
the verifier checks it statically: out-of-bounds, unaligned context access, reading stack bytes
never written, writing read-only memory each raise :class:`BpfFault` naming the pc and region.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from emulation.bpf.maps import BpfMap
from emulation.errors import EmulationError

__all__ = [
    "UNINIT",
    "BpfFault",
    "MapRef",
    "Ptr",
    "Region",
    "RegionKind",
    "Value",
]

#: bpf.h ``MAX_BPF_STACK``: bytes of stack per frame.
STACK_SIZE = 512


class BpfFault(EmulationError, RuntimeError):
    """The program did what the verifier (or the kernel at run time) refuses."""


class RegionKind(Enum):
    """What a pointer points into (the verifier's ``PTR_TO_*`` families)."""

    STACK = "stack"
    CTX = "ctx"
    PACKET = "packet"
    MAP_VALUE = "map_value"


@dataclass(eq=False, slots=True)
class Region:
    """A span of bytes a pointer may address.

    Attributes:
        kind: what it is.
        data: the bytes (a map value is the map's own ``bytearray``: writes land in the map).
        name: for messages (``stack``, ``map services``...).
        writable: stores allowed.
        init: for the stack, one flag per byte: written yet.
        spills: for the stack, pointers spilled at an 8-byte slot (offset -> value).
    """

    kind: RegionKind
    data: bytearray
    name: str
    writable: bool = True
    init: bytearray | None = None
    spills: dict[int, Value] = field(default_factory=dict)

    def _check(self, off: int, size: int, what: str) -> None:
        if off < 0 or off + size > len(self.data):
            raise BpfFault(f"{what} of {size} bytes at offset {off} of {self.name} "
                           f"(size {len(self.data)}): out of bounds")

    def load(self, off: int, size: int) -> Value:
        """Read ``size`` bytes at ``off`` as a little-endian scalar (or a spilled pointer)."""
        self._check(off, size, "read")
        if size == 8 and off in self.spills:
            return self.spills[off]
        if self.init is not None and not all(self.init[off:off + size]):
            raise BpfFault(f"read of {size} bytes at {self.name}{off - len(self.data):+d}: "
                           "stack bytes never written (invalid read from stack)")
        if any(s <= off + size - 1 and off <= s + 7 for s in self.spills):
            raise BpfFault(f"partial read of a spilled pointer at {self.name} offset {off}")
        return int.from_bytes(self.data[off:off + size], "little")

    def store(self, off: int, size: int, value: Value) -> None:
        """Write ``size`` bytes of ``value`` at ``off`` (a pointer only as an aligned stack spill)."""
        self._check(off, size, "write")
        if not self.writable:
            raise BpfFault(f"write into read-only {self.name}")
        for s in [s for s in self.spills if s <= off + size - 1 and off <= s + 7]:
            del self.spills[s]
        if not isinstance(value, int):
            if self.kind is not RegionKind.STACK or size != 8 or off % 8:
                raise BpfFault(f"a pointer may only be spilled to an aligned 8-byte stack slot, "
                               f"not {size} bytes at {self.name} offset {off}")
            self.spills[off] = value
        else:
            self.data[off:off + size] = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
        if self.init is not None:
            self.init[off:off + size] = b"\x01" * size

    def read_bytes(self, off: int, size: int) -> bytes:
        """``size`` raw bytes (helper arguments such as a map key)."""
        self._check(off, size, "read")
        if self.init is not None and not all(self.init[off:off + size]):
            raise BpfFault(f"helper read of {size} bytes at {self.name}{off - len(self.data):+d}: "
                           "stack bytes never written")
        return bytes(self.data[off:off + size])

    def write_bytes(self, off: int, raw: bytes) -> None:
        """Write raw bytes (helpers that fill memory)."""
        self._check(off, len(raw), "write")
        if not self.writable:
            raise BpfFault(f"write into read-only {self.name}")
        self.data[off:off + len(raw)] = raw
        if self.init is not None:
            self.init[off:off + len(raw)] = b"\x01" * len(raw)


def stack_region(frame: int = 0) -> Region:
    """A fresh 512-byte frame, every byte unwritten."""
    return Region(RegionKind.STACK, bytearray(STACK_SIZE), f"stack{frame or ''}",
                  init=bytearray(STACK_SIZE))


@dataclass(frozen=True, slots=True)
class Ptr:
    """A pointer: ``region`` plus a byte offset (r10 is ``Ptr(stack, 512)``)."""

    region: Region
    off: int

    def moved(self, delta: int) -> Ptr:
        """This pointer ``delta`` bytes further."""
        return Ptr(self.region, self.off + delta)


@dataclass(frozen=True, slots=True)
class MapRef:
    """A map, as a register holds it after ``lddw rX, map`` or an outer-map lookup."""

    map: BpfMap
    fd: int


class _Uninit:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNINIT"


#: A register never written (or clobbered by a call).
UNINIT = _Uninit()

Value = int | Ptr | MapRef | _Uninit
