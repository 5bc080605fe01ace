"""Program contexts: ``struct bpf_sock_addr`` (cgroup sock_addr hooks) and ``struct __sk_buff``
(``sched_cls``), with the kernel's layout and access rules.

Layouts are bpf.h's (``struct bpf_sock_addr`` is 72 bytes, ``struct __sk_buff`` 192). Access
rules follow net/core/filter.c: ``sock_addr_is_valid_access`` (``user_ip4``/``user_port`` are
readable narrowly and writable as whole words; ``user_ip4`` exists only at the IPv4 hooks,
``user_ip6`` only at the IPv6 ones, ``msg_src_ip*`` only at sendmsg; the rest is read-only,
whole words) and ``tc_cls_act_is_valid_access`` (``mark``, ``priority``, ``tc_index``, ``cb``,
``tc_classid``, ``queue_mapping`` writable; ``data``, ``data_end``, ``data_meta`` read as 4
bytes give packet pointers).

Addresses and ports in these structs are in network byte order: the four bytes of
``user_ip4`` are the address's bytes, and ``user_port`` holds ``htons(port)`` in its low half.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from enum import IntEnum

from emulation.bpf.memory import BpfFault, Ptr, Region, RegionKind, Value

__all__ = [
    "SK_BUFF_SIZE",
    "SOCK_ADDR_SIZE",
    "AttachType",
    "ProgType",
    "SkBuff",
    "SockAddr",
]

SOCK_ADDR_SIZE = 72
SK_BUFF_SIZE = 192


class ProgType(IntEnum):
    """bpf.h ``enum bpf_prog_type`` (the types modelled here)."""

    SOCKET_FILTER = 1
    SCHED_CLS = 3
    CGROUP_SOCK_ADDR = 18


class AttachType(IntEnum):
    """bpf.h ``enum bpf_attach_type`` (the hooks kproxy uses; tcx ingress is 46)."""

    CGROUP_INET4_CONNECT = 10
    CGROUP_INET6_CONNECT = 11
    CGROUP_UDP4_SENDMSG = 14
    CGROUP_UDP6_SENDMSG = 15
    CGROUP_UDP4_RECVMSG = 19
    CGROUP_UDP6_RECVMSG = 20
    CGROUP_INET4_GETPEERNAME = 29
    CGROUP_INET6_GETPEERNAME = 30
    TCX_INGRESS = 46
    TCX_EGRESS = 47

    @property
    def ipv6(self) -> bool:
        """Whether this is an IPv6 sock_addr hook."""
        return self in _V6_HOOKS


_V6_HOOKS = frozenset({AttachType.CGROUP_INET6_CONNECT, AttachType.CGROUP_UDP6_SENDMSG,
                       AttachType.CGROUP_UDP6_RECVMSG, AttachType.CGROUP_INET6_GETPEERNAME})
_SENDMSG = frozenset({AttachType.CGROUP_UDP4_SENDMSG, AttachType.CGROUP_UDP6_SENDMSG})


@dataclass(frozen=True, slots=True)
class _Field:
    start: int
    end: int
    writable: bool
    narrow: bool  # reads narrower than the field are allowed


class CtxRegion(Region):
    """A context struct: its bytes plus the access rules of its program type."""

    __slots__ = ("fields", "pointers")

    def __init__(self, data: bytearray, name: str, fields: tuple[_Field, ...],
                 pointers: dict[int, Ptr] | None = None) -> None:
        super().__init__(RegionKind.CTX, data, name)
        self.fields = fields
        self.pointers = pointers or {}

    def _field(self, off: int, size: int, write: bool) -> _Field:
        for f in self.fields:
            if f.start <= off < f.end:
                word = 4 if f.end - f.start >= 4 else f.end - f.start
                inside = off + size <= f.end
                wide_ip6 = size == 8 and f.end - f.start == 16 and (off - f.start) % 8 == 0
                if write and not f.writable:
                    break
                if write and not (size == word and (off - f.start) % word == 0) and not wide_ip6:
                    break
                if not write and not wide_ip6 and not (
                        inside and off % size == 0 and (size == word or (f.narrow and size < word))):
                    break
                return f
        kind = "write" if write else "read"
        raise BpfFault(f"invalid {self.name} access: {kind} of {size} bytes at offset {off}")

    def load(self, off: int, size: int) -> Value:
        """A field's value, or the packet pointer it stands for."""
        self._field(off, size, write=False)
        if off in self.pointers:
            if size != 4:
                raise BpfFault(f"{self.name} packet pointer at {off} must be read as 4 bytes")
            return self.pointers[off]
        return int.from_bytes(self.data[off:off + size], "little")

    def store(self, off: int, size: int, value: Value) -> None:
        """Write a writable field (scalars only)."""
        self._field(off, size, write=True)
        if not isinstance(value, int):
            raise BpfFault(f"storing a pointer into {self.name} at offset {off}")
        self.data[off:off + size] = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")

    def read_bytes(self, off: int, size: int) -> bytes:
        """Helpers never read the context as memory."""
        raise BpfFault(f"{self.name} passed as memory to a helper")

    def write_bytes(self, off: int, raw: bytes) -> None:
        """Helpers never write the context as memory."""
        raise BpfFault(f"{self.name} passed as memory to a helper")


