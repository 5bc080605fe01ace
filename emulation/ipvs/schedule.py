"""Creating a connection for a packet: ``ip_vs_schedule`` and ``ip_vs_sched_persist`` (ip_vs_core.c).

Non-persistent service: the scheduler picks a server and a connection is created with real
port ``dest.port or vport``. A non-fwmark service whose port differs from the packet's (the
port-0 catch-all) cannot schedule without persistence ("port zero only supported in persistent
services").

Persistent service: a *template* keyed ``<protocol, client & netmask, 0, vaddr, vport'>``
pins the client to one server. ``vport'`` is the service port when the packet's port equals it
(FTP, port 21, aside), else 0 -- fwmark services key on ``<IPPROTO_IP, snet, fwmark>``. The
template is checked (``ip_vs_check_template``): its server must still be available and, with
``expire_quiescent_template=1``, of non-zero weight; a failed template is invalidated and a new
one scheduled. Each new connection through a template re-arms it with the persistence timeout
(``ip_vs_conn_put(ct)``); packets of existing connections do not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from emulation.ipvs.conn import Conn
from emulation.ipvs.model import Dest
from emulation.ipvs.sched_base import SchedInput
from emulation.ipvs.service import Service
from emulation.ipvs.sysctl import Sysctls

__all__ = ["ConnTable", "Scheduled", "schedule"]

FTPPORT = 21


class _Packet(Protocol):
    @property
    def sport(self) -> int: ...
    @property
    def dport(self) -> int: ...
    @property
    def protocol(self) -> str: ...


class ConnTable(Protocol):
    """What scheduling needs of the connection table (an :class:`~emulation.ipvs.IpvsTable`)."""

    @property
    def sysctls(self) -> Sysctls: ...

    def new_conn(
        self,
        svc: Service,
        *,
        protocol: str,
        version: int,
        caddr: int,
        cport: int,
        vaddr: int,
        vport: int,
        dest: Dest,
        dport: int,
        template: bool = False,
    ) -> Conn:
        """``ip_vs_conn_new``: a hashed entry bound to ``dest``."""

    def template(self, key: tuple[str, int, int, int, int]) -> Conn | None:
        """The live template for ``(protocol, version, snet, vaddr, vport)``."""

    def invalidate(self, ct: Conn) -> None:
        """The template can never match again."""

    def put(self, cp: Conn) -> None:
        """``ip_vs_conn_put``: re-arm the entry's timer."""


@dataclass(frozen=True, slots=True)
class Scheduled:
    """A new connection, and the template it goes through (persistent services)."""

    conn: Conn
    template: Conn | None


def schedule(
    table: ConnTable,
    svc: Service,
    packet: _Packet,
    version: int,
    saddr: int,
    daddr: int,
    trace: list[str],
) -> Scheduled | None:
    """``ip_vs_schedule``: a new connection for ``packet`` on ``svc``, or ``None`` (``ip_vs_leave``)."""
    spec = svc.spec
    pkt = SchedInput(version, saddr, packet.sport, daddr, packet.dport, packet.protocol)
    if spec.persistent:
        return _persist(table, svc, packet, pkt, trace)
    if not spec.key.fwmark and packet.dport != spec.key.port:
        trace.append(f"IPVS: {spec.key}: port zero only supported in persistent services")
        return None
    dest = svc.schedule(pkt)
    if dest is None:
        return None
    trace.append(f"IPVS: {spec.key}: scheduler {spec.scheduler} chose {dest.label}")
    cp = table.new_conn(
        svc,
        protocol=packet.protocol,
        version=version,
        caddr=saddr,
        cport=packet.sport,
        vaddr=daddr,
        vport=packet.dport,
        dest=dest,
        dport=dest.port or packet.dport,
    )
    return Scheduled(cp, None)


def _persist(
    table: ConnTable, svc: Service, packet: _Packet, pkt: SchedInput, trace: list[str]
) -> Scheduled | None:
    """``ip_vs_sched_persist``."""
    spec = svc.spec
    key = spec.key
    snet = spec.mask(pkt.version, pkt.saddr)
    same_port = packet.dport == key.port
    if same_port:
        tkey = (packet.protocol, pkt.version, snet, pkt.daddr, key.port if key.port != FTPPORT else 0)
    elif key.fwmark:
        tkey = ("ip", pkt.version, snet, key.fwmark, 0)
    else:
        tkey = (packet.protocol, pkt.version, snet, pkt.daddr, 0)
    ct = table.template(tkey)
    if ct is not None and not _check_template(table, ct):
        trace.append(f"IPVS: persistence template to {ct.dest.label} invalidated")
        ct = None
    if ct is None:
        dest = svc.schedule(pkt)
        if dest is None:
            return None
        tdport = dest.port if same_port and key.port != FTPPORT else 0
        ct = table.new_conn(
            svc,
            protocol=tkey[0],
            version=pkt.version,
            caddr=snet,
            cport=0,
            vaddr=tkey[3],
            vport=tkey[4],
            dest=dest,
            dport=tdport,
            template=True,
        )
        ct.timeout_s = float(spec.timeout_s)
        trace.append(
            f"IPVS: {key}: scheduler {spec.scheduler} chose {dest.label}; persistence template for "
            f"{spec.timeout_s} s"
        )
    else:
        dest = ct.dest
        trace.append(f"IPVS: {key}: persistence template pins the client to {dest.label}")
    dport = packet.dport
    if dport == key.port and dest.port:
        dport = dest.port
    cp = table.new_conn(
        svc,
        protocol=packet.protocol,
        version=pkt.version,
        caddr=pkt.saddr,
        cport=packet.sport,
        vaddr=pkt.daddr,
        vport=packet.dport,
        dest=dest,
        dport=dport,
    )
    cp.control = ct
    ct.n_control += 1
    table.put(ct)
    return Scheduled(cp, ct)


def _check_template(table: ConnTable, ct: Conn) -> bool:
    """``ip_vs_check_template``: invalidate a template whose server is gone or quiesced."""
    dest = ct.dest
    if not dest.available or (table.sysctls.expire_quiescent_template and dest.weight == 0):
        table.invalidate(ct)
        return False
    return True
