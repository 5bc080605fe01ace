"""The exact bytes of Cilium's load-balancing map keys and values, IPv4 and IPv6.

Each frozen dataclass mirrors one C struct of Cilium's ``bpf/lib/lb.h`` (and its Go twin in
``pkg/maps/lbmap``), with ``pack() -> bytes`` and ``unpack(data)`` to and from the bytes the
kernel holds. One class serves both families: the address says which (``lb4_*`` or ``lb6_*``),
and :meth:`unpack` tells them apart by the buffer's length.

Byte order is Cilium's, which is not uniform:

- addresses and L4 ports are network order (``__be32``/``__be16`` in ``lb.h``);
- ``rev_nat_index`` is network order wherever it appears (the service value, the reverse-NAT
  key, the Maglev outer key, the affinity and affinity-match keys, the source-range key):
  ``lbmap`` converts it with ``byteorder.HostToNetwork16`` ("for some reasons rev_nat_index is
  stored in network byte order in the SVC BPF maps", ``affinity.go``), and the datapath copies
  ``svc->rev_nat_index`` into the other keys as is;
- everything else (``backend_slot``, ``count``, ``qcount``, ``backend_id``, ``cluster_id``,
  ``affinity_timeout``, ``last_used``, the LPM prefix length, the Maglev inner table) is host
  order. Host order is this machine's (``=`` in :mod:`struct`), as the kernel's.

Ports and ids are held in host order in the dataclasses (``dport=80``, ``rev_nat_index=1``);
only :meth:`pack` swaps. :data:`MAP_SPECS` lists the maps with Cilium's names, types, key and
value sizes and default sizes (``--bpf-lb-map-max`` 65536, ``pkg/maps/lbmap/config.go``).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag

from kproxy.errors import InvalidArgument
from kproxy.model import IPFamily, Protocol

__all__ = [
    "AFFINITY_TIMEOUT_MASK",
    "BPF_F_NO_PREALLOC",
    "DEFAULT_LB_MAP_MAX",
    "DEFAULT_SOCK_REV_NAT_MAX",
    "IPPROTO",
    "LB_ALGORITHM_SHIFT",
    "MAP_SPECS",
    "SOURCE_RANGE_DENY",
    "SRC_RANGE_STATIC_PREFIX",
    "AffinityKey",
    "AffinityMatchKey",
    "AffinityValue",
    "Backend",
    "BackendState",
    "LBAlgorithm",
    "MaglevOuterKey",
    "MapSpec",
    "MapType",
    "ReverseNat",
    "ReverseNatKey",
    "Scope",
    "ServiceFlag",
    "ServiceFlag2",
    "ServiceKey",
    "ServiceValue",
    "SockRevNatEntry",
    "SockRevNatKey",
    "SourceRangeKey",
    "backend_key",
    "maglev_inner_pack",
    "maglev_inner_unpack",
    "map_spec",
    "map_specs",
    "protocol_name",
    "protocol_number",
    "unpack_backend_key",
]

#: ``lb.h`` ``LB_ALGORITHM_SHIFT``: the master entry keeps the algorithm in the upper 8 bits.
LB_ALGORITHM_SHIFT = 24
#: ``lb.h`` ``AFFINITY_TIMEOUT_MASK``: and the affinity timeout (seconds) in the lower 24.
AFFINITY_TIMEOUT_MASK = (1 << LB_ALGORITHM_SHIFT) - 1
#: ``pkg/maps/lbmap`` ``DefaultMaxEntries`` (``--bpf-lb-map-max``).
DEFAULT_LB_MAP_MAX = 65536
#: ``pkg/maps/lbmap`` ``SockRevNat4MapSize`` (``--bpf-sock-rev-map-max``).
DEFAULT_SOCK_REV_NAT_MAX = 256 * 1024

#: The L4 protocol numbers of ``lb4_key.proto``; ``0`` is ``IPPROTO_ANY``, the wildcard.
IPPROTO: dict[Protocol, int] = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}
_PROTO_NAMES = {num: proto for proto, num in IPPROTO.items()}


class MapType(IntEnum):
    """``enum bpf_map_type`` values of the maps below (``include/uapi/linux/bpf.h``)."""

    HASH = 1
    ARRAY = 2
    LRU_HASH = 9
    LPM_TRIE = 11
    HASH_OF_MAPS = 13


#: ``BPF_F_NO_PREALLOC``: Cilium's ``CONDITIONAL_PREALLOC`` with ``--preallocate-bpf-maps=false``
#: (the default), and always on the LPM tries.
BPF_F_NO_PREALLOC = 1


class Scope(IntEnum):
    """``lb4_key.scope``: ``LB_LOOKUP_SCOPE_EXT`` (0) and ``LB_LOOKUP_SCOPE_INT`` (1)."""

    EXTERNAL = 0
    INTERNAL = 1


class ServiceFlag(IntFlag):
    """``lb4_service.flags`` bits (``lb.h``: ``SVC_FLAG_*``)."""

    NONE = 0
    EXTERNAL_IP = 1 << 0
    NODEPORT = 1 << 1
    EXT_LOCAL_SCOPE = 1 << 2
    HOSTPORT = 1 << 3
    AFFINITY = 1 << 4
    LOADBALANCER = 1 << 5
    ROUTABLE = 1 << 6
    SOURCE_RANGE = 1 << 7


class ServiceFlag2(IntFlag):
    """``lb4_service.flags2`` bits (``lb.h``); bit 6 is ``QUARANTINED`` on slots and
    ``SOURCE_RANGE_DENY`` on the master entry, bit 3 ``LOOPBACK`` and ``L7_DELEGATE``."""

    NONE = 0
    LOCALREDIRECT = 1 << 0
    NAT_46X64 = 1 << 1
    L7_LOADBALANCER = 1 << 2
    LOOPBACK = 1 << 3
    INT_LOCAL_SCOPE = 1 << 4
    TWO_SCOPES = 1 << 5
    QUARANTINED = 1 << 6
    FWD_MODE_DSR = 1 << 7


#: The master-entry reading of bit 6 of ``flags2`` (``SVC_FLAG_SOURCE_RANGE_DENY``).
SOURCE_RANGE_DENY = ServiceFlag2.QUARANTINED


class BackendState(IntEnum):
    """``lb4_backend.flags``: ``BE_STATE_ACTIVE``, ``TERMINATING``, ``QUARANTINED``,
    ``MAINTENANCE`` (``lb.h``; ``loadbalancer.BackendState`` in Go)."""

    ACTIVE = 0
    TERMINATING = 1
    QUARANTINED = 2
    MAINTENANCE = 3


class LBAlgorithm(IntEnum):
    """The per-service algorithm of the master entry's upper 8 bits (``lb.h``):
    0 follows the datapath's compiled default (``LB_SELECTION``)."""

    DEFAULT = 0
    RANDOM = 1
    MAGLEV = 2


