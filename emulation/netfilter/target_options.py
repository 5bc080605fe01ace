"""Targets built from their ``-j NAME`` options, and the checks iptables and the kernel make of them.

:data:`TARGETS` gives, per target name, its options (name -> number of values) and a builder
from the parsed options and the IP version; :data:`TABLE_ONLY` the tables a target may be used
in; :func:`check_protocol` refuses a target whose options need a ``-p`` the rule lacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from emulation.addr import parse_address
from emulation.errors import NetfilterError
from emulation.netfilter.matches import Opt, parse_mark, parse_port_range
from emulation.netfilter.targets import (
    REJECT_WITH,
    Connmark,
    MarkTarget,
    Masquerade,
    Nat,
    Redirect,
    Reject,
    Simple,
    Target,
)
from emulation.netfilter.tokens import quote

__all__ = ["NAT_PORT_PROTOCOLS", "TABLE_ONLY", "TARGETS", "TargetSpec", "check_protocol", "reject_type"]


def _split_hostport(text: str) -> tuple[str, str]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, rest.removeprefix(":")
    if text.count(":") > 1:
        return text, ""
    host, _, port = text.partition(":")
    return host, port


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
