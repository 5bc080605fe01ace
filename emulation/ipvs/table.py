"""The IPVS table of one network namespace: services, the connection table, the packet path.

Theory of operation: the control plane (:meth:`IpvsTable.add_service`, :meth:`add_dest` ...)
mirrors ``ip_vs_ctl.c``; :meth:`IpvsTable.process` is ``ip_vs_in`` (the LOCAL_IN hook, run
after netfilter's INPUT chains on packets for local addresses) and :meth:`process_reply` is
``ip_vs_out`` (replies from a real server). Time is injected: every call takes ``now``
(seconds), and timers that fell due before it fire first, in order (:meth:`advance`).
Scheduling and persistence live in :mod:`emulation.ipvs.schedule`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from emulation.ipvs.conn import (
    TCP_TIMEOUTS_S,
    TEMPLATE_REARM_S,
    Conn,
    TcpFlags,
    TcpState,
    bind_dest,
    state_name,
    tcp_transition,
    udp_transition,
    unbind_dest,
)
from emulation.ipvs.errors import IpvsError
from emulation.ipvs.model import PROTOCOLS, SVC_F_ONEPACKET, Dest, DestSpec, ServiceKey, ServiceSpec
from emulation.ipvs.model import format_address as _fmt
from emulation.ipvs.model import parse_address as _parse
from emulation.ipvs.result import ConnView, IpvsResult, PacketLike
from emulation.ipvs.sched_mh import DEFAULT_TAB_INDEX
from emulation.ipvs.schedule import schedule
from emulation.ipvs.service import Service
from emulation.ipvs.sysctl import Sysctls

__all__ = ["IpvsTable"]


class IpvsTable:
    """The IPVS state of one namespace.

    Args:
        sysctls: ``net.ipv4.vs.*`` settings (kernel defaults unless given).
        mh_tab_index: ``CONFIG_IP_VS_MH_TAB_INDEX`` (default 12: 4093 slots).
    """

    def __init__(self, sysctls: Sysctls | None = None, *, mh_tab_index: int = DEFAULT_TAB_INDEX) -> None:
        self.sysctls = sysctls or Sysctls()
        self.mh_tab_index = mh_tab_index
        self._services: dict[ServiceKey, Service] = {}
        self._fwm: dict[tuple[int, int], Service] = {}
        self._conns_in: dict[tuple[str, int, int, int, int, int], Conn] = {}
        self._conns_out: dict[tuple[str, int, int, int, int, int], Conn] = {}
        self._templates: dict[tuple[str, int, int, int, int], Conn] = {}
        self._all: dict[int, Conn] = {}
        self._timers: list[tuple[float, int, int, Conn]] = []
        self._seq = 0
        self._now = 0.0

    # -- control plane (ip_vs_ctl.c) -------------------------------------------------------

    @property
    def timeouts(self) -> dict[TcpState, float]:
        """The TCP state timeouts in force (``ipvsadm --set`` changes ESTABLISHED and FIN_WAIT)."""
        t = dict(TCP_TIMEOUTS_S)
        t[TcpState.ESTABLISHED] = self.sysctls.tcp_timeout_s
        t[TcpState.FIN_WAIT] = self.sysctls.tcp_fin_timeout_s
        return t

    def services(self) -> tuple[Service, ...]:
        """Every service, in the order they were added."""
        return tuple(self._services.values())

    def service(self, key: ServiceKey) -> Service:
        """The service with this key.

        Raises:
            IpvsError: no such service (``-ESRCH``).
        """
        svc = self._services.get(key)
        if svc is None:
            raise IpvsError(f"no virtual service {key} (ESRCH)")
        return svc

    def add_service(self, spec: ServiceSpec) -> Service:
        """``ip_vs_add_service``.

        Raises:
            IpvsError: it exists already (``-EEXIST``) or its scheduler is not modelled.
        """
        if spec.key in self._services:
            raise IpvsError(f"virtual service {spec.key} already exists (EEXIST)")
        svc = Service(spec, mh_tab_index=self.mh_tab_index)
        self._services[spec.key] = svc
        if spec.key.fwmark:
            self._fwm[(spec.key.version, spec.key.fwmark)] = svc
        return svc

    def edit_service(self, spec: ServiceSpec) -> Service:
        """``ip_vs_edit_service`` (scheduler state is reset only when the scheduler changes)."""
        svc = self.service(spec.key)
        svc.edit(spec)
        return svc

    def del_service(self, key: ServiceKey, now: float) -> None:
        """``ip_vs_del_service``: its real servers are unlinked as by :meth:`del_dest`."""
        svc = self.service(key)
        self.advance(now)
        for dest in list(svc.dests):
            svc.del_dest(dest.spec.key)
        del self._services[key]
        if key.fwmark:
            self._fwm.pop((key.version, key.fwmark), None)
        self._after_delete(now)

    def clear(self) -> None:
        """``ipvsadm -C``: every service goes; connections stay until they expire (dests unavailable)."""
        for svc in self._services.values():
            for dest in list(svc.dests):
                svc.del_dest(dest.spec.key)
        self._services.clear()
        self._fwm.clear()

    def add_dest(self, key: ServiceKey, spec: DestSpec) -> Dest:
        """``ip_vs_add_dest``: the new real server goes to the head of the list."""
        svc = self.service(key)
        if spec.addr[0] != key.version:
            raise IpvsError(f"real server {spec.key} is not of the service's IPv{key.version} family")
        return svc.add_dest(spec)

    def edit_dest(self, key: ServiceKey, spec: DestSpec) -> Dest:
        """``ip_vs_edit_dest`` (weight 0 quiesces the server)."""
        return self.service(key).edit_dest(spec)

    def del_dest(self, key: ServiceKey, dest: tuple[int, int, int], now: float) -> None:
        """``ip_vs_del_dest``; with ``expire_nodest_conn`` (and ``nodest_flush``) its connections go too."""
        self.advance(now)
        self.service(key).del_dest(dest)
        self._after_delete(now)

    def _after_delete(self, now: float) -> None:
        # ip_vs_enqueue_expire_nodest_conns -> ip_vs_expire_nodest_conn_flush
        if not (self.sysctls.expire_nodest_conn and self.sysctls.nodest_flush):
            return
        for cp in sorted(self._all.values(), key=lambda c: c.seq):
            if cp.seq not in self._all or cp.dest.available or cp.n_control:
                continue
            ctl = cp.control
            self._expire(cp)
            if ctl is not None and ctl.n_control == 0 and ctl.seq in self._all:
                self._expire(ctl)

    # -- connection table --------------------------------------------------------------------

    def _new_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _arm(self, cp: Conn, now: float) -> None:
        # __ip_vs_conn_put_timer: mod_timer(jiffies + cp->timeout)
        cp.gen += 1
        cp.expires_s = now + cp.timeout_s
        heapq.heappush(self._timers, (cp.expires_s, cp.seq, cp.gen, cp))

    def _hash(self, cp: Conn) -> None:
        self._all[cp.seq] = cp
        if cp.template:
            self._templates[_template_key(cp)] = cp
        else:
            self._conns_in[cp.in_key] = cp
            self._conns_out[cp.out_key] = cp

    def _unhash(self, cp: Conn) -> None:
        if cp.template:
            k = _template_key(cp)
            if self._templates.get(k) is cp:
                del self._templates[k]
        else:
            if self._conns_in.get(cp.in_key) is cp:
                del self._conns_in[cp.in_key]
            if self._conns_out.get(cp.out_key) is cp:
                del self._conns_out[cp.out_key]
        cp.hashed = False

    def _expire(self, cp: Conn) -> None:
        """``ip_vs_conn_expire`` for a connection that controls nothing: unhash, unbind, free."""
        self._unhash(cp)
        self._all.pop(cp.seq, None)
        cp.gen += 1
        ctl = cp.control
        if ctl is not None:
            ctl.n_control -= 1
            cp.control = None
        unbind_dest(cp)
        svc = cp.service
        if isinstance(svc, Service):
            svc.release(cp.dest)
        else:
            for s in self._services.values():
                s.release(cp.dest)

    def advance(self, now: float) -> None:
        """Fire every timer due at or before ``now`` (seconds), in time order.

        A connection that still controls others is re-armed for 60 s (``expire_later``);
        any other one is deleted. Time must not go backwards.

        Raises:
            IpvsError: ``now`` is earlier than a time already seen.
        """
        if now < self._now:
            raise IpvsError(f"time went backwards: {now=} < {self._now}")
        self._now = now
        timers = self._timers
        while timers and timers[0][0] <= now:
            at, _, gen, cp = heapq.heappop(timers)
            if gen != cp.gen or cp.seq not in self._all:
                continue
            if cp.n_control:
                cp.timeout_s = TEMPLATE_REARM_S
                self._arm(cp, at)
            else:
                self._expire(cp)

    def expire_now(self, cp: Conn) -> None:
        """``ip_vs_conn_expire_now`` (its timer fires at once; a controlling one is re-armed)."""
        if cp.n_control:
            cp.timeout_s = TEMPLATE_REARM_S
            self._arm(cp, self._now)
        elif cp.seq in self._all:
            self._expire(cp)

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
        """``ip_vs_conn_new``: a hashed entry bound to ``dest`` (state NONE, timeout 3 s, INACTIVE)."""
        cp = Conn(
            protocol=protocol,
            version=version,
            caddr=caddr,
            cport=cport,
            vaddr=vaddr,
            vport=vport,
            daddr=dest.addr,
            dport=dport,
            dest=dest,
            template=template,
            noutput=dest.spec.forward != "masq",
            nfct=self.sysctls.conntrack and not template,
            seq=self._new_seq(),
            service=svc,
        )
        bind_dest(cp, dest)
        self._hash(cp)
        return cp

    def template(self, key: tuple[str, int, int, int, int]) -> Conn | None:
        """``ip_vs_ct_in_get``: the live template for ``(protocol, version, snet, vaddr, vport)``."""
        return self._templates.get(key)

    def invalidate(self, ct: Conn) -> None:
        """``ip_vs_check_template`` failure: the template can never match again; it just expires."""
        self._unhash(ct)

    def put(self, cp: Conn) -> None:
        """``ip_vs_conn_put``: re-arm the timer with the entry's timeout from now."""
        self._arm(cp, self._now)

    def connections(self) -> tuple[ConnView, ...]:
        """Every entry (templates too), oldest first, as ``ipvsadm -Lnc`` would show them."""
        out = []
        for cp in sorted(self._all.values(), key=lambda c: c.seq):
            proto = "IP" if cp.protocol == "ip" else cp.protocol.upper()
            vaddr = _fmt(cp.version, cp.vaddr) if cp.protocol != "ip" else f"{cp.vaddr:08X}"
            out.append(
                ConnView(
                    protocol=proto,
                    client=_hostport(cp.version, _fmt(cp.version, cp.caddr), cp.cport),
                    virtual=_hostport(cp.version, vaddr, cp.vport),
                    real=_hostport(cp.version, _fmt(cp.version, cp.daddr), cp.dport),
                    state=state_name(cp),
                    expires_in_s=max(0.0, cp.expires_s - self._now),
                    template=cp.template,
                )
            )
        return tuple(out)

    def entries(self) -> Iterator[Conn]:
        """The live connection objects (for tests and tracing), oldest first."""
        return iter(sorted(self._all.values(), key=lambda c: c.seq))

    # -- packet path (ip_vs_core.c) ---------------------------------------------------------

    def find_service(self, protocol: str, version: int, daddr: int, dport: int, mark: int) -> Service | None:
        """``ip_vs_service_find``: fwmark, then ``<proto, vaddr, vport>``, then the port-0 catch-all."""
        if mark and self._fwm:
            svc = self._fwm.get((version, mark))
            if svc is not None:
                return svc
        if protocol not in PROTOCOLS:
            return None
        p = protocol  # a Proto literal at this point
        svc = self._services.get(ServiceKey(version, p, daddr, dport))
        if svc is None and dport:
            svc = self._services.get(ServiceKey(version, p, daddr, 0))
        return svc

    def process(
        self, packet: PacketLike, now: float, *, flags: str | None = None, ct_confirmed: bool = False
    ) -> IpvsResult:
        """``ip_vs_in``: what IPVS does with a packet arriving for a local address.

        Args:
            packet: the packet (after the netfilter INPUT hooks).
            now: the current time in seconds.
            flags: TCP flags as letters (``"S"``, ``"A"``, ``"FA"``, ``"R"``); by default a
                SYN if ``packet.syn`` else a bare ACK. Ignored for UDP.
            ct_confirmed: whether the packet's conntrack entry is already confirmed (only
                matters for a SYN that reuses the ports of an old IPVS connection).

        Returns:
            The verdict, the real server and a trace.
        """
        self.advance(now)
        proto = packet.protocol
        version, saddr = _parse(packet.src)
        _, daddr = _parse(packet.dst)
        tcpf = TcpFlags.parse(flags) if flags is not None else TcpFlags(syn=packet.syn, ack=not packet.syn)
        trace: list[str] = []
        if proto not in PROTOCOLS:
            return IpvsResult(verdict="accept", trace=(f"IPVS: {proto} is not scheduled here",))
        cp = self._conns_in.get((proto, version, saddr, packet.sport, daddr, packet.dport))
        is_new = proto in ("tcp", "sctp") and tcpf.syn
        if cp is not None and is_new:
            cp, dropped = self._port_reuse(cp, ct_confirmed, trace)
            if dropped:
                return IpvsResult(verdict="drop", trace=tuple(trace))
        if cp is not None and not cp.dest.available:
            s = self.sysctls
            if not s.expire_nodest_conn:
                trace.append(f"IPVS: connection to deleted {cp.dest.label}: dropped (expire_nodest_conn=0)")
                return IpvsResult(verdict="drop", trace=tuple(trace))
            old_ct = self._old_ct(cp, ct_confirmed)
            trace.append(f"IPVS: connection to deleted {cp.dest.label} expired (expire_nodest_conn=1)")
            self.expire_now(cp)
            if old_ct:
                return IpvsResult(verdict="drop", trace=tuple(trace))
            cp = None
        new = False
        svc_key: ServiceKey | None = None
        if cp is None:
            svc = self.find_service(proto, version, daddr, packet.dport, packet.mark)
            if svc is None:
                trace.append("IPVS: no virtual service: the packet goes on to the local stack")
                return IpvsResult(verdict="accept", trace=tuple(trace))
            svc_key = svc.spec.key
            if proto == "tcp" and not ((tcpf.syn or self.sysctls.sloppy_tcp) and not tcpf.rst):
                trace.append(f"IPVS: {svc_key}: no connection and not a SYN: accepted to the local stack")
                return IpvsResult(verdict="accept", service=svc_key, trace=tuple(trace))
            got = schedule(self, svc, packet, version, saddr, daddr, trace)
            if got is None:
                trace.append(f"IPVS: {svc_key}: no destination available: ICMP port unreachable")
                return IpvsResult(verdict="reject", service=svc_key, trace=tuple(trace))
            cp = got.conn
            new = True
        else:
            svc_key = cp.service.spec.key if isinstance(cp.service, Service) else None
            trace.append(f"IPVS: existing connection {state_name(cp)} -> {cp.dest.label}")
        self._transition(cp, "input", tcpf)
        real = (_fmt(cp.version, cp.daddr), cp.dport)
        svc_obj = cp.service
        if isinstance(svc_obj, Service) and svc_obj.spec.flags & SVC_F_ONEPACKET and proto == "udp" and new:
            self._expire(cp)
        else:
            self._arm(cp, now)
        return IpvsResult(
            verdict="forward",
            service=svc_key,
            real=real,
            new_connection=new,
            state=state_name(cp),
            trace=tuple(trace),
        )

    def process_reply(self, packet: PacketLike, now: float, *, flags: str | None = None) -> IpvsResult:
        """``ip_vs_out``: a reply from a real server; its source is rewritten to the virtual address.

        Returns:
            ``forward`` with ``translated`` set when the reply belongs to a connection,
            ``accept`` (untouched) otherwise.
        """
        self.advance(now)
        version, saddr = _parse(packet.src)
        _, daddr = _parse(packet.dst)
        cp = self._conns_out.get((packet.protocol, version, saddr, packet.sport, daddr, packet.dport))
        if cp is None:
            return IpvsResult(verdict="accept", trace=("IPVS: not a reply of an IPVS connection",))
        tcpf = TcpFlags.parse(flags) if flags is not None else TcpFlags(syn=packet.syn, ack=True)
        self._transition(cp, "output", tcpf)
        self._arm(cp, now)
        svc_key = cp.service.spec.key if isinstance(cp.service, Service) else None
        return IpvsResult(
            verdict="forward",
            service=svc_key,
            translated=(_fmt(cp.version, cp.vaddr), cp.vport),
            state=state_name(cp),
            trace=(f"IPVS: reply from {cp.dest.label}: source rewritten to the virtual address",),
        )

    def _transition(self, cp: Conn, direction: str, tcpf: TcpFlags) -> None:
        if cp.protocol == "tcp":
            tcp_transition(cp, direction, tcpf, self.timeouts)
        else:
            udp_transition(cp, self.sysctls.udp_timeout_s)

    def _old_ct(self, cp: Conn, ct_confirmed: bool) -> bool:
        # ip_vs_conn_uses_old_conntrack
        if not cp.nfct:
            return False
        return self.sysctls.pre_5_9_reuse or ct_confirmed

    def _port_reuse(self, cp: Conn, ct_confirmed: bool, trace: list[str]) -> tuple[Conn | None, bool]:
        """The ``is_new_conn`` block of ``ip_vs_in``: maybe expire ``cp`` and reschedule (or drop)."""
        s = self.sysctls
        resched = old_ct = False
        if s.expire_nodest_conn and cp.dest.weight == 0:
            resched = True
            old_ct = self._old_ct(cp, ct_confirmed)
            why = f"real server {cp.dest.label} has weight 0 (expire_nodest_conn=1)"
        elif s.conn_reuse_mode and _new_conn_expected(cp, s.conn_reuse_mode):
            old_ct = self._old_ct(cp, ct_confirmed)
            resched = not cp.n_control or not old_ct
            why = f"ports reused after {state_name(cp)} (conn_reuse_mode={s.conn_reuse_mode})"
        if not resched:
            return cp, False
        if not old_ct:
            cp.nfct = False
        if not cp.n_control:
            self.expire_now(cp)
        if old_ct:
            trace.append(f"IPVS: SYN {why}: old conntrack confirmed, dropped (client retries)")
            return None, True
        trace.append(f"IPVS: SYN {why}: old connection expired, rescheduling")
        return None, False


def _new_conn_expected(cp: Conn, mode: int) -> bool:
    # is_new_conn_expected
    if cp.control is not None:
        return False
    if cp.protocol == "tcp":
        return cp.state in (TcpState.TIME_WAIT, TcpState.CLOSE) or bool(
            mode & 2 and cp.state == TcpState.FIN_WAIT and cp.noutput
        )
    return False


def _template_key(cp: Conn) -> tuple[str, int, int, int, int]:
    return (cp.protocol, cp.version, cp.caddr, cp.vaddr, cp.vport)


def _hostport(version: int, addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if version == 6 else f"{addr}:{port}"
