"""What the socket-LB programs do to one connect, predicted on the BPF machine (no root).

:func:`emulated_socklb` loads the programs and a rendering's maps into an
:class:`~kproxy.kernel.bpf.EmulatedBpf`; :func:`predict_connect` runs the connect (or sendmsg)
program there in enumerate mode: every outcome of the random slot choice with its exact
probability, grouped by destination. This is what ``trace`` and the equivalence checks need
for clients on the node: socket-LB decides at connect time, before any packet exists.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from emulation.bpf import AttachType, SockAddr, TraceEvent
from kproxy.errors import InvalidArgument
from kproxy.kernel.bpf import EmulatedBpf
from kproxy.model import IPFamily
from kproxy.modes.ebpf.datapath.loader import SockLB
from kproxy.modes.ebpf.datapath.sock import FORWARD_HOOKS, SOCK_MAPS, sock_program

__all__ = ["ConnectOutcome", "ConnectVerdict", "emulated_socklb", "predict_connect"]


class ConnectVerdict(StrEnum):
    """What the connect hook decided."""

    TRANSLATED = "translated"  # the destination became a backend
    UNTRANSLATED = "untranslated"  # no Service there (or not for socket-LB): left as it was
    REFUSED = "refused"  # the connect fails (``errno``)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectOutcome:
    """One possible result of a connect.

    Attributes:
        verdict: translated, untranslated or refused.
        address: the destination after the hook; port: its port.
        probability: the share of connects with this result (exact).
        errno: the connect's error when refused (``EHOSTUNREACH`` without backends), else None.
        trace: one path's map lookups, random draw and exit, for explanations.
    """

    verdict: ConnectVerdict
    address: str
    port: int
    probability: Fraction
    errno: int | None = None
    trace: tuple[TraceEvent, ...] = ()


def emulated_socklb(entries: Mapping[str, Mapping[bytes, bytes]], *, max_entries: int = 1 << 16,
                    clock_ns: int = 0) -> tuple[EmulatedBpf, SockLB]:
    """An emulated kernel with the socket-LB programs and a full rendering's maps
    (:meth:`kproxy.modes.ebpf.render.EbpfMaps.entries`)."""
    k = EmulatedBpf(clock_ns=lambda: clock_ns)
    lb = SockLB.load(k, max_entries=max_entries)
    lb.fill(entries)
    return k, lb


def predict_connect(k: EmulatedBpf, lb: SockLB, address: str, port: int, protocol: int = 6, *,
                    sendmsg: bool = False, socket_cookie: int = 1,
                    netns_cookie: int = 1) -> tuple[ConnectOutcome, ...]:
    """Every outcome of ``connect(address, port)`` (``sendmsg``: an unconnected UDP send) from a
    socket with these cookies, most likely first; the probabilities sum to 1. The maps are not
    changed (each path runs on a copy).

    Raises:
        InvalidArgument: not an IP address, or a protocol other than TCP (6) and UDP (17).
    """
    try:
        dst = ipaddress.ip_address(address)
    except ValueError:
        raise InvalidArgument(f"predict_connect: {address=} is not an IP address") from None
    family = IPFamily.IPv6 if dst.version == 6 else IPFamily.IPv4
    if protocol not in (6, 17):
        raise InvalidArgument(f"predict_connect: {protocol=} is not TCP (6) or UDP (17)")
    connect, send = FORWARD_HOOKS[family]
    hook: AttachType = send if sendmsg else connect
    fds = {name: lb.fd(family, name) for name in SOCK_MAPS}
    ctx = SockAddr(attach=hook, user_ip=address, user_port=port, protocol=protocol,
                   type=socket.SOCK_STREAM if protocol == 6 else socket.SOCK_DGRAM,
                   socket_cookie=socket_cookie, netns_cookie=netns_cookie)
    grouped: dict[tuple[ConnectVerdict, str, int, int | None], ConnectOutcome] = {}
    for run in k.machine().enumerate(sock_program(hook).assemble(fds), ctx):
        out = run.ctx if isinstance(run.ctx, SockAddr) else ctx
        if run.ret32 != 1:
            verdict, err = ConnectVerdict.REFUSED, -(run.retval or -1)  # EPERM without a retval
        elif (ipaddress.ip_address(out.user_ip), out.user_port) != (dst, port):
            verdict, err = ConnectVerdict.TRANSLATED, None
        else:
            verdict, err = ConnectVerdict.UNTRANSLATED, None
        key = (verdict, out.user_ip, out.user_port, err)
        prev = grouped.get(key)
        grouped[key] = ConnectOutcome(verdict=verdict, address=out.user_ip, port=out.user_port,
                                      probability=run.probability + (prev.probability if prev else 0),
                                      errno=err, trace=prev.trace if prev else run.trace)
    return tuple(sorted(grouped.values(), key=lambda o: (-o.probability, o.address, o.port)))
