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

The affinity, source-range, Maglev and socket reverse-NAT entries are in
:mod:`kproxy.modes.ebpf.affinity`, the map specs in :mod:`kproxy.modes.ebpf.specs`, the flag
bits and constants in :mod:`kproxy.modes.ebpf.wire`; all are re-exported here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kproxy.modes.ebpf.affinity import (
    SRC_RANGE_STATIC_PREFIX,
    AffinityKey,
    AffinityMatchKey,
    AffinityValue,
    SockRevNatEntry,
    SockRevNatKey,
    SourceRangeKey,
    maglev_inner_pack,
    maglev_inner_unpack,
)
from kproxy.modes.ebpf.specs import MAP_SPECS, MapSpec, map_spec, map_specs
from kproxy.modes.ebpf.wire import (
    AFFINITY_TIMEOUT_MASK,
    BPF_F_NO_PREALLOC,
    DEFAULT_LB_MAP_MAX,
    DEFAULT_SOCK_REV_NAT_MAX,
    IPPROTO,
    LB_ALGORITHM_SHIFT,
    SOURCE_RANGE_DENY,
    BackendState,
    LBAlgorithm,
    MapType,
    Scope,
    ServiceFlag,
    ServiceFlag2,
    _addr,
    _check,
    _hton16,
    _ip,
    _ntoh16,
    _size_error,
    protocol_name,
    protocol_number,
)

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
