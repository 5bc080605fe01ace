"""The ``net.ipv4.vs.*`` knobs the model honours, and the protocol timeouts (``ipvsadm --set``)."""

from __future__ import annotations

from dataclasses import dataclass

from emulation.ipvs.errors import IpvsError

__all__ = ["Sysctls"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sysctls:
    """IPVS settings, with the kernel's defaults (``ip_vs_control_net_init_sysctl``).

    Attributes:
        conntrack: ``vs/conntrack``: connections keep a netfilter conntrack entry (``NFCT``).
            kube-proxy sets 1.
        conn_reuse_mode: ``vs/conn_reuse_mode`` bitmap (default 1): bit 1 reschedules a SYN
            that reuses the ports of a TIME_WAIT/CLOSE connection; bit 2 also FIN_WAIT ones
            of non-NAT servers.
        expire_nodest_conn: ``vs/expire_nodest_conn`` (default 0): expire, instead of silently
            dropping packets of, connections whose real server was deleted; also reschedule a
            SYN that reuses a connection to a weight-0 server. kube-proxy sets 1.
        expire_quiescent_template: ``vs/expire_quiescent_template`` (default 0): a
            persistence template pointing at a weight-0 server is invalidated. kube-proxy sets 1.
        sloppy_tcp: ``vs/sloppy_tcp``: schedule TCP on any packet, not only SYN.
        nodest_flush: kernels 5.9 and later also queue work, when a server is deleted with
            ``expire_nodest_conn=1``, that deletes every connection to a deleted server at
            once (``ip_vs_expire_nodest_conn_flush``); older kernels only expire them when
            their next packet arrives.
        pre_5_9_reuse: kernels before 5.9 treat a reused-port SYN's conntrack as "old"
            whenever the connection has ``NFCT`` (so with ``conntrack=1`` the SYN is dropped
            and the client retransmits a second later); 5.9+ only when it is confirmed.
        tcp_timeout_s, tcp_fin_timeout_s, udp_timeout_s: ``ipvsadm --set tcp tcpfin udp``:
            the ESTABLISHED, FIN_WAIT and UDP timeouts (900, 120, 300 s).

    Raises:
        IpvsError: a timeout that is not positive or a reuse mode outside 0..3.
    """

    conntrack: bool = False
    conn_reuse_mode: int = 1
    expire_nodest_conn: bool = False
    expire_quiescent_template: bool = False
    sloppy_tcp: bool = False
    nodest_flush: bool = True
    pre_5_9_reuse: bool = False
    tcp_timeout_s: float = 900.0
    tcp_fin_timeout_s: float = 120.0
    udp_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 <= self.conn_reuse_mode <= 3:
            raise IpvsError(f"conn_reuse_mode={self.conn_reuse_mode}; expected a 0..3 bitmap")
        for name in ("tcp_timeout_s", "tcp_fin_timeout_s", "udp_timeout_s"):
            if getattr(self, name) <= 0:
                raise IpvsError(f"{name}={getattr(self, name)} must be positive seconds")

    @classmethod
    def kube_proxy(cls) -> Sysctls:
        """What kube-proxy's ipvs proxier sets on a 5.9+ kernel (conn_reuse_mode left at 1)."""
        return cls(conntrack=True, expire_nodest_conn=True, expire_quiescent_template=True)