def _addr(ip: str) -> tuple[bytes, bool]:
    """``(packed address, is_ipv6)``; raises InvalidArgument on a bad address."""
    try:
        if ":" in ip:
            return socket.inet_pton(socket.AF_INET6, ip), True
        return socket.inet_pton(socket.AF_INET, ip), False
    except OSError as err:
        raise InvalidArgument(f"not an IP address: {ip!r}") from err


def _ip(raw: bytes) -> str:
    """The canonical text of a packed address (Python's, as the model writes addresses)."""
    return str(ipaddress.ip_address(raw))


def _check(name: str, value: int, bits: int) -> None:
    if not 0 <= value < (1 << bits):
        raise InvalidArgument(f"{name}={value} does not fit in {bits} unsigned bits")


_hton16 = socket.htons
_ntoh16 = socket.ntohs


def _size_error(cls: str, data: bytes, sizes: tuple[int, ...]) -> InvalidArgument:
    return InvalidArgument(f"{cls}.unpack: expected {' or '.join(map(str, sizes))} bytes, got {len(data)}")


# lb4_key: __be32 address; __be16 dport; __u16 backend_slot; __u8 proto; __u8 scope; __u8 pad[2]
_KEY4 = struct.Struct("=4sHHBB2x")
_KEY6 = struct.Struct("=16sHHBB2x")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceKey:
    """A services map key: ``struct lb4_key`` (12 bytes) or ``struct lb6_key`` (24 bytes).

    Attributes:
        address: the frontend address; ``0.0.0.0``/``::`` for NodePort surrogates.
        dport: the frontend port (host order here, network order packed); 0 with
            ``proto=0`` is the wildcard "known address, unknown port" entry.
        backend_slot: 0 for the master entry, 1..N for the backend slots.
        proto: the IP protocol number (6, 17, 132), 0 for ``IPPROTO_ANY``.
        scope: ``LB_LOOKUP_SCOPE_EXT`` or ``INT`` (two-scope Services have both).
    """

    address: str
    dport: int
    backend_slot: int = 0
    proto: int = 6
    scope: Scope = Scope.EXTERNAL

    def pack(self) -> bytes:
        """The key's bytes (12 for IPv4, 24 for IPv6).

        Raises:
            InvalidArgument: a field does not fit its C type, or the address is invalid.
        """
        raw, v6 = _addr(self.address)
        _check("dport", self.dport, 16)
        _check("backend_slot", self.backend_slot, 16)
        _check("proto", self.proto, 8)
        return (_KEY6 if v6 else _KEY4).pack(raw, _hton16(self.dport), self.backend_slot,
                                             self.proto, int(self.scope))

    @classmethod
    def unpack(cls, data: bytes) -> ServiceKey:
        """Read a key from its 12 or 24 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        fmt = {12: _KEY4, 24: _KEY6}.get(len(data))
        if fmt is None:
            raise _size_error("ServiceKey", data, (12, 24))
        raw, dport, slot, proto, scope = fmt.unpack(data)
        return cls(address=_ip(raw), dport=_ntoh16(dport), backend_slot=slot, proto=proto,
                   scope=Scope(scope))

    def master(self) -> ServiceKey:
        """The master entry's key of this frontend (slot 0)."""
        return ServiceKey(address=self.address, dport=self.dport, backend_slot=0,
                          proto=self.proto, scope=self.scope)


