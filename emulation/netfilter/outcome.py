"""What happened to one packet: :class:`Outcome`, and the packet as it was delivered."""

from __future__ import annotations

from dataclasses import dataclass

from emulation.addr import format_address
from emulation.netfilter.context import TraceStep
from emulation.netfilter.verdicts import CtState, Delivery, Verdict
from emulation.packet import Packet, unchecked_replace
from emulation.slots import maker

__all__ = ["Outcome", "delivered", "make_outcome"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What happened to one packet.

    Attributes:
        verdict: ``ACCEPT``, ``DROP`` or ``REJECT``.
        delivery: ``local`` (delivered to a socket on the node), ``forward`` (sent out
            ``out_interface``) or ``none`` (dropped or rejected).
        packet: the packet as delivered or sent, after NAT (its ``mark`` is the final mark).
        ctstate: the conntrack state it had (NEW, ESTABLISHED, INVALID, UNTRACKED).
        dnat, snat: its destination / source was translated; ``masquerade``: by MASQUERADE.
        reason: a short human explanation (which chain or policy decided, or a routing cause).
        uncertain: an unknown match or target was met on the way, so this may be wrong.
        trace: every rule and policy met, when tracing was asked for (else empty).

    ``verdict``, ``delivery`` and ``ctstate`` are string enums: they equal their words
    (``outcome.verdict == "ACCEPT"``).
    """

    verdict: Verdict
    delivery: Delivery
    out_interface: str | None
    packet: Packet
    ctstate: CtState
    dnat: bool
    snat: bool
    masquerade: bool
    reason: str
    uncertain: bool
    trace: tuple[TraceStep, ...] = ()

    @property
    def destination(self) -> str:
        """``ip:port`` (``[ip]:port`` for IPv6) the packet finally went to."""
        host = f"[{self.packet.dst}]" if ":" in self.packet.dst else self.packet.dst
        return f"{host}:{self.packet.dport}"


#: ``make_outcome(verdict, delivery, out_interface, packet, ctstate, dnat, snat, masquerade,
#: reason, uncertain, trace)``: an Outcome from valid values, without the dataclass's ``__init__``.
make_outcome = maker(Outcome)


def delivered(
    packet: Packet,
    version: int,
    src: int,
    dst: int,
    new_src: int,
    new_dst: int,
    sport: int,
    dport: int,
    mark: int,
    device: str | None,
    src_text: str | None = None,
    dst_text: str | None = None,
) -> Packet:
    """The packet as delivered or sent: ``packet`` itself when nothing changed; an address
    that ends as it began keeps the packet's own text (say, IPv6 in capitals). ``src_text``
    and ``dst_text``, when given, are the texts of ``new_src`` and ``new_dst``."""
    if (
        new_src == src
        and new_dst == dst
        and sport == packet.sport
        and dport == packet.dport
        and mark == packet.mark
        and device == packet.out_interface
    ):
        return packet
    return unchecked_replace(
        packet,
        src=packet.src if new_src == src else src_text or format_address(version, new_src),
        dst=packet.dst if new_dst == dst else dst_text or format_address(version, new_dst),
        sport=sport,
        dport=dport,
        mark=mark,
        out_interface=device,
    )
