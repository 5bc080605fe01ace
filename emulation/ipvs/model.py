"""Virtual and real servers: the frozen specifications, and the live kernel objects.

Theory of operation: an :class:`ServiceSpec` / :class:`DestSpec` is what ``ipvsadm -A`` /
``ipvsadm -a`` hands the kernel (``struct ip_vs_service_user_kern`` / ``ip_vs_dest_user_kern``),
validated and frozen. A :class:`Dest` is the kernel's ``struct ip_vs_dest``: it lives in its
service's destination list and carries the mutable counters (``activeconns``, ``inactconns``,
``persistconns``), ``last_weight`` and the ``AVAILABLE``/``OVERLOAD`` flags that the
connection table and the schedulers read and write, so it is a plain slotted object, not a
value. :func:`DestSpec.key` and :class:`ServiceKey` name objects in the table.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Literal

from emulation.ipvs.errors import IpvsError

__all__ = [
    "FWD_METHODS",
    "PROTOCOLS",
    "SVC_F_ONEPACKET",
    "SVC_F_PERSISTENT",
    "SVC_F_SCHED1",
    "SVC_F_SCHED2",
    "SVC_F_SCHED3",
    "Dest",
    "DestSpec",
    "Forward",
    "Proto",
    "ServiceKey",
    "ServiceSpec",
    "format_address",
    "parse_address",
]

Proto = Literal["tcp", "udp", "sctp"]
PROTOCOLS: tuple[Proto, ...] = ("tcp", "udp", "sctp")
PROTO_NUMBERS: dict[str, int] = {"tcp": 6, "udp": 17, "sctp": 132}
Forward = Literal["masq", "route", "tunnel", "local"]
FWD_METHODS: tuple[Forward, ...] = ("masq", "route", "tunnel", "local")

# include/uapi/linux/ip_vs.h
SVC_F_PERSISTENT = 0x0001
SVC_F_ONEPACKET = 0x0004
SVC_F_SCHED1 = 0x0008  # sh-fallback / mh-fallback
SVC_F_SCHED2 = 0x0010  # sh-port / mh-port
SVC_F_SCHED3 = 0x0020
_USER_FLAGS = SVC_F_PERSISTENT | SVC_F_ONEPACKET | SVC_F_SCHED1 | SVC_F_SCHED2 | SVC_F_SCHED3

#: ``ipvsadm -p`` without a value (``ipvsadm.8``).
DEFAULT_PERSISTENCE_S = 300


def parse_address(text: str) -> tuple[int, int]:
    """``"10.0.0.1"`` or ``"fd00::1"`` (brackets allowed) as ``(version, int)``.

    Raises:
        IpvsError: not an IP address.
    """
    raw = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ip = ipaddress.ip_address(raw)
    except ValueError:
        raise IpvsError(f"invalid address {text!r}; expected e.g. 10.0.0.1 or [fd00::1]") from None
    return ip.version, int(ip)


def format_address(version: int, value: int) -> str:
    """The ``inet_ntop`` text of an address (no brackets)."""
    return str(ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value))


@dataclass(frozen=True, slots=True)
class ServiceKey:
    """What identifies a virtual service: ``<af, protocol, addr, port>`` or ``<af, fwmark>``.

    ``version`` is 4 or 6; for a firewall-mark service ``fwmark`` is non-zero, ``protocol`` is
    ``"tcp"`` only as a placeholder and ``addr``/``port`` are 0 (as ``ip_vs_svc_fwm_hashkey``).
    """

    version: int
    protocol: Proto
    addr: int
    port: int
    fwmark: int = 0

    def __str__(self) -> str:
        if self.fwmark:
            return f"FWM {self.fwmark}" + (" IPv6" if self.version == 6 else "")
        a = format_address(self.version, self.addr)
        a = f"[{a}]" if self.version == 6 else a
        return f"{self.protocol.upper()} {a}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceSpec:
    """A virtual service as ``ipvsadm -A`` configures it.

    Attributes:
        key: the service's identity.
        scheduler: scheduler name (``rr``, ``wrr``, ``lc``, ``wlc``, ``sed``, ``nq``, ``fo``,
            ``ovf``, ``sh``, ``dh``, ``mh``); ``none`` is refused here (nothing to model).
        flags: ``SVC_F_*`` bits the user may set (persistent, one-packet, scheduler flags).
        timeout_s: persistence timeout in seconds (used only with ``SVC_F_PERSISTENT``).
        netmask: persistence granularity: an IPv4 mask as an integer (default all ones), or
            an IPv6 prefix length (default 128), as ``ip_vs_sched_persist`` reads it.

    Raises:
        IpvsError: unknown bits, a timeout or netmask out of range, or a bad port.
    """

    key: ServiceKey
    scheduler: str = "wlc"
    flags: int = 0
    timeout_s: int = 0
    netmask: int | None = None

    def __post_init__(self) -> None:
        if self.flags & ~_USER_FLAGS:
            raise IpvsError(f"flags={self.flags:#x} has bits ipvsadm cannot set (allowed {_USER_FLAGS:#x})")
        if not 0 <= self.key.port <= 65535:
            raise IpvsError(f"port={self.key.port} is not a port (0..65535)")
        if self.timeout_s < 0:
            raise IpvsError(f"timeout_s={self.timeout_s} must not be negative")
        if self.netmask is None:
            object.__setattr__(self, "netmask", 0xFFFFFFFF if self.key.version == 4 else 128)
        elif self.key.version == 6 and not 1 <= self.netmask <= 128:
            raise IpvsError(f"netmask={self.netmask} is not an IPv6 prefix length (1..128)")
        elif self.key.version == 4:
            inverted = 0xFFFFFFFF ^ self.netmask
            if not 0 <= self.netmask <= 0xFFFFFFFF or inverted & (inverted + 1):
                raise IpvsError(f"netmask={self.netmask:#x} is not a contiguous IPv4 netmask")

    @property
    def persistent(self) -> bool:
        """Whether ``-p`` is set."""
        return bool(self.flags & SVC_F_PERSISTENT)

    def mask(self, version: int, addr: int) -> int:
        """The client address masked to the persistence granularity (``snet`` in ``ip_vs_sched_persist``)."""
        assert self.netmask is not None
        if version == 4:
            return addr & self.netmask
        return addr & ((1 << 128) - (1 << (128 - self.netmask)))


@dataclass(frozen=True, slots=True, kw_only=True)
class DestSpec:
    """A real server as ``ipvsadm -a``/``-e`` configures it.

    Attributes:
        addr: ``(version, int)`` address.
        port: real port (0 means "the packet's destination port").
        weight: 0..65535 (0 quiesces the server: no new connections).
        forward: ``masq`` (NAT, ``-m``), ``route`` (``-g``), ``tunnel`` (``-i``) or ``local``.
        u_threshold, l_threshold: connection thresholds (0 = none).

    Raises:
        IpvsError: a weight, port or threshold out of range.
    """

    addr: tuple[int, int]
    port: int
    weight: int = 1
    forward: Forward = "masq"
    u_threshold: int = 0
    l_threshold: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 65535:
            raise IpvsError(f"weight={self.weight} is out of range 0..65535 (the kernel returns ERANGE)")
        if not 0 <= self.port <= 65535:
            raise IpvsError(f"port={self.port} is not a port (0..65535)")
        for name, value in (("u_threshold", self.u_threshold), ("l_threshold", self.l_threshold)):
            if value < 0:
                raise IpvsError(f"{name}={value} must not be negative")
        if self.l_threshold > self.u_threshold:
            raise IpvsError(
                f"l_threshold={self.l_threshold} > u_threshold={self.u_threshold} (ip_vs_add_dest: ERANGE)"
            )
        if self.forward not in FWD_METHODS:
            raise IpvsError(f"forward={self.forward!r}; expected one of {FWD_METHODS}")

    @property
    def key(self) -> tuple[int, int, int]:
        """``(version, address, port)``: what makes two real servers of a service the same."""
        return (*self.addr, self.port)


@dataclass(slots=True, eq=False)
class Dest:
    """A real server inside the kernel (``struct ip_vs_dest``); identity is the object.

    ``available`` is ``IP_VS_DEST_F_AVAILABLE`` (cleared when it is deleted from the
    service), ``overloaded`` is ``IP_VS_DEST_F_OVERLOAD``. ``last_weight`` keeps the latest
    non-zero weight (``__ip_vs_update_dest``); only ``mh`` reads it. ``refs`` counts the
    connections and templates that still point at it (what keeps a deleted dest in the trash).
    """

    spec: DestSpec
    weight: int = 0
    last_weight: int = 0
    activeconns: int = 0
    inactconns: int = 0
    persistconns: int = 0
    available: bool = True
    overloaded: bool = False
    refs: int = 0
    u_threshold: int = 0
    l_threshold: int = 0
    _label: str = field(default="", repr=False)

    @property
    def version(self) -> int:
        """4 or 6."""
        return self.spec.addr[0]

    @property
    def addr(self) -> int:
        """The address as an integer."""
        return self.spec.addr[1]

    @property
    def port(self) -> int:
        """The real port."""
        return self.spec.port

    @property
    def label(self) -> str:
        """``10.0.0.1:80`` or ``[fd00::1]:80``."""
        if not self._label:
            a = format_address(*self.spec.addr)
            self._label = f"[{a}]:{self.port}" if self.version == 6 else f"{a}:{self.port}"
        return self._label

    def overhead(self) -> int:
        """``ip_vs_dest_conn_overhead``: ``(activeconns << 8) + inactconns`` (include/net/ip_vs.h)."""
        return (self.activeconns << 8) + self.inactconns

    def totalconns(self) -> int:
        """``ip_vs_dest_totalconns``: active plus inactive connections."""
        return self.activeconns + self.inactconns

    def __repr__(self) -> str:
        return f"Dest({self.label} w={self.weight} a={self.activeconns} i={self.inactconns})"
