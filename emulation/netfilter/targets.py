"""Targets (``-j NAME ...`` / ``-g CHAIN``) as data, and what each does to a packet.

``apply(ctx)`` returns a :data:`TargetResult`: ``CONTINUE`` (go on with the next rule), a
:class:`~emulation.netfilter.verdicts.Verdict` (``ACCEPT``, ``DROP``, ``REJECT``), ``RETURN``,
or ``("JUMP"|"GOTO", chain)``. NAT targets record their
decision in the context and return ``ACCEPT`` (their ``NF_ACCEPT`` ends the nat table for
this hook). Kernel sources are named per class (``net/netfilter/xt_*.c``, ``nf_nat_*.c``); building them from
their ``-j NAME`` options is :mod:`emulation.netfilter.target_options`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from emulation.addr import parse_address
from emulation.errors import NetfilterError
from emulation.netfilter.context import Ctx
from emulation.netfilter.tokens import quote
from emulation.netfilter.verdicts import CONTINUE, RETURN, Verdict

__all__ = [
    "CONTINUE",
    "REJECT_WITH",
    "Connmark",
    "Jump",
    "MarkTarget",
    "Masquerade",
    "Nat",
    "Redirect",
    "Reject",
    "Simple",
    "Target",
    "TargetResult",
    "UnknownTarget",
    "Verdict",
]

#: What a target's ``apply`` returns (see the module docstring).
TargetResult = Verdict | str | tuple[str, str]
#: What a Simple target's ``apply`` returns, by its name.
_SIMPLE_RESULT: dict[str, str] = {
    "ACCEPT": Verdict.ACCEPT,
    "DROP": Verdict.DROP,
    "RETURN": RETURN,
    "LOG": CONTINUE,
    "NFLOG": CONTINUE,
    "TRACE": CONTINUE,
}


class Target:
    """Base of every target: ``name`` as written after ``-j``."""

    name: ClassVar[str] = ""

    def apply(self, ctx: Ctx) -> TargetResult:
        """Do what the target does to the packet; return the verdict."""
        raise NotImplementedError

    def save_args(self) -> list[str]:
        """``-j NAME`` and its options as ``iptables-save`` prints them."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """The target's name for traces."""
        return self.name


@dataclass(frozen=True, slots=True)
class Simple(Target):
    """ACCEPT, DROP or RETURN; also LOG, NFLOG, NOTRACK and CT ``--notrack``, which continue."""

    verdict: str
    args: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.verdict

    def apply(self, ctx: Ctx) -> TargetResult:
        result = _SIMPLE_RESULT.get(self.verdict)
        if result is None:  # NOTRACK, CT --notrack
            ctx.notrack = True
            return CONTINUE
        return result

    def save_args(self) -> list[str]:
        return ["-j", self.verdict, *self.args]


@dataclass(frozen=True, slots=True)
class Jump(Target):
    """``-j CHAIN`` (``goto=False``) or ``-g CHAIN`` (``goto=True``) into a user chain."""

    chain: str
    goto: bool = False

    @property
    def label(self) -> str:
        return self.chain

    def apply(self, ctx: Ctx) -> TargetResult:
        return ("GOTO" if self.goto else "JUMP", self.chain)

    def save_args(self) -> list[str]:
        return ["-g" if self.goto else "-j", self.chain]


#: ``--reject-with`` types by IP version: canonical name -> (the alias iptables also takes, the
#: code of the ICMP / ICMPv6 destination unreachable sent, ``None`` for ``tcp-reset``). Names
#: and their order from ``reject_table`` in iptables' extensions/libipt_REJECT.c and
#: libip6t_REJECT.c (``iptables-save`` prints the canonical one; the order decides which type
#: an abbreviation means, see :func:`reject_type`); codes from the kernel's ipt_REJECT.c
#: ``reject_tg`` (ICMP_NET_UNREACH 0, HOST_UNREACH 1, PROT_UNREACH 2, PORT_UNREACH 3, NET_ANO 9,
#: HOST_ANO 10, PKT_FILTERED 13) and
#: ip6t_REJECT.c ``reject_tg6`` (ICMPV6_NOROUTE 0, ADM_PROHIBITED 1, ADDR_UNREACH 3,
#: PORT_UNREACH 4, POLICY_FAIL 5, REJECT_ROUTE 6).
REJECT_WITH: dict[int, dict[str, tuple[str, int | None]]] = {
    4: {
        "icmp-net-unreachable": ("net-unreach", 0),
        "icmp-host-unreachable": ("host-unreach", 1),
        "icmp-proto-unreachable": ("proto-unreach", 2),
        "icmp-port-unreachable": ("port-unreach", 3),
        "icmp-net-prohibited": ("net-prohib", 9),
        "icmp-host-prohibited": ("host-prohib", 10),
        "tcp-reset": ("tcp-rst", None),
        "icmp-admin-prohibited": ("admin-prohib", 13),
    },
    6: {
        "icmp6-no-route": ("no-route", 0),
        "icmp6-adm-prohibited": ("adm-prohibited", 1),
        "icmp6-addr-unreachable": ("addr-unreach", 3),
        "icmp6-port-unreachable": ("port-unreach", 4),
        "tcp-reset": ("tcp-reset", None),
        "icmp6-policy-fail": ("policy-fail", 5),
        "icmp6-reject-route": ("reject-route", 6),
    },
}
_REJECT_CODES = {name: code for names in REJECT_WITH.values() for name, (_, code) in names.items()}


