"""The exact bytes of Cilium's affinity, affinity-match, source-range, Maglev inner and socket
reverse-NAT map entries, IPv4 and IPv6 (``bpf/lib/lb.h``, ``pkg/maps/lbmap``); byte order as
:mod:`kproxy.modes.ebpf.layout` describes it."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from kproxy.errors import InvalidArgument
from kproxy.model import IPFamily
from kproxy.modes.ebpf.wire import _addr, _check, _hton16, _ip, _ntoh16, _size_error

__all__ = [
    "SRC_RANGE_STATIC_PREFIX",
    "AffinityKey",
    "AffinityMatchKey",
    "AffinityValue",
    "SockRevNatEntry",
    "SockRevNatKey",
    "SourceRangeKey",
    "maglev_inner_pack",
    "maglev_inner_unpack",
]

_U16 = struct.Struct("=H")

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
