"""Helpers, contexts and traces: programs over maps, sock_addr rewrites, random outcomes."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from emulation.bpf import (
    R0,
    R1,
    R2,
    R3,
    R4,
    R5,
    R6,
    R7,
    R10,
    Asm,
    AttachType,
    BpfFault,
    Helper,
    Machine,
    MapSpec,
    MapType,
    SkBuff,
    SockAddr,
    TraceKind,
    new_map,
)


def _map(kind: MapType = MapType.HASH, key: int = 4, value: int = 4, n: int = 8, fd: int = 3):
    return new_map(MapSpec(type=kind, key_size=key, value_size=value, max_entries=n, name="m"), fd)


def test_lookup_returns_a_pointer_that_writes_into_the_map() -> None:
    """A value found by map_lookup_elem is the map's memory: a store through it lands there."""
    m = _map()
    m.update((1).to_bytes(4, "little"), (5).to_bytes(4, "little"))
    a = Asm().st(4, R10, -4, 1).ld_map(R1, "m").mov(R2, R10).add(R2, -4).call(Helper.MAP_LOOKUP_ELEM)
    a.jeq(R0, 0, "miss").st(4, R0, 0, 42).mov(R0, 1).exit().label("miss").mov(R0, 0).exit()
    res = Machine({3: m}, names={3: "m"}).run(a.assemble({"m": 3}))
    assert res.ret == 1 and m.lookup((1).to_bytes(4, "little")) == (42).to_bytes(4, "little")
    assert [e.kind for e in res.trace] == [TraceKind.LOOKUP, TraceKind.EXIT]
    assert res.trace[0].map == "m" and res.trace[0].value == (5).to_bytes(4, "little")


def test_a_value_pointer_used_without_a_null_check_faults_on_a_miss() -> None:
    """Dereferencing the NULL a missed lookup returns is an error naming the pc."""
    a = Asm().st(4, R10, -4, 9).ld_map(R1, "m").mov(R2, R10).add(R2, -4).call(Helper.MAP_LOOKUP_ELEM)
    a.ldx(4, R0, R0, 0).exit()
    with pytest.raises(BpfFault, match=r"pc 6 .*not a pointer"):
        Machine({3: _map()}).run(a.assemble({"m": 3}))


def test_value_access_past_value_size_is_out_of_bounds() -> None:
    """A 4-byte value cannot be read at offset 4."""
    m = _map()
    m.update(bytes(4), bytes(4))
    a = Asm().st(4, R10, -4, 0).ld_map(R1, "m").mov(R2, R10).add(R2, -4).call(Helper.MAP_LOOKUP_ELEM)
    a.jeq(R0, 0, "out").ldx(4, R0, R0, 4).label("out").exit()
    with pytest.raises(BpfFault, match="out of bounds"):
        Machine({3: m}).run(a.assemble({"m": 3}))


def test_update_and_delete_from_a_program_return_errnos() -> None:
    """map_update_elem with NOEXIST on a present key returns -EEXIST; delete of a missing -ENOENT."""
    m = _map()
    a = Asm().st(4, R10, -4, 1).st(4, R10, -8, 2).ld_map(R1, "m").mov(R2, R10).add(R2, -4)
    a.mov(R3, R10).add(R3, -8).mov(R4, 1).call(Helper.MAP_UPDATE_ELEM).mov(R6, R0)
    a.ld_map(R1, "m").mov(R2, R10).add(R2, -4).mov(R3, R10).add(R3, -8).mov(R4, 1)
    a.call(Helper.MAP_UPDATE_ELEM).mov(R7, R0)
    a.st(4, R10, -4, 9).ld_map(R1, "m").mov(R2, R10).add(R2, -4).call(Helper.MAP_DELETE_ELEM)
    a.stx(8, R10, -16, R6).stx(8, R10, -24, R7).exit()
    res = Machine({3: m}).run(a.assemble({"m": 3}))
    kinds = [(e.kind, e.result) for e in res.trace if e.kind is not TraceKind.EXIT]
    assert kinds == [(TraceKind.UPDATE, 0), (TraceKind.UPDATE, -17), (TraceKind.DELETE, -2)]
    assert res.ret == (-2) & ((1 << 64) - 1)