# lb4_service / lb6_service: union{__u32 backend_id | affinity_timeout | l7_lb_proxy_port};
# __u16 count; __u16 rev_nat_index (network order); __u8 flags; __u8 flags2; __u16 qcount
_SVC = struct.Struct("=IHHBBH")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceValue:
    """A services map value: ``struct lb4_service`` / ``lb6_service`` (12 bytes, both families).

    The first word is a union: a slot entry holds ``backend_id``; the master entry holds the
    LB algorithm (upper 8 bits) and the affinity timeout in seconds (lower 24 bits), see
    :meth:`master_entry`, :attr:`algorithm` and :attr:`affinity_timeout`.

    Attributes:
        backend_id: the raw union word (host order).
        count: the selectable slots (master only): the active backends, or the terminating
            ones when none is active.
        rev_nat_index: the service id (host order here; network order packed).
        flags: :class:`ServiceFlag` bits; flags2: :class:`ServiceFlag2` bits.
        qcount: the slots after ``count`` that are not selectable (master only).
    """

    backend_id: int = 0
    count: int = 0
    rev_nat_index: int = 0
    flags: ServiceFlag = ServiceFlag.NONE
    flags2: ServiceFlag2 = ServiceFlag2.NONE
    qcount: int = 0

    @classmethod
    def master_entry(cls, *, count: int, qcount: int, rev_nat_index: int, flags: ServiceFlag,
                     flags2: ServiceFlag2, affinity_timeout_s: int = 0,
                     algorithm: LBAlgorithm = LBAlgorithm.DEFAULT) -> ServiceValue:
        """A master entry (slot 0) with its algorithm and affinity timeout packed as ``lb.h`` says.

        Raises:
            InvalidArgument: the timeout does not fit in 24 bits.
        """
        _check("affinity_timeout_s", affinity_timeout_s, LB_ALGORITHM_SHIFT)
        word = (int(algorithm) << LB_ALGORITHM_SHIFT) | affinity_timeout_s
        return cls(backend_id=word, count=count, rev_nat_index=rev_nat_index, flags=flags,
                   flags2=flags2, qcount=qcount)

    @property
    def affinity_timeout(self) -> int:
        """The master entry's affinity timeout in seconds (``lb4_affinity_timeout``)."""
        return self.backend_id & AFFINITY_TIMEOUT_MASK

    @property
    def algorithm(self) -> LBAlgorithm:
        """The master entry's per-service algorithm (``lb4_algorithm``; unknown values read
        as DEFAULT, as the datapath falls back to its default)."""
        value = self.backend_id >> LB_ALGORITHM_SHIFT
        return LBAlgorithm(value) if value in (1, 2) else LBAlgorithm.DEFAULT

    def pack(self) -> bytes:
        """The value's 12 bytes.

        Raises:
            InvalidArgument: a field does not fit its C type.
        """
        _check("backend_id", self.backend_id, 32)
        _check("count", self.count, 16)
        _check("rev_nat_index", self.rev_nat_index, 16)
        _check("qcount", self.qcount, 16)
        return _SVC.pack(self.backend_id, self.count, _hton16(self.rev_nat_index),
                         int(self.flags) & 0xFF, int(self.flags2) & 0xFF, self.qcount)

    @classmethod
    def unpack(cls, data: bytes) -> ServiceValue:
        """Read a value from its 12 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        if len(data) != _SVC.size:
            raise _size_error("ServiceValue", data, (_SVC.size,))
        word, count, rev, flags, flags2, qcount = _SVC.unpack(data)
        return cls(backend_id=word, count=count, rev_nat_index=_ntoh16(rev),
                   flags=ServiceFlag(flags), flags2=ServiceFlag2(flags2), qcount=qcount)


# lb4_backend: __be32 address; __be16 port; __u8 proto; __u8 flags; __u16 cluster_id; __u8 zone; __u8 pad
_BE4 = struct.Struct("=4sHBBHBx")
_BE6 = struct.Struct("=16sHBBHBx")
_U32 = struct.Struct("=I")


def backend_key(backend_id: int) -> bytes:
    """The backends map key: ``__u32 backend_id`` in host order (4 bytes).

    Raises:
        InvalidArgument: the id does not fit in 32 bits.
    """
    _check("backend_id", backend_id, 32)
    return _U32.pack(backend_id)


def unpack_backend_key(data: bytes) -> int:
    """The backend id of a backends map key (4 bytes).

    Raises:
        InvalidArgument: the buffer is not 4 bytes.
    """
    if len(data) != 4:
        raise _size_error("backend key", data, (4,))
    return int(_U32.unpack(data)[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """A backends map value: ``struct lb4_backend`` (12 bytes) or ``lb6_backend`` (24 bytes).

    Attributes:
        address: the backend's address; port: its port (network order packed).
        proto: the IP protocol number (Cilium fills it since the v3 map).
        state: the backend state (the C field ``flags``).
        cluster_id: the ClusterMesh cluster, 0 locally; zone: the topology zone id, 0 when none.
    """

    address: str
    port: int
    proto: int = 6
    state: BackendState = BackendState.ACTIVE
    cluster_id: int = 0
    zone: int = 0

    def pack(self) -> bytes:
        """The value's bytes (12 for IPv4, 24 for IPv6).

        Raises:
            InvalidArgument: a field does not fit its C type, or the address is invalid.
        """
        raw, v6 = _addr(self.address)
        _check("port", self.port, 16)
        _check("cluster_id", self.cluster_id, 16)
        _check("zone", self.zone, 8)
        return (_BE6 if v6 else _BE4).pack(raw, _hton16(self.port), self.proto, int(self.state),
                                           self.cluster_id, self.zone)

    @classmethod
    def unpack(cls, data: bytes) -> Backend:
        """Read a value from its 12 or 24 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        fmt = {12: _BE4, 24: _BE6}.get(len(data))
        if fmt is None:
            raise _size_error("Backend", data, (12, 24))
        raw, port, proto, state, cluster_id, zone = fmt.unpack(data)
        return cls(address=_ip(raw), port=_ntoh16(port), proto=proto, state=BackendState(state),
                   cluster_id=cluster_id, zone=zone)