def _ip4(addr: str) -> bytes:
    return ipaddress.IPv4Address(addr).packed


def _ip6(addr: str) -> bytes:
    return ipaddress.IPv6Address(addr).packed


@dataclass(slots=True, kw_only=True)
class SockAddr:
    """What a cgroup sock_addr program sees and may rewrite (``struct bpf_sock_addr``).

    Attributes:
        attach: the hook (connect4, sendmsg6...).
        user_ip: the destination (connect, sendmsg) or peer (recvmsg, getpeername) address.
        user_port: its port, host order.
        type: ``socket.SOCK_STREAM`` or ``SOCK_DGRAM``.
        protocol: 6 (TCP) or 17 (UDP).
        msg_src_ip: the source sendmsg will use ("" for none).
        socket_cookie: what ``bpf_get_socket_cookie`` returns for this socket.
        netns_cookie: what ``bpf_get_netns_cookie`` returns.
    """

    attach: AttachType
    user_ip: str
    user_port: int
    type: int = socket.SOCK_STREAM
    protocol: int = 6
    msg_src_ip: str = ""
    socket_cookie: int = 1
    netns_cookie: int = 1

    @property
    def family(self) -> int:
        """``AF_INET6`` at the IPv6 hooks, else ``AF_INET``."""
        return socket.AF_INET6 if self.attach.ipv6 else socket.AF_INET

    def to_bytes(self) -> bytearray:
        """The 72-byte struct."""
        raw = bytearray(SOCK_ADDR_SIZE)
        raw[0:4] = self.family.to_bytes(4, "little")
        if self.attach.ipv6:
            raw[8:24] = _ip6(self.user_ip)
            if self.msg_src_ip:
                raw[44:60] = _ip6(self.msg_src_ip)
        else:
            raw[4:8] = _ip4(self.user_ip)
            if self.msg_src_ip:
                raw[40:44] = _ip4(self.msg_src_ip)
        raw[24:26] = self.user_port.to_bytes(2, "big")
        raw[28:32] = self.family.to_bytes(4, "little")
        raw[32:36] = int(self.type).to_bytes(4, "little")
        raw[36:40] = self.protocol.to_bytes(4, "little")
        return raw

    def region(self) -> CtxRegion:
        """The context region a run reads and writes, with the hook's access rules."""
        fields = [_Field(0, 4, False, False), _Field(24, 28, True, True),
                  _Field(28, 32, False, False), _Field(32, 36, False, False),
                  _Field(36, 40, False, False)]
        fields.append(_Field(8, 24, True, True) if self.attach.ipv6 else _Field(4, 8, True, True))
        if self.attach in _SENDMSG:
            fields.append(_Field(44, 60, True, True) if self.attach.ipv6 else _Field(40, 44, True, True))
        return CtxRegion(self.to_bytes(), f"bpf_sock_addr({self.attach.name.lower()})", tuple(fields))

    def read_back(self, region: Region) -> SockAddr:
        """This context with what the program wrote into ``region`` (a new object)."""
        raw = region.data
        if self.attach.ipv6:
            ip = str(ipaddress.IPv6Address(bytes(raw[8:24])))
            src = str(ipaddress.IPv6Address(bytes(raw[44:60]))) if self.msg_src_ip or any(raw[44:60]) else ""
        else:
            ip = str(ipaddress.IPv4Address(bytes(raw[4:8])))
            src = str(ipaddress.IPv4Address(bytes(raw[40:44]))) if self.msg_src_ip or any(raw[40:44]) else ""
        return SockAddr(attach=self.attach, user_ip=ip, user_port=int.from_bytes(raw[24:26], "big"),
                        type=self.type, protocol=self.protocol, msg_src_ip=src,
                        socket_cookie=self.socket_cookie, netns_cookie=self.netns_cookie)