def test_hash_of_maps_lookup_gives_an_inner_map_to_look_up_in() -> None:
    """The outer lookup returns the inner map, usable as the next lookup's map argument."""
    inner_spec = MapSpec(type=MapType.ARRAY, key_size=4, value_size=4, max_entries=2)
    inner = new_map(inner_spec, 10)
    inner.update((1).to_bytes(4, "little"), (77).to_bytes(4, "little"))
    outer = new_map(MapSpec(type=MapType.HASH_OF_MAPS, key_size=4, value_size=4, max_entries=2,
                            inner=inner_spec), 4)
    outer.update(bytes(4), inner)
    a = Asm().st(4, R10, -4, 0).ld_map(R1, "outer").mov(R2, R10).add(R2, -4)
    a.call(Helper.MAP_LOOKUP_ELEM).jeq(R0, 0, "out").mov(R1, R0).st(4, R10, -8, 1)
    a.mov(R2, R10).add(R2, -8).call(Helper.MAP_LOOKUP_ELEM).jeq(R0, 0, "out").ldx(4, R0, R0, 0)
    a.exit().label("out").mov(R0, 0).exit()
    assert Machine({4: outer}).run(a.assemble({"outer": 4})).ret == 77


def _connect_rewriter() -> Asm:
    """connect4: if the destination is 10.96.0.10:80, send it to 127.0.0.1:8080."""
    a = Asm().ldx(4, R2, R1, 4).jne(R2, int.from_bytes(bytes([10, 96, 0, 10]), "little"), "out")
    a.ldx(4, R2, R1, 24).jne(R2, 80 << 8, "out")  # htons(80) in the low half
    a.st(4, R1, 4, int.from_bytes(bytes([127, 0, 0, 1]), "little")).st(4, R1, 24, 0x901F)
    a.label("out").mov(R0, 1).exit()
    return a


def test_connect4_context_rewrite_is_read_back() -> None:
    """Stores into user_ip4 and user_port change the destination the socket connects to."""
    ctx = SockAddr(attach=AttachType.CGROUP_INET4_CONNECT, user_ip="10.96.0.10", user_port=80)
    res = Machine({}).run(_connect_rewriter().assemble(), ctx)
    assert res.ret32 == 1
    assert isinstance(res.ctx, SockAddr) and (res.ctx.user_ip, res.ctx.user_port) == ("127.0.0.1", 8080)


def test_sock_addr_read_only_fields_refuse_stores() -> None:
    """``family`` is read-only at every hook; user_ip4 does not exist at connect6."""
    with pytest.raises(BpfFault, match="invalid bpf_sock_addr"):
        Machine({}).run(Asm().st(4, R1, 28, 2).mov(R0, 1).exit().assemble(),
                        SockAddr(attach=AttachType.CGROUP_INET4_CONNECT, user_ip="1.2.3.4", user_port=1))
    with pytest.raises(BpfFault, match="invalid bpf_sock_addr"):
        Machine({}).run(Asm().ldx(4, R0, R1, 4).exit().assemble(),
                        SockAddr(attach=AttachType.CGROUP_INET6_CONNECT, user_ip="::1", user_port=1))


def _pick_of_three() -> Asm:
    """r0 = prandom % 3 + 1."""
    return Asm().call(Helper.GET_PRANDOM_U32).mod32(R0, 3).add(R0, 1).exit()