_U16 = struct.Struct("=H")
# lb4_reverse_nat (packed): __be32 address; __be16 port
_RNAT4 = struct.Struct("=4sH")
_RNAT6 = struct.Struct("=16sH")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReverseNatKey:
    """A reverse-NAT map key, and the Maglev outer key: ``__u16 rev_nat_index``, network order."""

    rev_nat_index: int

    def pack(self) -> bytes:
        """The key's 2 bytes.

        Raises:
            InvalidArgument: the index does not fit in 16 bits.
        """
        _check("rev_nat_index", self.rev_nat_index, 16)
        return _U16.pack(_hton16(self.rev_nat_index))

    @classmethod
    def unpack(cls, data: bytes) -> ReverseNatKey:
        """Read a key from its 2 bytes.

        Raises:
            InvalidArgument: the buffer is not 2 bytes.
        """
        if len(data) != 2:
            raise _size_error("ReverseNatKey", data, (2,))
        return cls(rev_nat_index=_ntoh16(_U16.unpack(data)[0]))


#: The Maglev outer map (``cilium_lb4_maglev``) is keyed like the reverse-NAT map.
MaglevOuterKey = ReverseNatKey


@dataclass(frozen=True, slots=True, kw_only=True)
class ReverseNat:
    """A reverse-NAT map value: ``struct lb4_reverse_nat`` (packed, 6 bytes) or
    ``lb6_reverse_nat`` (18 bytes): the frontend a reply is translated back to."""

    address: str
    port: int

    def pack(self) -> bytes:
        """The value's 6 or 18 bytes.

        Raises:
            InvalidArgument: the port does not fit, or the address is invalid.
        """
        raw, v6 = _addr(self.address)
        _check("port", self.port, 16)
        return (_RNAT6 if v6 else _RNAT4).pack(raw, _hton16(self.port))

    @classmethod
    def unpack(cls, data: bytes) -> ReverseNat:
        """Read a value from its 6 or 18 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        fmt = {6: _RNAT4, 18: _RNAT6}.get(len(data))
        if fmt is None:
            raise _size_error("ReverseNat", data, (6, 18))
        raw, port = fmt.unpack(data)
        return cls(address=_ip(raw), port=_ntoh16(port))


# lb4_affinity_key (packed): union{__u32 client_ip | __u64 client_cookie}; __u16 rev_nat_id;
# __u8 netns_cookie:1, reserved:7; __u8 pad1; __u32 pad2  -> 16 bytes; lb6: 16-byte union, 24
_AFF4 = struct.Struct("=8sHBx4x")
_AFF6 = struct.Struct("=16sHBx4x")
_U64 = struct.Struct("=Q")


@dataclass(frozen=True, slots=True, kw_only=True)
class AffinityKey:
    """An affinity map key: ``struct lb4_affinity_key`` (packed, 16 bytes) or
    ``lb6_affinity_key`` (24 bytes).

    The tc path keys by the client's address, socket-LB by the client's network-namespace
    cookie (``netns_cookie`` set, the cookie in the union's 8 bytes, host order).

    Attributes:
        family: which map (``cilium_lb4_affinity`` or ``cilium_lb6_affinity``).
        rev_nat_id: the service id (network order packed, as ``svc->rev_nat_index``).
        client_ip: the client's address, or None for a cookie key.
        netns_cookie: the namespace cookie, or None for an address key.
    """

    family: IPFamily
    rev_nat_id: int
    client_ip: str | None = None
    netns_cookie: int | None = None

    def pack(self) -> bytes:
        """The key's 16 or 24 bytes.

        Raises:
            InvalidArgument: neither or both of ``client_ip`` and ``netns_cookie`` are set,
                the address is of the other family, or a field does not fit.
        """
        _check("rev_nat_id", self.rev_nat_id, 16)
        v6 = self.family is IPFamily.IPv6
        if (self.client_ip is None) == (self.netns_cookie is None):
            raise InvalidArgument("AffinityKey needs exactly one of client_ip and netns_cookie")
        if self.netns_cookie is not None:
            _check("netns_cookie", self.netns_cookie, 64)
            union, bit = _U64.pack(self.netns_cookie), 1
        else:
            assert self.client_ip is not None
            raw, is_v6 = _addr(self.client_ip)
            if is_v6 != v6:
                raise InvalidArgument(f"client_ip {self.client_ip!r} is not {self.family}")
            union, bit = raw, 0
        fmt = _AFF6 if v6 else _AFF4
        return fmt.pack(union.ljust(16 if v6 else 8, b"\0"), _hton16(self.rev_nat_id), bit)

    @classmethod
    def unpack(cls, data: bytes) -> AffinityKey:
        """Read a key from its 16 or 24 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        fmt = {16: _AFF4, 24: _AFF6}.get(len(data))
        if fmt is None:
            raise _size_error("AffinityKey", data, (16, 24))
        union, rev, bits = fmt.unpack(data)
        family = IPFamily.IPv6 if len(data) == 24 else IPFamily.IPv4
        if bits & 1:
            return cls(family=family, rev_nat_id=_ntoh16(rev),
                       netns_cookie=int(_U64.unpack(union[:8])[0]))
        raw = union if family is IPFamily.IPv6 else union[:4]
        return cls(family=family, rev_nat_id=_ntoh16(rev), client_ip=_ip(raw))


# lb_affinity_val (packed): __u64 last_used; __u32 backend_id; __u32 pad
_AFFV = struct.Struct("=QI4x")


@dataclass(frozen=True, slots=True, kw_only=True)
class AffinityValue:
    """An affinity map value: ``struct lb_affinity_val`` (packed, 16 bytes, both families).

    The map is an LRU hash (``cilium_lb4_affinity``): the kernel evicts the least recently
    used entries when it is full. The datapath (``lb4_affinity_backend_id``) treats an entry
    as stale when ``last_used + timeout <= now`` (deletes it, picks anew), or when
    ``{backend_id, rev_nat_id}`` is missing from the affinity-match map (the backend left
    the active set); otherwise it refreshes ``last_used`` and reuses the backend. Every
    successful selection then writes ``{backend_id, last_used=now}``.

    Attributes:
        last_used: ``bpf_mono_now()``: seconds of ``bpf_ktime_get_ns`` (host order), the
            datapath compares it as a ``__u32``.
        backend_id: the backend chosen.
    """

    last_used: int
    backend_id: int

    def pack(self) -> bytes:
        """The value's 16 bytes.

        Raises:
            InvalidArgument: a field does not fit.
        """
        _check("last_used", self.last_used, 64)
        _check("backend_id", self.backend_id, 32)
        return _AFFV.pack(self.last_used, self.backend_id)

    @classmethod
    def unpack(cls, data: bytes) -> AffinityValue:
        """Read a value from its 16 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        if len(data) != _AFFV.size:
            raise _size_error("AffinityValue", data, (_AFFV.size,))
        last_used, backend_id = _AFFV.unpack(data)
        return cls(last_used=last_used, backend_id=backend_id)


# lb_affinity_match (packed): __u32 backend_id; __u16 rev_nat_id; __u16 pad
_MATCH = struct.Struct("=IH2x")


@dataclass(frozen=True, slots=True, kw_only=True)
class AffinityMatchKey:
    """An affinity-match map key: ``struct lb_affinity_match`` (8 bytes; the value is one
    ``__u8``, presence only). Written for the active backends of Services with affinity."""

    backend_id: int
    rev_nat_id: int

    def pack(self) -> bytes:
        """The key's 8 bytes.

        Raises:
            InvalidArgument: a field does not fit.
        """
        _check("backend_id", self.backend_id, 32)
        _check("rev_nat_id", self.rev_nat_id, 16)
        return _MATCH.pack(self.backend_id, _hton16(self.rev_nat_id))

    @classmethod
    def unpack(cls, data: bytes) -> AffinityMatchKey:
        """Read a key from its 8 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        if len(data) != _MATCH.size:
            raise _size_error("AffinityMatchKey", data, (_MATCH.size,))
        backend_id, rev = _MATCH.unpack(data)
        return cls(backend_id=backend_id, rev_nat_id=_ntoh16(rev))


# lb4_src_range_key: struct bpf_lpm_trie_key{__u32 prefixlen}; __u16 rev_nat_id; __u16 pad; __u32 addr
_SRC4 = struct.Struct("=IH2x4s")
_SRC6 = struct.Struct("=IH2x16s")
#: ``lpmPrefixLen4`` in ``source_range.go``: rev_nat_id and pad are always matched in full.
SRC_RANGE_STATIC_PREFIX = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceRangeKey:
    """A source-range LPM trie key: ``struct lb4_src_range_key`` (12 bytes) or
    ``lb6_src_range_key`` (24 bytes); the value is one ``__u8``.

    ``prefixlen`` (host order) is 32 (``rev_nat_id`` and ``pad``) plus the CIDR's bits,
    as ``srcRangeKey`` writes it; a lookup uses the full length with the client's address.

    Attributes:
        rev_nat_id: the service id (network order packed).
        address: the CIDR's network address; prefix: its length in bits.
    """

    rev_nat_id: int
    address: str
    prefix: int

    @property
    def prefixlen(self) -> int:
        """The LPM prefix length stored in the key."""
        return SRC_RANGE_STATIC_PREFIX + self.prefix

    def pack(self) -> bytes:
        """The key's 12 or 24 bytes.

        Raises:
            InvalidArgument: the prefix is too long for the family, or a field does not fit.
        """
        raw, v6 = _addr(self.address)
        if not 0 <= self.prefix <= len(raw) * 8:
            raise InvalidArgument(f"prefix={self.prefix} is out of range for {self.address}")
        _check("rev_nat_id", self.rev_nat_id, 16)
        return (_SRC6 if v6 else _SRC4).pack(self.prefixlen, _hton16(self.rev_nat_id), raw)

    @classmethod
    def unpack(cls, data: bytes) -> SourceRangeKey:
        """Read a key from its 12 or 24 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        fmt = {12: _SRC4, 24: _SRC6}.get(len(data))
        if fmt is None:
            raise _size_error("SourceRangeKey", data, (12, 24))
        plen, rev, raw = fmt.unpack(data)
        return cls(rev_nat_id=_ntoh16(rev), address=_ip(raw), prefix=plen - SRC_RANGE_STATIC_PREFIX)


def maglev_inner_pack(table: tuple[int, ...] | list[int]) -> bytes:
    """The Maglev inner map's one value: ``__u32 backend_ids[M]`` in host order (``4*M`` bytes).

    The inner map is an ARRAY with one entry at key ``__u32 0`` (``maglev_inner_map.go``).

    Raises:
        InvalidArgument: an id does not fit in 32 bits.
    """
    try:
        return struct.pack(f"={len(table)}I", *table)
    except struct.error as err:
        raise InvalidArgument(f"maglev table: {err}") from err


def maglev_inner_unpack(data: bytes) -> tuple[int, ...]:
    """The backend ids of a Maglev inner value.

    Raises:
        InvalidArgument: the length is not a multiple of 4.
    """
    if len(data) % 4:
        raise InvalidArgument(f"maglev table: {len(data)} bytes is not a multiple of 4")
    return struct.unpack(f"={len(data) // 4}I", data)


# ipv4_revnat_tuple: __sock_cookie cookie; __be32 address; __be16 port; __u16 pad
_SKKEY4 = struct.Struct("=Q4sH2x")
_SKKEY6 = struct.Struct("=Q16sH2x")
# ipv4_revnat_entry: __be32 address; __be16 port; __u16 rev_nat_index
_SKVAL4 = struct.Struct("=4sHH")
_SKVAL6 = struct.Struct("=16sHH")


@dataclass(frozen=True, slots=True, kw_only=True)
class SockRevNatKey:
    """A socket reverse-NAT key: ``struct ipv4_revnat_tuple`` (16 bytes) or
    ``ipv6_revnat_tuple`` (28 bytes): the socket cookie and the backend it was sent to
    (``bpf_sock.c`` writes it at connect/sendmsg, reads it at recvmsg/getpeername)."""

    cookie: int
    address: str
    port: int

    def pack(self) -> bytes:
        """The key's 16 or 28 bytes.

        Raises:
            InvalidArgument: a field does not fit, or the address is invalid.
        """
        raw, v6 = _addr(self.address)
        _check("cookie", self.cookie, 64)
        _check("port", self.port, 16)
        return (_SKKEY6 if v6 else _SKKEY4).pack(self.cookie, raw, _hton16(self.port))

    @classmethod
    def unpack(cls, data: bytes) -> SockRevNatKey:
        """Read a key from its 16 or 28 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        fmt = {16: _SKKEY4, 28: _SKKEY6}.get(len(data))
        if fmt is None:
            raise _size_error("SockRevNatKey", data, (16, 28))
        cookie, raw, port = fmt.unpack(data)
        return cls(cookie=cookie, address=_ip(raw), port=_ntoh16(port))


@dataclass(frozen=True, slots=True, kw_only=True)
class SockRevNatEntry:
    """A socket reverse-NAT value: ``struct ipv4_revnat_entry`` (8 bytes) or
    ``ipv6_revnat_entry`` (20 bytes): the frontend to show as the peer, and its service id
    (network order, copied from ``svc->rev_nat_index``)."""

    address: str
    port: int
    rev_nat_index: int

    def pack(self) -> bytes:
        """The value's 8 or 20 bytes.

        Raises:
            InvalidArgument: a field does not fit, or the address is invalid.
        """
        raw, v6 = _addr(self.address)
        _check("port", self.port, 16)
        _check("rev_nat_index", self.rev_nat_index, 16)
        return (_SKVAL6 if v6 else _SKVAL4).pack(raw, _hton16(self.port), _hton16(self.rev_nat_index))

    @classmethod
    def unpack(cls, data: bytes) -> SockRevNatEntry:
        """Read a value from its 8 or 20 bytes.

        Raises:
            InvalidArgument: the buffer has another length.
        """
        fmt = {8: _SKVAL4, 20: _SKVAL6}.get(len(data))
        if fmt is None:
            raise _size_error("SockRevNatEntry", data, (8, 20))
        raw, port, rev = fmt.unpack(data)
        return cls(address=_ip(raw), port=_ntoh16(port), rev_nat_index=_ntoh16(rev))


@dataclass(frozen=True, slots=True, kw_only=True)
class MapSpec:
    """One map as Cilium creates it.

    Attributes:
        name: the map's name (its pin name under ``/sys/fs/bpf/tc/globals``).
        type: the BPF map type.
        key_size, value_size: in bytes (``value_size`` of the Maglev outer map is the inner
            map's fd, 4 bytes).
        max_entries: Cilium's default size.
        flags: ``map_flags`` (``BPF_F_NO_PREALLOC`` where Cilium sets it by default).
        inner: the inner map's spec, for a map of maps.
    """

    name: str
    type: MapType
    key_size: int
    value_size: int
    max_entries: int
    flags: int = 0
    inner: MapSpec | None = None

    @property
    def kernel_name(self) -> str:
        """The name the kernel keeps: ``BPF_OBJ_NAME_LEN`` is 16 with the NUL, so cilium/ebpf
        truncates to 15 characters."""
        return self.name[:15]


def _maglev_inner(table_size: int) -> MapSpec:
    return MapSpec(name="cilium_maglev_inner", type=MapType.ARRAY, key_size=4,
                   value_size=4 * table_size, max_entries=1)


def _family_specs(v: str, v6: bool, table_size: int) -> tuple[MapSpec, ...]:
    wide = 12 if v6 else 0
    n = DEFAULT_LB_MAP_MAX
    return (
        MapSpec(name=f"cilium_lb{v}_services_v2", type=MapType.HASH, key_size=12 + wide,
                value_size=12, max_entries=n, flags=BPF_F_NO_PREALLOC),
        MapSpec(name=f"cilium_lb{v}_backends_v3", type=MapType.HASH, key_size=4,
                value_size=12 + wide, max_entries=n, flags=BPF_F_NO_PREALLOC),
        MapSpec(name=f"cilium_lb{v}_reverse_nat", type=MapType.HASH, key_size=2,
                value_size=6 + wide, max_entries=n, flags=BPF_F_NO_PREALLOC),
        MapSpec(name=f"cilium_lb{v}_affinity", type=MapType.LRU_HASH, key_size=16 + (8 if v6 else 0),
                value_size=16, max_entries=n),
        MapSpec(name=f"cilium_lb{v}_source_range", type=MapType.LPM_TRIE, key_size=12 + wide,
                value_size=1, max_entries=n, flags=BPF_F_NO_PREALLOC),
        MapSpec(name=f"cilium_lb{v}_maglev", type=MapType.HASH_OF_MAPS, key_size=2, value_size=4,
                max_entries=n, flags=BPF_F_NO_PREALLOC, inner=_maglev_inner(table_size)),
        MapSpec(name=f"cilium_lb{v}_reverse_sk", type=MapType.LRU_HASH, key_size=16 + wide,
                value_size=8 + wide, max_entries=DEFAULT_SOCK_REV_NAT_MAX),
    )


def map_specs(table_size: int = 16381) -> dict[str, MapSpec]:
    """Every map of the eBPF mode, by name, for a Maglev table of ``table_size`` entries.

    The IPv4 and IPv6 twins of the services, backends, reverse-NAT, affinity, source-range,
    Maglev and socket reverse-NAT maps (``lb.h``), and the shared ``cilium_lb_affinity_match``.
    """
    specs = _family_specs("4", False, table_size) + _family_specs("6", True, table_size) + (
        MapSpec(name="cilium_lb_affinity_match", type=MapType.HASH, key_size=8, value_size=1,
                max_entries=DEFAULT_LB_MAP_MAX, flags=BPF_F_NO_PREALLOC),
    )
    return {spec.name: spec for spec in specs}


#: The maps with the default Maglev table size (16381).
MAP_SPECS: dict[str, MapSpec] = map_specs()


def map_spec(kind: str, family: IPFamily, table_size: int = 16381) -> MapSpec:
    """The spec of one map: ``kind`` is ``services_v2``, ``backends_v3``, ``reverse_nat``,
    ``affinity``, ``source_range``, ``maglev``, ``reverse_sk`` or ``affinity_match``.

    Raises:
        InvalidArgument: an unknown kind.
    """
    name = ("cilium_lb_affinity_match" if kind == "affinity_match" else
            f"cilium_lb{'6' if family is IPFamily.IPv6 else '4'}_{kind}")
    specs = MAP_SPECS if table_size == 16381 else map_specs(table_size)
    try:
        return specs[name]
    except KeyError:
        raise InvalidArgument(f"no eBPF map kind {kind!r}") from None


def protocol_number(protocol: Protocol) -> int:
    """The IP protocol number Cilium writes for a Service port's protocol."""
    return IPPROTO[protocol]


def protocol_name(number: int) -> str:
    """``TCP``/``UDP``/``SCTP`` for a protocol number, ``ANY`` for 0, else the number."""
    if number == 0:
        return "ANY"
    proto = _PROTO_NAMES.get(number)
    return str(proto) if proto is not None else str(number)
