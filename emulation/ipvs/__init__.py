"""A faithful model of the Linux IPVS table (``net/netfilter/ipvs/``), standalone.

Virtual services and real servers (:class:`ServiceSpec`, :class:`DestSpec`), the kernel's
schedulers (rr, wrr, lc, wlc, sed, nq, fo, ovf, sh, dh, mh) with its tie-breaking and hashing,
the connection table with TCP/UDP states, persistence templates and the ``net.ipv4.vs``
sysctls (:class:`Sysctls`), and ``ipvsadm-save -n`` / ``ipvsadm -Ln`` text in and out.

Entry point for the emulated node: :meth:`IpvsTable.process` (``ip_vs_in`` at LOCAL_IN, after
netfilter INPUT) and :meth:`IpvsTable.process_reply` (``ip_vs_out`` for a real server's reply).
"""

from emulation.ipvs.conn import TCP_TIMEOUTS_S, UDP_TIMEOUT_S, TcpFlags, TcpState
from emulation.ipvs.errors import IpvsError
from emulation.ipvs.hashing import fold_address, hash_32, hsiphash, hsiphash_u32, jhash, jhash_3words
from emulation.ipvs.model import (
    SVC_F_ONEPACKET,
    SVC_F_PERSISTENT,
    SVC_F_SCHED1,
    SVC_F_SCHED2,
    SVC_F_SCHED3,
    Dest,
    DestSpec,
    ServiceKey,
    ServiceSpec,
    format_address,
    parse_address,
)
from emulation.ipvs.restore import load_list, load_rules
from emulation.ipvs.result import ConnView, IpvsResult, PacketLike
from emulation.ipvs.sched_base import SchedInput, Scheduler
from emulation.ipvs.service import SCHEDULERS, Service, make_scheduler
from emulation.ipvs.sysctl import Sysctls
from emulation.ipvs.table import IpvsTable
from emulation.ipvs.text import format_list, format_rules

SH_FALLBACK = SVC_F_SCHED1
SH_PORT = SVC_F_SCHED2
MH_FALLBACK = SVC_F_SCHED1
MH_PORT = SVC_F_SCHED2

__all__ = [
    "MH_FALLBACK",
    "MH_PORT",
    "SCHEDULERS",
    "SH_FALLBACK",
    "SH_PORT",
    "SVC_F_ONEPACKET",
    "SVC_F_PERSISTENT",
    "SVC_F_SCHED1",
    "SVC_F_SCHED2",
    "SVC_F_SCHED3",
    "TCP_TIMEOUTS_S",
    "UDP_TIMEOUT_S",
    "ConnView",
    "Dest",
    "DestSpec",
    "IpvsError",
    "IpvsResult",
    "IpvsTable",
    "PacketLike",
    "SchedInput",
    "Scheduler",
    "Service",
    "ServiceKey",
    "ServiceSpec",
    "Sysctls",
    "TcpFlags",
    "TcpState",
    "fold_address",
    "format_address",
    "format_list",
    "format_rules",
    "hash_32",
    "hsiphash",
    "hsiphash_u32",
    "jhash",
    "jhash_3words",
    "load_list",
    "load_rules",
    "make_scheduler",
    "parse_address",
]