def test_enumerate_branches_over_every_modulo_outcome_with_exact_probabilities() -> None:
    """prandom % 3 has three outcomes; their shares of 2**32 values sum to one."""
    outs = Machine({}).enumerate(_pick_of_three().assemble())
    assert sorted(o.ret for o in outs) == [1, 2, 3]
    assert sum(o.probability for o in outs) == 1
    assert {o.ret: o.probability for o in outs}[1] == Fraction(1431655766, 1 << 32)


def test_sample_mode_draws_from_the_injected_random() -> None:
    """The same seed gives the same picks; the trace records the draw."""
    picks = [Machine({}, rng=random.Random(5)).run(_pick_of_three().assemble()).ret for _ in range(2)]
    assert picks[0] == picks[1]
    res = Machine({}, rng=random.Random(5)).run(_pick_of_three().assemble())
    assert res.trace[0].kind is TraceKind.RANDOM


def test_enumerate_refuses_other_uses_of_the_random_value() -> None:
    """Comparing the raw random value cannot be enumerated."""
    a = Asm().call(Helper.GET_PRANDOM_U32).jeq(R0, 0, "x").label("x").mov(R0, 0).exit()
    with pytest.raises(BpfFault, match="prandom % n"):
        Machine({}).enumerate(a.assemble())


def test_enumerate_paths_keep_their_own_maps() -> None:
    """Each random path writes its own copy of the maps; the machine's maps stay untouched."""
    m = _map()
    a = Asm().call(Helper.GET_PRANDOM_U32).mod32(R0, 2).stx(4, R10, -8, R0).st(4, R10, -4, 0)
    a.ld_map(R1, "m").mov(R2, R10).add(R2, -4).mov(R3, R10).add(R3, -8).mov(R4, 0)
    a.call(Helper.MAP_UPDATE_ELEM).exit()
    outs = Machine({3: m}).enumerate(a.assemble({"m": 3}))
    assert sorted(o.maps[3].lookup(bytes(4)) for o in outs if o.maps) == [bytes(4), (1).to_bytes(4, "little")]
    assert len(m) == 0


def _udp_frame() -> bytes:
    eth = bytes(12) + b"\x08\x00"
    ip = bytes.fromhex("4500001c000000004011") + b"\x00\x00" + bytes([10, 0, 0, 1, 10, 96, 0, 10])
    udp = bytes.fromhex("303900500008") + b"\x00\x00"
    return eth + ip + udp


def test_sched_cls_sees_packet_pointers_and_must_bounds_check() -> None:
    """data/data_end point into the packet; reading past data_end faults."""
    a = Asm().ldx(4, R2, R1, 76).ldx(4, R3, R1, 80).mov(R4, R2).add(R4, 34)
    a.jgt(R4, R3, "short").ldx(1, R0, R2, 23).exit().label("short").mov(R0, 0).exit()
    assert Machine({}).run(a.assemble(), SkBuff(packet=_udp_frame())).ret == 17
    bad = Asm().ldx(4, R2, R1, 76).ldx(1, R0, R2, 100).exit()
    with pytest.raises(BpfFault, match="out of bounds"):
        Machine({}).run(bad.assemble(), SkBuff(packet=_udp_frame()))


def test_l3_csum_replace_keeps_the_ip_checksum_valid() -> None:
    """Rewriting the destination with l3_csum_replace leaves a header that sums to 0xffff."""
    frame = bytearray(_udp_frame())
    frame[24:26] = _ip_csum(bytes(frame[14:34])).to_bytes(2, "big")
    old = int.from_bytes(bytes([10, 96, 0, 10]), "little")
    new = int.from_bytes(bytes([10, 244, 1, 5]), "little")
    b = Asm().mov(R6, R1).ld_imm64(R7, new).stx(4, R10, -4, R7)
    b.mov(R1, R6).mov(R2, 30).mov(R3, R10).add(R3, -4).mov(R4, 4).mov(R5, 0)
    b.call(Helper.SKB_STORE_BYTES).mov(R1, R6).mov(R2, 24).ld_imm64(R3, old).ld_imm64(R4, new)
    b.mov(R5, 4).call(Helper.L3_CSUM_REPLACE).mov(R0, 0).exit()
    res = Machine({}).run(b.assemble(), SkBuff(packet=bytes(frame)))
    assert res.packet[30:34] == bytes([10, 244, 1, 5])
    assert _ip_csum(res.packet[14:34]) == 0


