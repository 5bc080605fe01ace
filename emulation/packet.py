"""A packet as the kernel models see it.

Theory: only the header fields netfilter rules, routing and conntrack look at are modelled.
``in_interface`` is ``None`` for a packet generated on the node itself (it enters through the
OUTPUT hook); otherwise it arrived on that interface (PREROUTING).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from emulation.addr import parse_address
from emulation.slots import filler, maker

__all__ = ["PROTOCOLS", "Packet", "Protocol", "unchecked_replace"]

Protocol = Literal["tcp", "udp", "sctp", "icmp"]
PROTOCOLS: tuple[str, ...] = ("tcp", "udp", "sctp", "icmp")
PROTO_NUMBERS = {"icmp": 1, "tcp": 6, "udp": 17, "sctp": 132}


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class Packet:
    """One IP packet.

    Attributes:
        src, dst: IPv4 or IPv6 addresses (same family).
        sport, dport: ports, 0..65535 (0 for ICMP).
        protocol: ``tcp``, ``udp``, ``sctp`` or ``icmp`` (ICMPv6 for an IPv6 packet).
        in_interface: the interface it arrived on, or ``None`` if generated locally.
        out_interface: set by routing; callers normally leave it ``None``.
        mark: the skb mark (``nfmark``), 32 bits.
        length: bytes on the wire, used for byte counters.
        syn: for TCP, whether this is a SYN (a flow's first packet). A non-SYN packet with no
            conntrack entry is picked up as NEW when ``nf_conntrack_tcp_loose`` is on (default).

    Raises:
        ValueError: bad address, port, protocol or mark.
    """

    src: str
    dst: str
    sport: int = 0
    dport: int = 0
    protocol: Protocol = "tcp"
    in_interface: str | None = None
    out_interface: str | None = None
    mark: int = 0
    length: int = 60
    syn: bool = True

    def __init__(
        self,
        *,
        src: str,
        dst: str,
        sport: int = 0,
        dport: int = 0,
        protocol: Protocol = "tcp",
        in_interface: str | None = None,
        out_interface: str | None = None,
        mark: int = 0,
        length: int = 60,
        syn: bool = True,
    ) -> None:
        # As the dataclass __init__ would, but through the slots (see emulation.slots).
        _fill(self, src, dst, sport, dport, protocol, in_interface, out_interface, mark, length, syn)
        self._validate()

    def _validate(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol={self.protocol!r}; expected one of {PROTOCOLS}")
        sv, _ = parse_address(self.src)
        dv, _ = parse_address(self.dst)
        if sv != dv:
            raise ValueError(f"src={self.src!r} and dst={self.dst!r} are of different IP families")
        if not (0 <= self.sport <= 65535 and 0 <= self.dport <= 65535):
            name, port = ("sport", self.sport) if not 0 <= self.sport <= 65535 else ("dport", self.dport)
            raise ValueError(f"{name}={port} is not a port (0..65535)")
        if not 0 <= self.mark <= 0xFFFFFFFF:
            raise ValueError(f"mark={self.mark:#x} is not a 32-bit value")
        if self.length <= 0:
            raise ValueError(f"length={self.length} must be a positive byte count")

    @property
    def version(self) -> int:
        """4 or 6."""
        return parse_address(self.src)[0]

    def reply(self) -> Packet:
        """The answer to this packet as its receiver would send it (addresses and ports swapped)."""
        return replace(
            self,
            src=self.dst,
            dst=self.src,
            sport=self.dport,
            dport=self.sport,
            in_interface=None,
            out_interface=None,
            mark=0,
            syn=False,
        )


_fill = filler(Packet)
_make = maker(Packet)


def unchecked_replace(
    packet: Packet, *, src: str, dst: str, sport: int, dport: int, mark: int, out_interface: str | None
) -> Packet:
    """A copy of ``packet`` with new header fields, without validating them again.

    For the evaluator, whose values come from a valid packet and validated rules (NAT
    addresses of the packet's family, ports and marks in range); anyone else should use
    ``dataclasses.replace``, which validates.
    """
    return _make(
        src,
        dst,
        sport,
        dport,
        packet.protocol,
        packet.in_interface,
        out_interface,
        mark,
        packet.length,
        packet.syn,
    )
