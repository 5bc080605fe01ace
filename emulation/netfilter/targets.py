"""Targets (``-j NAME ...`` / ``-g CHAIN``) as data, and what each does to a packet.

``apply(ctx)`` returns a :data:`Verdict`: ``CONTINUE`` (go on with the next rule), ``ACCEPT``,
``DROP``, ``REJECT``, ``RETURN``, or ``("JUMP"|"GOTO", chain)``. NAT targets record their
decision in the context and return ``ACCEPT`` (their ``NF_ACCEPT`` ends the nat table for
this hook). Kernel sources are named per class (``net/netfilter/xt_*.c``, ``nf_nat_*.c``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from emulation.addr import parse_address
from emulation.errors import NetfilterError
from emulation.netfilter.context import Ctx
from emulation.netfilter.matches import Opt, parse_mark, parse_port_range
from emulation.netfilter.tokens import quote

__all__ = [
    "NAT_PORT_PROTOCOLS",
    "REJECT_WITH",
    "TARGETS",
    "Connmark",
    "Jump",
    "MarkTarget",
    "Masquerade",
    "Nat",
    "Redirect",
    "Reject",
    "Simple",
    "Target",
    "UnknownTarget",
    "Verdict",
    "check_protocol",
    "reject_type",
]

Verdict = str | tuple[str, str]
CONTINUE = "CONTINUE"


class Target:
    """Base of every target: ``name`` as written after ``-j``."""

    name: ClassVar[str] = ""
    #: tables where the target may be used (empty: any)
    tables: ClassVar[frozenset[str]] = frozenset()

    def apply(self, ctx: Ctx) -> Verdict:
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

    def apply(self, ctx: Ctx) -> Verdict:
        if self.verdict in ("NOTRACK", "CT"):
            ctx.notrack = True
            return CONTINUE
        if self.verdict in ("LOG", "NFLOG", "TRACE"):
            return CONTINUE
        return self.verdict

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

    def apply(self, ctx: Ctx) -> Verdict:
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
    tables: ClassVar[frozenset[str]] = frozenset({"filter"})

    def __post_init__(self) -> None:
        if self.with_ not in _REJECT_CODES:
            raise NetfilterError(f"--reject-with {self.with_!r}: expected one of {sorted(_REJECT_CODES)}")

    @property
    def icmp_code(self) -> int | None:
        """The code of the destination unreachable sent (ICMP or ICMPv6); ``None`` for tcp-reset."""
        return _REJECT_CODES[self.with_]

    def apply(self, ctx: Ctx) -> Verdict:
        return "REJECT"

    def save_args(self) -> list[str]:
        return ["-j", "REJECT", "--reject-with", self.with_]


def _split_hostport(text: str) -> tuple[str, str]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, rest.removeprefix(":")
    if text.count(":") > 1:
        return text, ""
    host, _, port = text.partition(":")
    return host, port


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
    tables: ClassVar[frozenset[str]] = frozenset({"nat"})

    @property
    def label(self) -> str:
        return f"{self.kind} {self.spec}"

    def apply(self, ctx: Ctx) -> Verdict:
        if self.version != ctx.version:
            return "DROP"
        if self.kind == "DNAT":
            addr = ctx.dst if self.addr is None else self.addr
            ctx.dnat = (addr, self.port if self.port is not None else ctx.dport)
            ctx.dst, ctx.dport = ctx.dnat
        else:
            high = self.port if self.port_high is None else self.port_high
            rand_all = "--random" in self.flags or "--random-fully" in self.flags
            ctx.snat = (ctx.src if self.addr is None else self.addr, self.port, high, rand_all)
        return "ACCEPT"

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
    tables: ClassVar[frozenset[str]] = frozenset({"nat"})

    def apply(self, ctx: Ctx) -> Verdict:
        ctx.masquerade = True
        low, high = self.to_ports if self.to_ports else (None, None)
        ctx.snat = (-1, low, high, bool(self.flags))  # both flags are NF_NAT_RANGE_PROTO_RANDOM_ALL
        return "ACCEPT"

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
    tables: ClassVar[frozenset[str]] = frozenset({"nat"})

    def apply(self, ctx: Ctx) -> Verdict:
        if ctx.iif is None or ctx.iif == "lo":
            addr = parse_address("127.0.0.1" if ctx.version == 4 else "::1")[1]
        else:
            primary = ctx.node.primary_address(ctx.iif, ctx.version)
            if primary is None:
                return "DROP"
            addr = parse_address(primary)[1]
        ctx.dnat = (addr, self.to_ports[0] if self.to_ports else ctx.dport)
        ctx.dst, ctx.dport = ctx.dnat
        return "ACCEPT"

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

    def apply(self, ctx: Ctx) -> Verdict:
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

    def apply(self, ctx: Ctx) -> Verdict:
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

    def apply(self, ctx: Ctx) -> Verdict:
        ctx.uncertain = True
        return CONTINUE

    def save_args(self) -> list[str]:
        return ["-j", self.target, *(a if a == "!" or a.startswith("-") else quote(a) for a in self.args)]


# --- building targets from options ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """A target: option name -> number of values, and a builder ``(opts, ip version)``."""

    options: dict[str, int]
    build: Callable[[list[Opt], int], Target]


def _opts(opts: list[Opt]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name, neg, value in opts:
        if neg:
            raise NetfilterError(f"{name} cannot be negated")
        if name in out:
            raise NetfilterError(f"option {name} given twice")
        out[name] = value
    return out


def _simple(verdict: str) -> Callable[[list[Opt], int], Target]:
    def build(opts: list[Opt], version: int) -> Target:
        o = _opts(opts)
        if verdict == "CT" and set(o) != {"--notrack"}:
            raise NetfilterError("only CT --notrack is modelled")
        args: list[str] = []
        if verdict == "LOG":
            for k in ("--log-level", "--log-prefix"):
                if k in o:
                    args += [k, quote(o[k] or "") if k == "--log-prefix" else (o[k] or "")]
        elif verdict == "CT":
            args = ["--notrack"]
        elif o:
            raise NetfilterError(f"{verdict} takes no options, got {sorted(o)}")
        return Simple(verdict, tuple(args))

    return build


def reject_type(given: str, version: int) -> str:
    """The canonical ``--reject-with`` type ``given`` names, as ``REJECT_parse`` reads it.

    libipt_REJECT.c / libip6t_REJECT.c take the first type, in table order, whose name or alias
    starts with ``given`` ignoring case (``strncasecmp(name, arg, strlen(arg))``): ``tcp``,
    ``TCP-RESET`` and ``tcp-rst`` are tcp-reset, ``icmp`` is icmp-net-unreachable (icmp6-no-route
    for IPv6) and ``host`` is icmp-host-unreachable.

    Raises:
        NetfilterError: no type starts with ``given``.
    """
    want = given.lower()
    for name, (alias, _) in REJECT_WITH[version].items():
        if name.startswith(want) or alias.startswith(want):
            return name
    hint = " (echo-reply is no longer supported)" if "echo-reply".startswith(want) and version == 4 else ""
    raise NetfilterError(
        f"unknown reject type {given!r}{hint}; expected one of {list(REJECT_WITH[version])}, "
        "their aliases, or a prefix of one"
    )


def _reject(opts: list[Opt], version: int) -> Target:
    o = _opts(opts)
    given = o.get("--reject-with")
    if given is None:  # REJECT_init: port unreachable
        return Reject("icmp-port-unreachable" if version == 4 else "icmp6-port-unreachable")
    return Reject(reject_type(given, version))


def _nat(kind: str) -> Callable[[list[Opt], int], Target]:
    opt = "--to-destination" if kind == "DNAT" else "--to-source"

    def build(opts: list[Opt], version: int) -> Target:
        o = _opts(opts)
        spec = o.get(opt)
        if not spec:
            raise NetfilterError(f"{kind} needs {opt} ADDR[:PORT]")
        host, port_s = _split_hostport(spec)
        if not host and not port_s:
            raise NetfilterError(f"{kind} {opt} {spec!r}: expected ADDR[-ADDR][:PORT[-PORT]] or :PORT")
        addr: int | None = None
        if host:  # ``:PORT`` alone keeps the address (no NF_NAT_RANGE_MAP_IPS)
            v, addr = parse_address(host.partition("-")[0])
            if v != version:
                raise NetfilterError(f"{opt} {spec!r} is not an IPv{version} address")
        port, high = parse_port_range(port_s.replace("-", ":")) if port_s else (None, None)
        flags = tuple(f for f in ("--random", "--random-fully", "--persistent") if f in o)
        if version == 6 and spec.startswith("[") and not port_s:
            spec = host  # ip6tables-save brackets an address only when a port follows
        return Nat(kind, spec, version, addr, port, flags, None if high == port else high)

    return build


def _to_ports(o: dict[str, str | None]) -> tuple[int, int] | None:
    return parse_port_range((o["--to-ports"] or "").replace("-", ":")) if "--to-ports" in o else None


def _masquerade(opts: list[Opt], version: int) -> Target:
    o = _opts(opts)
    return Masquerade(_to_ports(o), tuple(f for f in ("--random", "--random-fully") if f in o))


def _redirect(opts: list[Opt], version: int) -> Target:
    o = _opts(opts)
    return Redirect(_to_ports(o), tuple(f for f in ("--random",) if f in o))


def _mark_target(opts: list[Opt], version: int) -> Target:
    o = _opts(opts)
    if len(o) != 1:
        raise NetfilterError(
            "MARK needs exactly one of --set-xmark, --set-mark, --and-mark, --or-mark, --xor-mark"
        )
    ((name, value),) = o.items()
    v, m = parse_mark(value or "")
    if name == "--set-xmark":
        return MarkTarget(v, m)
    if name == "--set-mark":
        return MarkTarget(v, m | v)
    if name == "--and-mark":
        return MarkTarget(0, ~v & 0xFFFFFFFF)
    if name == "--or-mark":
        return MarkTarget(v, v)
    return MarkTarget(v, 0)


def _connmark(opts: list[Opt], version: int) -> Target:
    o = _opts(opts)
    nfmask = parse_mark(o["--nfmask"] or "")[0] if "--nfmask" in o else 0xFFFFFFFF
    ctmask = parse_mark(o["--ctmask"] or "")[0] if "--ctmask" in o else 0xFFFFFFFF
    if "--save-mark" in o or "--restore-mark" in o:
        mode = "save" if "--save-mark" in o else "restore"
        if "--mask" in o:
            nfmask = ctmask = parse_mark(o["--mask"] or "")[0]
        return Connmark(mode, nfmask=nfmask, ctmask=ctmask)
    m = _mark_target([(k, False, v) for k, v in o.items()], version)
    assert isinstance(m, MarkTarget)
    return Connmark("set", m.value, m.mask)


TARGETS: dict[str, TargetSpec] = {
    "ACCEPT": TargetSpec({}, _simple("ACCEPT")),
    "DROP": TargetSpec({}, _simple("DROP")),
    "RETURN": TargetSpec({}, _simple("RETURN")),
    "LOG": TargetSpec({"--log-level": 1, "--log-prefix": 1}, _simple("LOG")),
    "NOTRACK": TargetSpec({}, _simple("NOTRACK")),
    "CT": TargetSpec({"--notrack": 0}, _simple("CT")),
    "REJECT": TargetSpec({"--reject-with": 1}, _reject),
    "DNAT": TargetSpec({"--to-destination": 1, "--random": 0, "--persistent": 0}, _nat("DNAT")),
    "SNAT": TargetSpec(
        {"--to-source": 1, "--random": 0, "--random-fully": 0, "--persistent": 0}, _nat("SNAT")
    ),
    "MASQUERADE": TargetSpec({"--to-ports": 1, "--random": 0, "--random-fully": 0}, _masquerade),
    "REDIRECT": TargetSpec({"--to-ports": 1, "--random": 0}, _redirect),
    "MARK": TargetSpec(
        {"--set-xmark": 1, "--set-mark": 1, "--and-mark": 1, "--or-mark": 1, "--xor-mark": 1}, _mark_target
    ),
    "CONNMARK": TargetSpec(
        {
            "--set-xmark": 1,
            "--set-mark": 1,
            "--and-mark": 1,
            "--or-mark": 1,
            "--xor-mark": 1,
            "--save-mark": 0,
            "--restore-mark": 0,
            "--nfmask": 1,
            "--ctmask": 1,
            "--mask": 1,
        },
        _connmark,
    ),
}

#: Targets valid only in some tables (the kernel refuses them elsewhere).
TABLE_ONLY = {
    "DNAT": "nat",
    "SNAT": "nat",
    "MASQUERADE": "nat",
    "REDIRECT": "nat",
    "NOTRACK": "raw",
    "CT": "raw",
    # ipt_REJECT.c / ip6t_REJECT.c register the target with .table = "filter".
    "REJECT": "filter",
}

#: ``-p`` protocols a NAT port needs: iptables' DNAT/SNAT/MASQUERADE/REDIRECT extensions refuse
#: others with "Need TCP, UDP, SCTP or DCCP with port specification". IPv4 also takes ICMP (its
#: id is the "port"), and neither family looks at ``!`` (``! -p tcp ... :2000`` loads), as
#: iptables-restore 1.8.9 (nf_tables and legacy) shows.
NAT_PORT_PROTOCOLS = {4: frozenset({6, 17, 132, 33, 1}), 6: frozenset({6, 17, 132, 33})}


#: ``-p`` names to protocol numbers (/etc/protocols), for :func:`check_protocol`.
_PROTO_NUMBER = {
    "tcp": 6, "udp": 17, "sctp": 132, "dccp": 33, "icmp": 1, "icmpv6": 58, "ipv6-icmp": 58,
    "udplite": 136, "esp": 50, "ah": 51, "gre": 47, "mh": 135,
}  # fmt: skip


def check_protocol(target: Target | None, proto_text: str | None, negated: bool, version: int) -> None:
    """Refuse a target whose options need a ``-p`` protocol the rule does not give.

    Args:
        proto_text: the rule's ``-p`` value as parsed (a lower-case name or a number), or
            ``None`` without ``-p``; ``all`` and ``0`` are no protocol.
        negated: whether it is ``! -p``.

    Raises:
        NetfilterError: ``--reject-with tcp-reset`` without ``-p tcp`` (or with ``! -p tcp``:
            ``reject_tg_check`` in ipt_REJECT.c and ip6t_REJECT.c returns ``-EINVAL``), or a
            NAT port without a protocol of :data:`NAT_PORT_PROTOCOLS` (iptables' own check).
    """
    number = int(proto_text) if proto_text and proto_text.isdigit() else None
    proto = _PROTO_NUMBER.get(proto_text or "", number) or None  # ``-p all`` / ``-p 0``: None
    if isinstance(target, Reject) and target.with_ == "tcp-reset" and (proto != 6 or negated):
        raise NetfilterError(
            f"--reject-with tcp-reset needs -p tcp (the kernel refuses it for "
            f"{'! -p' if negated else '-p'} {proto_text or 'all'}); "
            "add -p tcp or use an ICMP reject type"
        )
    has_port = (isinstance(target, Nat) and target.port is not None) or (
        isinstance(target, (Masquerade, Redirect)) and target.to_ports is not None
    )
    if has_port and proto not in NAT_PORT_PROTOCOLS[version]:
        raise NetfilterError(
            f"{target.label if target is not None else ''}: Need TCP, UDP, SCTP or DCCP with port "
            "specification; add -p tcp (or udp, sctp, dccp) before the target"
        )