@dataclass(frozen=True, slots=True)
class Reject(Target):
    """``-j REJECT [--reject-with TYPE]`` (ipt_REJECT.c, ip6t_REJECT.c): ends the packet; the
    kernel answers its sender with an ICMP / ICMPv6 error or a TCP RST, which
    :mod:`emulation.netfilter.reject` models. ``with_`` is a canonical name of
    :data:`REJECT_WITH`.

    Raises:
        NetfilterError: ``with_`` is not one of them.
    """

    with_: str = "icmp-port-unreachable"
    name: ClassVar[str] = "REJECT"

    def __post_init__(self) -> None:
        if self.with_ not in _REJECT_CODES:
            raise NetfilterError(f"--reject-with {self.with_!r}: expected one of {sorted(_REJECT_CODES)}")

    @property
    def icmp_code(self) -> int | None:
        """The code of the destination unreachable sent (ICMP or ICMPv6); ``None`` for tcp-reset."""
        return _REJECT_CODES[self.with_]

    def apply(self, ctx: Ctx) -> TargetResult:
        return Verdict.REJECT

    def save_args(self) -> list[str]:
        return ["-j", "REJECT", "--reject-with", self.with_]


@dataclass(frozen=True, slots=True)
class Nat(Target):
    """DNAT ``--to-destination`` / SNAT ``--to-source`` ``ADDR[-ADDR][:PORT[-PORT]]``.

    The first address of a range is used (kube-proxy writes single values); the kernel would
    pick within the range by a hash (``find_best_ips_proto``). DNAT takes the first port of
    a range; SNAT's port (kept when free and inside the range, else another) is chosen as
    :mod:`emulation.netfilter.nat` describes. A missing port keeps the packet's port (SNAT:
    when free). ``:PORT`` alone (``addr`` None) keeps the packet's address. ``spec`` is the text
    ip6tables-save prints: an IPv6 address in brackets only before a port. Only in the nat table.
    """

    kind: str  # DNAT or SNAT
    spec: str
    version: int
    addr: int | None  # None: ``:PORT`` alone, the packet keeps its address
    port: int | None
    flags: tuple[str, ...] = ()
    port_high: int | None = None  # the end of a ``:PORT-PORT`` range (else ``port``)

    @property
    def label(self) -> str:
        return f"{self.kind} {self.spec}"

    def apply(self, ctx: Ctx) -> TargetResult:
        if self.version != ctx.version:
            return Verdict.DROP
        if self.kind == "DNAT":
            addr = ctx.dst if self.addr is None else self.addr
            ctx.dnat = (addr, self.port if self.port is not None else ctx.dport)
            ctx.dst, ctx.dport = ctx.dnat
        else:
            high = self.port if self.port_high is None else self.port_high
            rand_all = "--random" in self.flags or "--random-fully" in self.flags
            ctx.snat = (ctx.src if self.addr is None else self.addr, self.port, high, rand_all)
        return Verdict.ACCEPT

    def save_args(self) -> list[str]:
        opt = "--to-destination" if self.kind == "DNAT" else "--to-source"
        return ["-j", self.kind, opt, self.spec, *self.flags]


@dataclass(frozen=True, slots=True)
class Masquerade(Target):
    """``-j MASQUERADE [--to-ports P[-P]] [--random] [--random-fully]`` (nf_nat_masquerade.c).

    The new source is the out interface's address chosen like ``inet_select_addr`` (see
    :meth:`Node.source_address`); the source port is chosen as the kernel's
    ``get_unique_tuple`` does (:mod:`emulation.netfilter.nat`): kept when its reply tuple is
    free (and inside ``--to-ports``), else another; always a random one with ``--random`` or
    ``--random-fully``.
    """

    to_ports: tuple[int, int] | None = None
    flags: tuple[str, ...] = ()
    name: ClassVar[str] = "MASQUERADE"

    def apply(self, ctx: Ctx) -> TargetResult:
        ctx.masquerade = True
        low, high = self.to_ports if self.to_ports else (None, None)
        ctx.snat = (-1, low, high, bool(self.flags))  # both flags are NF_NAT_RANGE_PROTO_RANDOM_ALL
        return Verdict.ACCEPT

    def save_args(self) -> list[str]:
        out = ["-j", "MASQUERADE"]
        if self.to_ports:
            lo, hi = self.to_ports
            out += ["--to-ports", str(lo) if lo == hi else f"{lo}-{hi}"]
        return out + list(self.flags)


