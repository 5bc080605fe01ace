"""What :class:`emulation.ipvs.IpvsTable` hands back: packet results and connection rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from emulation.ipvs.model import ServiceKey

__all__ = ["ConnView", "IpvsResult", "PacketLike", "Verdict"]

Verdict = Literal["forward", "accept", "drop", "reject"]


class PacketLike(Protocol):
    """What :meth:`IpvsTable.process` reads (``emulation.packet.Packet`` fits)."""

    @property
    def src(self) -> str: ...
    @property
    def dst(self) -> str: ...
    @property
    def sport(self) -> int: ...
    @property
    def dport(self) -> int: ...
    @property
    def protocol(self) -> str: ...
    @property
    def mark(self) -> int: ...
    @property
    def syn(self) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class IpvsResult:
    """What IPVS did with one packet.

    Attributes:
        verdict: ``forward`` (taken by IPVS and sent to the real server, NAT applied),
            ``accept`` (not IPVS's: it continues to the local stack), ``drop`` (dropped
            silently), ``reject`` (no real server available: ICMP port unreachable, ``ip_vs_leave``).
        service: the virtual service that matched, if any.
        real: ``(address, port)`` the packet was sent to (``forward`` only).
        translated: for a reply, the ``(address, port)`` its source was rewritten to.
        new_connection: a connection entry was created for this packet.
        state: the connection's state after the packet (``""`` when there is none).
        trace: what happened, step by step, in words.
    """

    verdict: Verdict
    service: ServiceKey | None = None
    real: tuple[str, int] | None = None
    translated: tuple[str, int] | None = None
    new_connection: bool = False
    state: str = ""
    trace: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ConnView:
    """One row of ``ipvsadm -Lnc``: protocol, client, virtual, real, state, seconds left."""

    protocol: str
    client: str
    virtual: str
    real: str
    state: str
    expires_in_s: float
    template: bool