#: __sk_buff offsets.
SKB_LEN, SKB_MARK, SKB_PROTOCOL, SKB_IFINDEX = 0, 8, 16, 40
SKB_DATA, SKB_DATA_END, SKB_DATA_META = 76, 80, 140


def _skb_fields() -> tuple[_Field, ...]:
    ro = [(0, 8), (16, 48), (68, 72), (84, 140)]
    rw = [(8, 12), (12, 16), (32, 36), (44, 48), (48, 68), (72, 76)]
    fields = [_Field(a, a + 4, False, True) for s, e in ro for a in range(s, e, 4)]
    fields += [_Field(a, a + 4, True, True) for s, e in rw for a in range(s, e, 4)]
    fields += [_Field(SKB_DATA, SKB_DATA + 4, False, False),
               _Field(SKB_DATA_END, SKB_DATA_END + 4, False, False),
               _Field(SKB_DATA_META, SKB_DATA_META + 4, False, False)]
    return tuple(fields)


_SKB_FIELDS = _skb_fields()


@dataclass(slots=True, kw_only=True)
class SkBuff:
    """A packet at a tc hook as ``BPF_PROG_TEST_RUN`` builds it (``struct __sk_buff``).

    Attributes:
        packet: the frame from its Ethernet header on.
        mark: ``skb->mark``.
        ifindex: the device (``BPF_PROG_TEST_RUN`` uses the namespace's loopback, 1).
        ingress_ifindex: the receiving device (0 at test run).
        protocol: ``skb->protocol`` as the struct holds it (the EtherType, network order); None
            takes it from the frame, as ``eth_type_trans`` does.
    """

    packet: bytes
    mark: int = 0
    ifindex: int = 1
    ingress_ifindex: int = 0
    protocol: int | None = None

    def region(self, packet: Region) -> CtxRegion:
        """The context region; ``packet`` is the packet region its pointers point into."""
        raw = bytearray(SK_BUFF_SIZE)
        raw[SKB_LEN:SKB_LEN + 4] = len(packet.data).to_bytes(4, "little")
        raw[SKB_MARK:SKB_MARK + 4] = self.mark.to_bytes(4, "little")
        proto = self.protocol
        if proto is None:
            proto = int.from_bytes(self.packet[12:14], "little") if len(self.packet) >= 14 else 0
        raw[SKB_PROTOCOL:SKB_PROTOCOL + 4] = proto.to_bytes(4, "little")
        raw[36:40] = self.ingress_ifindex.to_bytes(4, "little")
        raw[SKB_IFINDEX:SKB_IFINDEX + 4] = self.ifindex.to_bytes(4, "little")
        pointers = {SKB_DATA: Ptr(packet, 0), SKB_DATA_END: Ptr(packet, len(packet.data)),
                    SKB_DATA_META: Ptr(packet, 0)}
        return CtxRegion(raw, "__sk_buff", _SKB_FIELDS, pointers)