@dataclass(frozen=True, slots=True)
class Redirect(Target):
    """``-j REDIRECT [--to-ports P]`` (nf_nat_redirect.c): DNAT to the node itself.

    The address is 127.0.0.1 / ::1 for locally generated packets, else the in-interface's
    primary address.
    """

    to_ports: tuple[int, int] | None = None
    flags: tuple[str, ...] = ()
    name: ClassVar[str] = "REDIRECT"

    def apply(self, ctx: Ctx) -> TargetResult:
        if ctx.iif is None or ctx.iif == "lo":
            addr = parse_address("127.0.0.1" if ctx.version == 4 else "::1")[1]
        else:
            primary = ctx.node.primary_address(ctx.iif, ctx.version)
            if primary is None:
                return Verdict.DROP
            addr = parse_address(primary)[1]
        ctx.dnat = (addr, self.to_ports[0] if self.to_ports else ctx.dport)
        ctx.dst, ctx.dport = ctx.dnat
        return Verdict.ACCEPT

    def save_args(self) -> list[str]:
        out = ["-j", "REDIRECT"]
        if self.to_ports:
            lo, hi = self.to_ports
            out += ["--to-ports", str(lo) if lo == hi else f"{lo}-{hi}"]
        return out + list(self.flags)


@dataclass(frozen=True, slots=True)
class MarkTarget(Target):
    """``-j MARK``: ``nfmark = (nfmark & ~mask) ^ value`` (xt_mark.c, ``--set-xmark``).

    ``--set-mark V/M`` is ``V/(M|V)``, ``--and-mark V`` is ``0/~V``, ``--or-mark V`` is ``V/V``
    and ``--xor-mark V`` is ``V/0``, as libxt_MARK stores them.
    """

    value: int
    mask: int
    name: ClassVar[str] = "MARK"

    def apply(self, ctx: Ctx) -> TargetResult:
        ctx.mark = (ctx.mark & ~self.mask & 0xFFFFFFFF) ^ self.value
        return CONTINUE

    def save_args(self) -> list[str]:
        return ["-j", "MARK", "--set-xmark", f"{self.value:#x}/{self.mask:#x}"]


@dataclass(frozen=True, slots=True)
class Connmark(Target):
    """``-j CONNMARK`` (xt_connmark.c): set (xmark), ``--save-mark`` or ``--restore-mark``."""

    mode: str  # set, save, restore
    value: int = 0
    mask: int = 0xFFFFFFFF
    nfmask: int = 0xFFFFFFFF
    ctmask: int = 0xFFFFFFFF
    name: ClassVar[str] = "CONNMARK"

    def apply(self, ctx: Ctx) -> TargetResult:
        if self.mode == "set":
            ctx.ctmark = (ctx.ctmark & ~self.mask & 0xFFFFFFFF) ^ self.value
        elif self.mode == "save":
            ctx.ctmark = (ctx.ctmark & ~self.ctmask & 0xFFFFFFFF) ^ (ctx.mark & self.nfmask)
        else:
            ctx.mark = (ctx.mark & ~self.nfmask & 0xFFFFFFFF) ^ (ctx.ctmark & self.ctmask)
        return CONTINUE

    def save_args(self) -> list[str]:
        if self.mode == "set":
            return ["-j", "CONNMARK", "--set-xmark", f"{self.value:#x}/{self.mask:#x}"]
        return [
            "-j",
            "CONNMARK",
            f"--{self.mode}-mark",
            "--nfmask",
            f"{self.nfmask:#x}",
            "--ctmask",
            f"{self.ctmask:#x}",
        ]


@dataclass(frozen=True, slots=True)
class UnknownTarget(Target):
    """A target the emulator does not model (lenient mode): traced as unknown; evaluation continues."""

    target: str
    args: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.target} (unknown)"

    def apply(self, ctx: Ctx) -> TargetResult:
        ctx.uncertain = True
        return CONTINUE

    def save_args(self) -> list[str]:
        return ["-j", self.target, *(a if a == "!" or a.startswith("-") else quote(a) for a in self.args)]
