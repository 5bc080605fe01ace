"""Writing ``ipvsadm-save -n`` rules and ``ipvsadm -Ln [--nosort]`` listings.

Output follows ``ipvsadm.c`` ``print_title`` / ``print_service_entry`` (numeric format): the
listing's real-server rows are ``"  -> %-28s %-7s %-6d %-10u %-10u"`` (trailing spaces
included); rules are ``-A -t ADDR:PORT -s SCHED [-b FLAGS] [-p TIMEOUT [-M MASK]] [-o]`` and
``-a -t ADDR:PORT -r ADDR:PORT -m|-g|-i -w WEIGHT``. Unless ``nosort``, services and servers are
sorted with libipvs's ``ipvs_cmp_services`` / ``ipvs_cmp_dests``, whose address comparison is a
32-bit signed difference (so 192.168.0.0/16 sorts before 10.0.0.0/8: ``0x0A.. - 0xC0..``
wraps positive); with ``nosort`` servers come in kernel list order, head first, and services
in the order they were added (the kernel's service hash order depends on a netns pointer and
cannot be reproduced).

Reading them back is :mod:`emulation.ipvs.restore`.
"""

from __future__ import annotations

import functools

from emulation.ipvs.model import (
    PROTO_NUMBERS,
    SVC_F_ONEPACKET,
    SVC_F_SCHED1,
    SVC_F_SCHED2,
    SVC_F_SCHED3,
    Dest,
    ServiceSpec,
    format_address,
)
from emulation.ipvs.service import Service
from emulation.ipvs.table import IpvsTable

__all__ = ["GENERIC_FLAGS", "HEADER", "SCHED_FLAG_NAMES", "format_list", "format_rules"]

HEADER = (
    "IP Virtual Server version 1.2.1 (size=4096)\n"
    "Prot LocalAddress:Port Scheduler Flags\n"
    "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n"
)
_FWD_NAME: dict[str, str] = {"masq": "Masq", "route": "Route", "tunnel": "Tunnel", "local": "Local"}
_FWD_SWITCH: dict[str, str] = {"masq": "-m", "route": "-g", "tunnel": "-i", "local": "-g"}
SCHED_FLAG_NAMES = {
    "sh": ((SVC_F_SCHED1, "sh-fallback"), (SVC_F_SCHED2, "sh-port"), (SVC_F_SCHED3, "flag-3")),
    "mh": ((SVC_F_SCHED1, "mh-fallback"), (SVC_F_SCHED2, "mh-port"), (SVC_F_SCHED3, "flag-3")),
}
GENERIC_FLAGS = ((SVC_F_SCHED1, "flag-1"), (SVC_F_SCHED2, "flag-2"), (SVC_F_SCHED3, "flag-3"))
_AF = {4: 2, 6: 10}


# -- output -------------------------------------------------------------------------------------


def _s32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _cmp_addr(version: int, a: int, b: int) -> int:
    # ntohl(a) - ntohl(b) as int, word by word for IPv6 (libipvs ipvs_cmp_*)
    if version == 4:
        return _s32(a - b)
    for shift in (96, 64, 32, 0):
        r = _s32((a >> shift) - (b >> shift))
        if r:
            return r
    return 0


def _cmp_services(s1: Service, s2: Service) -> int:
    k1, k2 = s1.spec.key, s2.spec.key
    for r in (
        _s32(k1.fwmark - k2.fwmark),
        _AF[k1.version] - _AF[k2.version],
        PROTO_NUMBERS[k1.protocol] - PROTO_NUMBERS[k2.protocol] if not k1.fwmark else 0,
        _cmp_addr(k1.version, k1.addr, k2.addr),
        k1.port - k2.port,
    ):
        if r:
            return r
    return 0


def _cmp_dests(d1: Dest, d2: Dest) -> int:
    return _cmp_addr(d1.version, d1.addr, d2.addr) or d1.port - d2.port


