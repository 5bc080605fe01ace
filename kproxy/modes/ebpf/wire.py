"""Cilium's load-balancing map vocabulary shared by the layouts: the flag bits, states,
algorithms, map types, protocol numbers and default sizes (``bpf/lib/lb.h``,
``pkg/maps/lbmap``), and the packing helpers of :mod:`kproxy.modes.ebpf.layout` and
:mod:`kproxy.modes.ebpf.affinity`."""

from __future__ import annotations

import ipaddress
import socket
from enum import IntEnum, IntFlag

from kproxy.errors import InvalidArgument
from kproxy.model import Protocol

__all__ = [
    "AFFINITY_TIMEOUT_MASK",
    "BPF_F_NO_PREALLOC",
    "DEFAULT_LB_MAP_MAX",
    "DEFAULT_SOCK_REV_NAT_MAX",
    "IPPROTO",
    "LB_ALGORITHM_SHIFT",
    "SOURCE_RANGE_DENY",
    "BackendState",
    "LBAlgorithm",
    "MapType",
    "Scope",
    "ServiceFlag",
    "ServiceFlag2",
    "protocol_name",
    "protocol_number",
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



def protocol_number(protocol: Protocol) -> int:
    """The IP protocol number Cilium writes for a Service port's protocol."""
    return IPPROTO[protocol]


def protocol_name(number: int) -> str:
    """``TCP``/``UDP``/``SCTP`` for a protocol number, ``ANY`` for 0, else the number."""
    if number == 0:
        return "ANY"
    proto = _PROTO_NAMES.get(number)
    return str(proto) if proto is not None else str(number)