def _ip_csum(header: bytes) -> int:
    s = sum(int.from_bytes(header[i:i + 2], "big") for i in range(0, len(header), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF



def test_a_helper_argument_never_written_is_refused() -> None:
    """skb_store_bytes with r5 (flags) unset faults, as the verifier's R5 !read_ok."""
    a = Asm().st(4, R10, -4, 0).mov(R2, 30).mov(R3, R10).add(R3, -4).mov(R4, 4)
    a.call(Helper.SKB_STORE_BYTES).mov(R0, 0).exit()
    with pytest.raises(BpfFault, match="r5"):
        Machine({}).run(a.assemble(), SkBuff(packet=_udp_frame()))


def test_legacy_packet_loads_are_big_endian_and_end_the_program_past_the_packet() -> None:
    """LD ABS/IND read network order; a load past the end returns 0 at once."""
    frame = _udp_frame()
    a = Asm().mov(R6, R1).ld_abs(2, 12).mov(R7, R0).mov(R2, 2).ld_ind(1, R2, 21).lsh(R7, 8).or_(R0, R7)
    a.exit()
    assert Machine({}).run(a.assemble(), SkBuff(packet=frame)).ret == (0x0800 << 8) | 17
    b = Asm().mov(R6, R1).ld_abs(4, 1000).mov(R0, 7).exit()
    assert Machine({}).run(b.assemble(), SkBuff(packet=frame)).ret == 0


def test_map_value_pseudo_load_points_into_an_array_value() -> None:
    """lddw BPF_PSEUDO_MAP_VALUE gives a pointer into element 0 at the offset given."""
    m = _map(MapType.ARRAY, value=16, n=1)
    m.update(bytes(4), bytes(range(16)))
    a = Asm().ld_map_value(R1, "m", 4).ldx(4, R0, R1, 0).exit()
    assert Machine({3: m}).run(a.assemble({"m": 3})).ret == int.from_bytes(bytes(range(4, 8)), "little")


def test_array_of_maps_lookup_from_a_program() -> None:
    """An array of maps hands its inner map to the next lookup; an empty index is NULL."""
    inner_spec = MapSpec(type=MapType.HASH, key_size=4, value_size=4, max_entries=2)
    inner = new_map(inner_spec, 10)
    inner.update(bytes(4), (5).to_bytes(4, "little"))
    outer = new_map(MapSpec(type=MapType.ARRAY_OF_MAPS, key_size=4, value_size=4, max_entries=2,
                            inner=inner_spec), 4)
    outer.update(bytes(4), inner)
    for index, expected in ((0, 5), (1, 99)):
        a = Asm().st(4, R10, -4, index).ld_map(R1, "o").mov(R2, R10).add(R2, -4)
        a.call(Helper.MAP_LOOKUP_ELEM).jeq(R0, 0, "none").mov(R1, R0).st(4, R10, -8, 0)
        a.mov(R2, R10).add(R2, -8).call(Helper.MAP_LOOKUP_ELEM).jeq(R0, 0, "none").ldx(4, R0, R0, 0)
        a.exit().label("none").mov(R0, 99).exit()
        assert Machine({4: outer}).run(a.assemble({"o": 4})).ret == expected


def test_a_fault_names_the_pc_and_the_instruction() -> None:
    """The error says where: pc, opcode and registers."""
    with pytest.raises(BpfFault, match=r"pc 1 \(op 0x61 dst r0 src r2"):
        Machine({}).run(Asm().mov(R2, 5).ldx(4, R0, R2, 0).exit().assemble())
