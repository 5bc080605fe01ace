"""The helpers BPF programs call, with the kernel's semantics, and the run environment.

Helper numbers are bpf.h's ``BPF_FUNC_*``. Semantics follow kernel/bpf/helpers.c (map access,
``ktime_get_ns``, ``get_prandom_u32``), net/core/filter.c (``skb_store_bytes``,
``skb_load_bytes``, ``l3_csum_replace``, ``l4_csum_replace``, ``csum_diff``, ``redirect``,
``get_socket_cookie``, ``get_netns_cookie``) and kernel/bpf/cgroup.c (``set_retval``,
``get_retval``). The checksum helpers compute exactly what include/net/checksum.h computes on a
little-endian machine: the register values are the field's bytes read little-endian.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from fractions import Fraction

from emulation.bpf.context import SkBuff, SockAddr
from emulation.bpf.maps import BpfMap, MapError, MapType
from emulation.bpf.memory import UNINIT, BpfFault, MapRef, Ptr, Region, RegionKind, Value

__all__ = [
    "Chooser",
    "Env",
    "Helper",
    "RandSym",
    "TraceEvent",
    "TraceKind",
    "call_helper",
]

#: tc's ``TC_ACT_REDIRECT``, what ``bpf_redirect`` returns.
TC_ACT_REDIRECT = 7
_U64 = (1 << 64) - 1


class Helper(IntEnum):
    """bpf.h ``BPF_FUNC_*`` numbers of the helpers modelled."""

    MAP_LOOKUP_ELEM = 1
    MAP_UPDATE_ELEM = 2
    MAP_DELETE_ELEM = 3
    KTIME_GET_NS = 5
    GET_PRANDOM_U32 = 7
    SKB_STORE_BYTES = 9
    L3_CSUM_REPLACE = 10
    L4_CSUM_REPLACE = 11
    REDIRECT = 23
    SKB_LOAD_BYTES = 26
    CSUM_DIFF = 28
    GET_SOCKET_COOKIE = 46
    GET_NETNS_COOKIE = 122
    KTIME_GET_BOOT_NS = 125
    GET_RETVAL = 186
    SET_RETVAL = 187


class TraceKind(Enum):
    """What a trace event records."""

    LOOKUP = "lookup"
    UPDATE = "update"
    DELETE = "delete"
    RANDOM = "random"
    HELPER = "helper"
    EXIT = "exit"


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEvent:
    """One step worth explaining: a map access, a random draw, a helper, the decision.

    Attributes:
        kind: what happened.
        pc: the instruction index.
        map: the map's name (map events).
        key: the key bytes (map events).
        value: the value found or written (None: not found).
        result: the helper's return (0, or a negative errno), or the program's return code.
        detail: a readable note (``slot 2 of 3``, ``redirect ifindex 4``).
    """

    kind: TraceKind
    pc: int
    map: str = ""
    key: bytes = b""
    value: bytes | None = None
    result: int = 0
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RandSym:
    """``bpf_get_prandom_u32()`` in enumerate mode: resolved when taken modulo a count."""

    pc: int


@dataclass(slots=True)
class Chooser:
    """Replays a path through the random outcomes and records the branching it met.

    ``forced`` is the prefix of choices to take; past it, choice 0 is taken and the branching
    factor recorded in ``widths``. The probability of the path is the product of each choice's
    share of the 2**32 random values (``prandom % n == r`` for ``r`` in ``0..n-1``).
    """

    forced: tuple[int, ...] = ()
    taken: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    probability: Fraction = Fraction(1)

    def choose(self, n: int) -> int:
        """The outcome of ``prandom % n`` on this path."""
        i = len(self.taken)
        r = self.forced[i] if i < len(self.forced) else 0
        self.taken.append(r)
        self.widths.append(n)
        hits = ((1 << 32) - 1 - r) // n + 1
        self.probability *= Fraction(hits, 1 << 32)
        return r


@dataclass(slots=True, kw_only=True)
class Env:
    """What one run's helpers see and change.

    Attributes:
        maps: fd -> map (the fd table the bytecode's ``lddw`` refer to).
        names: fd -> name, for the trace.
        ctx: the context object (or None for programs without one).
        packet: the packet region (tc programs).
        clock_ns: monotonic nanoseconds (``bpf_ktime_get_ns``).
        rng: the sample-mode random source; None with a ``chooser`` (enumerate mode).
        chooser: enumerate mode's path.
        trace: events, appended.
        redirect: ``(ifindex, flags)`` after ``bpf_redirect``.
        retval: what ``bpf_set_retval`` set (cgroup programs), or None.
    """

    maps: dict[int, BpfMap]
    names: dict[int, str]
    ctx: SockAddr | SkBuff | None = None
    packet: Region | None = None
    clock_ns: Callable[[], int] = lambda: 0
    rng: random.Random | None = None
    chooser: Chooser | None = None
    trace: list[TraceEvent] = field(default_factory=list)
    redirect: tuple[int, int] | None = None
    retval: int | None = None

    def name(self, m: MapRef) -> str:
        """The map's name for the trace."""
        return self.names.get(m.fd, m.map.spec.name or f"fd{m.fd}")


def _mapref(v: Value, what: str) -> MapRef:
    if not isinstance(v, MapRef):
        raise BpfFault(f"{what}: argument 1 must be a map, got {v!r}")
    return v


def _mem(v: Value, size: int, what: str) -> bytes:
    if not isinstance(v, Ptr):
        raise BpfFault(f"{what}: expected a pointer to {size} bytes, got {v!r}")
    return v.region.read_bytes(v.off, size)


def _scalar(v: Value, what: str) -> int:
    if not isinstance(v, int):
        raise BpfFault(f"{what}: expected a scalar, got {v!r}")
    return v


def _err(e: int) -> int:
    return (-e) & _U64


def _lookup(env: Env, pc: int, a: list[Value]) -> Value:
    m = _mapref(a[0], "map_lookup_elem")
    key = _mem(a[1], m.map.spec.key_size, "map_lookup_elem key")
    found = m.map.lookup_ref(key)
    shown = None if found is None else (found.id.to_bytes(4, "little") if isinstance(found, BpfMap)
                                        else bytes(found))
    env.trace.append(TraceEvent(kind=TraceKind.LOOKUP, pc=pc, map=env.name(m), key=key, value=shown))
    if found is None:
        return 0
    if isinstance(found, BpfMap):
        return MapRef(found, -found.id)
    return Ptr(Region(RegionKind.MAP_VALUE, found, f"map {env.name(m)} value"), 0)


def _update(env: Env, pc: int, a: list[Value]) -> Value:
    m = _mapref(a[0], "map_update_elem")
    if m.map.spec.type in (MapType.ARRAY_OF_MAPS, MapType.HASH_OF_MAPS):
        raise BpfFault("map_update_elem: programs cannot update a map of maps")
    key = _mem(a[1], m.map.spec.key_size, "map_update_elem key")
    value = _mem(a[2], m.map.spec.value_size, "map_update_elem value")
    try:
        m.map.update(key, value, _scalar(a[3], "map_update_elem flags"))
        res = 0
    except MapError as e:
        res = _err(e.errno or errno.EINVAL)
    env.trace.append(TraceEvent(kind=TraceKind.UPDATE, pc=pc, map=env.name(m), key=key, value=value,
                                result=res - (1 << 64) if res else 0))
    return res


def _delete(env: Env, pc: int, a: list[Value]) -> Value:
    m = _mapref(a[0], "map_delete_elem")
    key = _mem(a[1], m.map.spec.key_size, "map_delete_elem key")
    try:
        m.map.delete(key)
        res = 0
    except MapError as e:
        res = _err(e.errno or errno.EINVAL)
    env.trace.append(TraceEvent(kind=TraceKind.DELETE, pc=pc, map=env.name(m), key=key,
                                result=res - (1 << 64) if res else 0))
    return res


def _prandom(env: Env, pc: int, a: list[Value]) -> Value:
    if env.chooser is not None:
        return RandSym(pc)  # type: ignore[return-value]
    if env.rng is None:
        raise BpfFault("bpf_get_prandom_u32: the machine has no random source")
    r = env.rng.getrandbits(32)
    env.trace.append(TraceEvent(kind=TraceKind.RANDOM, pc=pc, result=r, detail="sample"))
    return r


def _skb(env: Env, v: Value, what: str) -> Region:
    if env.packet is None or not isinstance(env.ctx, SkBuff) or not isinstance(v, Ptr) \
            or v.region.kind is not RegionKind.CTX:
        raise BpfFault(f"{what}: argument 1 must be the __sk_buff context")
    return env.packet


def _store_bytes(env: Env, pc: int, a: list[Value]) -> Value:
    pkt = _skb(env, a[0], "skb_store_bytes")
    off, size = _scalar(a[1], "offset"), _scalar(a[3], "len")
    raw = _mem(a[2], size, "skb_store_bytes from")
    if off + size > len(pkt.data):
        return _err(errno.EFAULT)
    pkt.data[off:off + size] = raw
    return 0


def _load_bytes(env: Env, pc: int, a: list[Value]) -> Value:
    pkt = _skb(env, a[0], "skb_load_bytes")
    off, size = _scalar(a[1], "offset"), _scalar(a[3], "len")
    to = a[2]
    if not isinstance(to, Ptr):
        raise BpfFault("skb_load_bytes: argument 3 must be a pointer")
    if off + size > len(pkt.data):
        to.region.write_bytes(to.off, bytes(size))
        return _err(errno.EFAULT)
    to.region.write_bytes(to.off, bytes(pkt.data[off:off + size]))
    return 0


def _csum_add(a: int, b: int) -> int:
    res = (a + b) & 0xFFFF_FFFF
    return (res + (res < b)) & 0xFFFF_FFFF


def _csum_fold(s: int) -> int:
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def _replace4(old: int, frm: int, to: int) -> int:
    """include/net/checksum.h ``csum_replace4`` (``old`` is ``*sum`` read as a u16)."""
    return _csum_fold(_csum_add(_csum_add(~old & 0xFFFF_FFFF, ~frm & 0xFFFF_FFFF), to))


def _replace2(old: int, frm: int, to: int) -> int:
    """include/net/checksum.h ``csum_replace2`` in 16-bit ones' complement."""
    def add16(c: int, x: int) -> int:
        r = (c + x) & 0xFFFF
        return (r + (r < x)) & 0xFFFF
    return ~add16(add16(~old & 0xFFFF, ~frm & 0xFFFF), to) & 0xFFFF


def _by_diff(old: int, diff: int) -> int:
    return _csum_fold(_csum_add(diff, ~old & 0xFFFF_FFFF))


def _csum_field(env: Env, a: list[Value], what: str) -> tuple[Region, int, int, int, int]:
    pkt = _skb(env, a[0], what)
    off = _scalar(a[1], "offset")
    if off + 2 > len(pkt.data):
        raise _Errno(errno.EFAULT)
    return pkt, off, _scalar(a[2], "from") & 0xFFFF_FFFF, _scalar(a[3], "to") & 0xFFFF_FFFF, \
        _scalar(a[4], "flags")


class _Errno(Exception):
    def __init__(self, err: int) -> None:
        self.err = err


def _l3_csum(env: Env, pc: int, a: list[Value]) -> Value:
    try:
        pkt, off, frm, to, flags = _csum_field(env, a, "l3_csum_replace")
    except _Errno as e:
        return _err(e.err)
    if flags & ~0xF:
        return _err(errno.EINVAL)
    old = int.from_bytes(pkt.data[off:off + 2], "little")
    size = flags & 0xF
    if size == 0:
        if frm:
            return _err(errno.EINVAL)
        new = _by_diff(old, to)
    elif size == 2:
        new = _replace2(old, frm & 0xFFFF, to & 0xFFFF)
    elif size == 4:
        new = _replace4(old, frm, to)
    else:
        return _err(errno.EINVAL)
    pkt.data[off:off + 2] = new.to_bytes(2, "little")
    return 0


#: bpf.h ``BPF_F_PSEUDO_HDR``, ``BPF_F_MARK_MANGLED_0``, ``BPF_F_MARK_ENFORCE``.
F_PSEUDO_HDR, F_MARK_MANGLED_0, F_MARK_ENFORCE = 0x10, 0x20, 0x40


def _l4_csum(env: Env, pc: int, a: list[Value]) -> Value:
    try:
        pkt, off, frm, to, flags = _csum_field(env, a, "l4_csum_replace")
    except _Errno as e:
        return _err(e.err)
    if flags & ~(F_PSEUDO_HDR | F_MARK_MANGLED_0 | F_MARK_ENFORCE | 0xF):
        return _err(errno.EINVAL)
    old = int.from_bytes(pkt.data[off:off + 2], "little")
    mangled0 = bool(flags & F_MARK_MANGLED_0)
    if mangled0 and old == 0:
        return 0  # UDP without a checksum stays without one
    size = flags & 0xF
    if size == 0:
        new = _by_diff(old, to)
    elif size in (2, 4):
        new = _replace4(old, frm, to)  # inet_proto_csum_replace2 widens to the 4-byte form
    else:
        return _err(errno.EINVAL)
    if mangled0 and new == 0:
        new = 0xFFFF  # CSUM_MANGLED_0
    pkt.data[off:off + 2] = new.to_bytes(2, "little")
    return 0


def _csum_diff(env: Env, pc: int, a: list[Value]) -> Value:
    fsize, tsize, seed = _scalar(a[1], "from_size"), _scalar(a[3], "to_size"), _scalar(a[4], "seed")
    if fsize % 4 or tsize % 4:
        return _err(errno.EINVAL)
    frm = _mem(a[0], fsize, "csum_diff from") if fsize else b""
    to = _mem(a[2], tsize, "csum_diff to") if tsize else b""
    s = seed & 0xFFFF_FFFF
    for i in range(0, fsize, 4):
        s = _csum_add(s, ~int.from_bytes(frm[i:i + 4], "little") & 0xFFFF_FFFF)
    for i in range(0, tsize, 4):
        s = _csum_add(s, int.from_bytes(to[i:i + 4], "little"))
    return s


def _redirect(env: Env, pc: int, a: list[Value]) -> Value:
    ifindex, flags = _scalar(a[0], "ifindex"), _scalar(a[1], "flags")
    if flags & ~1:
        return 2  # TC_ACT_SHOT, as bpf_redirect with unknown flags
    env.redirect = (ifindex & 0xFFFF_FFFF, flags)
    env.trace.append(TraceEvent(kind=TraceKind.HELPER, pc=pc, detail=f"redirect ifindex {ifindex}"
                                + (" ingress" if flags & 1 else "")))
    return TC_ACT_REDIRECT


def _socket_cookie(env: Env, pc: int, a: list[Value]) -> Value:
    return env.ctx.socket_cookie if isinstance(env.ctx, SockAddr) else 0


def _netns_cookie(env: Env, pc: int, a: list[Value]) -> Value:
    return env.ctx.netns_cookie if isinstance(env.ctx, SockAddr) else 0


def _ktime(env: Env, pc: int, a: list[Value]) -> Value:
    return env.clock_ns() & _U64


def _set_retval(env: Env, pc: int, a: list[Value]) -> Value:
    v = _scalar(a[0], "retval") & 0xFFFF_FFFF
    env.retval = v - (1 << 32) if v & 0x8000_0000 else v
    return 0


def _get_retval(env: Env, pc: int, a: list[Value]) -> Value:
    return (env.retval or 0) & _U64


_TABLE: dict[int, Callable[[Env, int, list[Value]], Value]] = {
    Helper.MAP_LOOKUP_ELEM: _lookup,
    Helper.MAP_UPDATE_ELEM: _update,
    Helper.MAP_DELETE_ELEM: _delete,
    Helper.KTIME_GET_NS: _ktime,
    Helper.KTIME_GET_BOOT_NS: _ktime,
    Helper.GET_PRANDOM_U32: _prandom,
    Helper.SKB_STORE_BYTES: _store_bytes,
    Helper.L3_CSUM_REPLACE: _l3_csum,
    Helper.L4_CSUM_REPLACE: _l4_csum,
    Helper.REDIRECT: _redirect,
    Helper.SKB_LOAD_BYTES: _load_bytes,
    Helper.CSUM_DIFF: _csum_diff,
    Helper.GET_SOCKET_COOKIE: _socket_cookie,
    Helper.GET_NETNS_COOKIE: _netns_cookie,
    Helper.GET_RETVAL: _get_retval,
    Helper.SET_RETVAL: _set_retval,
}


#: How many of r1-r5 each helper reads (its ``bpf_func_proto`` argument list).
_ARITY: dict[int, int] = {Helper.MAP_LOOKUP_ELEM: 2, Helper.MAP_UPDATE_ELEM: 4, Helper.MAP_DELETE_ELEM: 2,
          Helper.SKB_STORE_BYTES: 5, Helper.L3_CSUM_REPLACE: 5, Helper.L4_CSUM_REPLACE: 5,
          Helper.REDIRECT: 2, Helper.SKB_LOAD_BYTES: 4, Helper.CSUM_DIFF: 5,
          Helper.GET_SOCKET_COOKIE: 1, Helper.GET_NETNS_COOKIE: 1, Helper.SET_RETVAL: 1}


def call_helper(env: Env, pc: int, number: int, args: list[Value]) -> Value:
    """Run helper ``number`` with r1-r5 = ``args``; its r0.

    Raises:
        BpfFault: an unknown helper, or arguments the verifier would refuse.
    """
    fn = _TABLE.get(number)
    if fn is None:
        raise BpfFault(f"pc {pc}: helper {number} is not modelled (known: "
                       f"{', '.join(h.name.lower() for h in Helper)})")
    for i in range(_ARITY.get(number, 0)):
        if args[i] is UNINIT:
            raise BpfFault(f"helper {Helper(number).name.lower()}: argument r{i + 1} is read before "
                           "it was written (!read_ok)")
    return fn(env, pc, args)