def _ordered(table: IpvsTable, nosort: bool) -> list[tuple[Service, list[Dest]]]:
    services = list(table.services())
    if not nosort:
        services.sort(key=functools.cmp_to_key(_cmp_services))
    out = []
    for svc in services:
        dests = list(svc.dests)
        if not nosort:
            dests.sort(key=functools.cmp_to_key(_cmp_dests))
        out.append((svc, dests))
    return out


def _hostport(version: int, addr: int, port: int) -> str:
    a = format_address(version, addr)
    return f"[{a}]:{port}" if version == 6 else f"{a}:{port}"


def _sched_flags(spec: ServiceSpec) -> str:
    names = SCHED_FLAG_NAMES.get(spec.scheduler, GENERIC_FLAGS)
    return ",".join(name for bit, name in names if spec.flags & bit)


def _mask_text(spec: ServiceSpec) -> str:
    assert spec.netmask is not None
    if spec.key.version == 4:
        return "" if spec.netmask == 0xFFFFFFFF else format_address(4, spec.netmask)
    return "" if spec.netmask == 128 else str(spec.netmask)


def format_list(table: IpvsTable, *, nosort: bool = False, header: bool = True) -> str:
    """``ipvsadm -Ln`` (or ``-Ln --nosort``) text, byte for byte."""
    lines = [HEADER] if header else []
    for svc, dests in _ordered(table, nosort):
        spec = svc.spec
        key = spec.key
        if key.fwmark:
            name = f"FWM  {key.fwmark}" + (" IPv6" if key.version == 6 else "")
        else:
            name = f"{key.protocol.upper():<4} {_hostport(key.version, key.addr, key.port)}"
            if key.version == 4:
                name = name[:33]
        line = f"{name} {spec.scheduler}"
        if spec.flags & (SVC_F_SCHED1 | SVC_F_SCHED2 | SVC_F_SCHED3):
            line += f" ({_sched_flags(spec)})"
        if spec.persistent:
            line += f" persistent {spec.timeout_s}"
            mask = _mask_text(spec)
            if mask:
                line += f" mask {mask}"
        if spec.flags & SVC_F_ONEPACKET:
            line += " ops"
        lines.append(line + "\n")
        for d in dests:
            dname = _hostport(d.version, d.addr, d.port)
            if d.version == 4:
                dname = dname[:28]
            fwd = _FWD_NAME[d.spec.forward]
            lines.append(f"  -> {dname:<28} {fwd:<7} {d.weight:<6} {d.activeconns:<10} {d.inactconns:<10}\n")
    return "".join(lines)


def format_rules(table: IpvsTable, *, nosort: bool = False) -> str:
    """``ipvsadm-save -n`` (``ipvsadm -Sn``) text: one ``-A`` per service, one ``-a`` per server."""
    lines = []
    for svc, dests in _ordered(table, nosort):
        spec = svc.spec
        key = spec.key
        if key.fwmark:
            name = f"-f {key.fwmark}" + (" -6" if key.version == 6 else "")
        else:
            opt = {"tcp": "-t", "udp": "-u", "sctp": "--sctp-service"}[key.protocol]
            name = f"{opt} {_hostport(key.version, key.addr, key.port)}"
        line = f"-A {name} -s {spec.scheduler}"
        if spec.flags & (SVC_F_SCHED1 | SVC_F_SCHED2 | SVC_F_SCHED3):
            line += f" -b {_sched_flags(spec)}"
        if spec.persistent:
            line += f" -p {spec.timeout_s}"
            mask = _mask_text(spec)
            if mask:
                line += f" -M {mask}"
        if spec.flags & SVC_F_ONEPACKET:
            line += " -o"
        lines.append(line + "\n")
        for d in dests:
            real = _hostport(d.version, d.addr, d.port)
            rule = f"-a {name} -r {real} {_FWD_SWITCH[d.spec.forward]} -w {d.weight}"
            if d.u_threshold:
                rule += f" -x {d.u_threshold}"
            if d.l_threshold:
                rule += f" -y {d.l_threshold}"
            lines.append(rule + "\n")
    return "".join(lines)
