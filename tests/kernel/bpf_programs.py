"""BPF programs and packets shared by the real-kernel BPF suites (assembled with emulation.bpf).

``tc_dnat``: a sched_cls program that DNATs IPv4 TCP and UDP through a hash map
``{daddr, dport, proto, pad} -> {backend addr, backend port, pad}`` with the checksum helpers
(``l3_csum_replace``, ``l4_csum_replace`` with ``BPF_F_PSEUDO_HDR``, ``BPF_F_MARK_MANGLED_0``
for UDP), counting translations in an array with an atomic add. ``connect4_dnat``: a cgroup
connect4 program rewriting ``user_ip4``/``user_port`` through a hash map of the same key.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from emulation.bpf import R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, Asm, Helper, MapSpec, MapType

TC_ACT_OK, TC_ACT_SHOT = 0, 2
F_PSEUDO_HDR, F_MARK_MANGLED_0 = 0x10, 0x20

SERVICES = MapSpec(type=MapType.HASH, key_size=8, value_size=8, max_entries=64, name="svc")
HITS = MapSpec(type=MapType.ARRAY, key_size=4, value_size=8, max_entries=1, name="hits")


def service_key(ip: str, port: int, proto: int) -> bytes:
    """``{__be32 addr; __be16 port; u8 proto; u8 pad}``."""
    return ipaddress.IPv4Address(ip).packed + port.to_bytes(2, "big") + bytes([proto, 0])


def backend_value(ip: str, port: int) -> bytes:
    """``{__be32 addr; __be16 port; u16 pad}``."""
    return ipaddress.IPv4Address(ip).packed + port.to_bytes(2, "big") + bytes(2)


def tc_dnat() -> Asm:
    """The tc DNAT program (maps ``svc`` and ``hits``)."""
    a = Asm().mov(R6, R1)
    a.ldx(4, R7, R6, 76).ldx(4, R8, R6, 80).mov(R2, R7).add(R2, 42).jgt(R2, R8, "shot")
    a.ldx(2, R2, R7, 12).jne(R2, 0x0008, "pass")  # EtherType 0x0800, read little-endian
    a.ldx(1, R2, R7, 14).jne(R2, 0x45, "pass")  # IPv4 without options
    a.ldx(1, R9, R7, 23)
    a.mov(R8, 50).jeq(R9, 6, "l4").mov(R8, 40).jeq(R9, 17, "l4").ja("pass")
    a.label("l4")
    a.ldx(4, R2, R7, 30).stx(4, R10, -8, R2).ldx(2, R2, R7, 36).stx(2, R10, -4, R2)
    a.stx(1, R10, -2, R9).st(1, R10, -1, 0)
    a.ld_map(R1, "svc").mov(R2, R10).add(R2, -8).call(Helper.MAP_LOOKUP_ELEM)
    a.jeq(R0, 0, "pass").mov(R7, R0)
    a.mov(R9, F_MARK_MANGLED_0).jeq(R8, 40, "udp").mov(R9, 0).label("udp")
    # the address
    a.ldx(4, R2, R7, 0).stx(4, R10, -16, R2)
    a.mov(R1, R6).mov(R2, 30).mov(R3, R10).add(R3, -16).mov(R4, 4).mov(R5, 0)
    a.call(Helper.SKB_STORE_BYTES)
    a.mov(R1, R6).mov(R2, 24).ldx(4, R3, R10, -8).ldx(4, R4, R10, -16).mov(R5, 4)
    a.call(Helper.L3_CSUM_REPLACE)
    a.mov(R1, R6).mov(R2, R8).ldx(4, R3, R10, -8).ldx(4, R4, R10, -16).mov(R5, R9)
    a.or_(R5, F_PSEUDO_HDR | 4).call(Helper.L4_CSUM_REPLACE)
    # the port
    a.ldx(2, R2, R7, 4).stx(2, R10, -20, R2)
    a.mov(R1, R6).mov(R2, 36).mov(R3, R10).add(R3, -20).mov(R4, 2).mov(R5, 0)
    a.call(Helper.SKB_STORE_BYTES)
    a.mov(R1, R6).mov(R2, R8).ldx(2, R3, R10, -4).ldx(2, R4, R10, -20).mov(R5, R9).or_(R5, 2)
    a.call(Helper.L4_CSUM_REPLACE)
    # count it
    a.st(4, R10, -24, 0).ld_map(R1, "hits").mov(R2, R10).add(R2, -24).call(Helper.MAP_LOOKUP_ELEM)
    a.jeq(R0, 0, "pass").mov(R1, 1).xadd(8, R0, 0, R1)
    a.label("pass").mov(R0, TC_ACT_OK).exit()
    a.label("shot").mov(R0, TC_ACT_SHOT).exit()
    return a


def connect4_dnat() -> Asm:
    """The cgroup connect4 program (map ``svc``): a known Service is rewritten to its backend."""
    a = Asm().mov(R6, R1)
    a.ldx(4, R2, R6, 4).stx(4, R10, -8, R2).ldx(4, R2, R6, 24).stx(2, R10, -4, R2)
    a.ldx(4, R2, R6, 36).stx(1, R10, -2, R2).st(1, R10, -1, 0)
    a.ld_map(R1, "svc").mov(R2, R10).add(R2, -8).call(Helper.MAP_LOOKUP_ELEM)
    a.jeq(R0, 0, "out")
    a.ldx(4, R2, R0, 0).stx(4, R6, 4, R2).ldx(2, R2, R0, 4).stx(4, R6, 24, R2)
    a.label("out").mov(R0, 1).exit()
    return a


def _csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def frame(src: str, dst: str, sport: int, dport: int, proto: int, payload: bytes = b"hello",
          *, udp_csum: bool = True) -> bytes:
    """An Ethernet + IPv4 + TCP/UDP frame with valid checksums (UDP's may be left 0)."""
    s, d = socket.inet_aton(src), socket.inet_aton(dst)
    if proto == 6:
        l4 = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x02, 65535, 0, 0) + payload
        off = 16
    else:
        l4 = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
        off = 6
    pseudo = s + d + struct.pack("!BBH", 0, proto, len(l4))
    c = _csum(pseudo + l4) if proto == 6 or udp_csum else 0
    if proto == 17 and udp_csum and c == 0:
        c = 0xFFFF
    l4 = l4[:off] + c.to_bytes(2, "big") + l4[off + 2:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(l4), 1, 0, 64, proto, 0, s, d)
    ip = ip[:10] + _csum(ip).to_bytes(2, "big") + ip[12:]
    return bytes(6) + bytes([2, 0, 0, 0, 0, 1]) + b"\x08\x00" + ip + l4


def checksums_valid(f: bytes) -> bool:
    """The IPv4 header and TCP/UDP checksums of a frame from :func:`frame` verify."""
    ip = f[14:34]
    if _csum(ip) != 0:
        return False
    proto, l4 = ip[9], f[34:]
    if proto == 17 and l4[6:8] == b"\x00\x00":
        return True
    return _csum(ip[12:20] + struct.pack("!BBH", 0, proto, len(l4)) + l4) == 0
