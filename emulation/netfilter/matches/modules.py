"""Building match modules from their parsed options: the ``MODULES`` table iptables' parser consults.

``MODULES[name].options`` maps each option a module accepts to its number of values;
``MODULES[name].build(opts, ip_version)`` validates them and returns the match value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from emulation.addr import parse_address, parse_cidr
from emulation.errors import NetfilterError
from emulation.netfilter.matches.annotations import Comment, Nfacct
from emulation.netfilter.matches.base import (
    PROBABILITY_SCALE,
    Match,
    Opt,
    neg_word,
    parse_int,
    parse_mark,
    parse_port_range,
)
from emulation.netfilter.matches.conntrack import CT_STATES, Conntrack
from emulation.netfilter.matches.header import Multiport, Ports
from emulation.netfilter.matches.icmp import Icmp, parse_icmp_type
from emulation.netfilter.matches.meta import ADDR_TYPES, AddrType, Mark, SetMatch
from emulation.netfilter.matches.stateful import Recent, Statistic

__all__ = ["MODULES", "OPTION_ALIASES", "STATE_STATES", "ModuleSpec"]

#: The states ``-m state --state`` takes (libxt_state.c): ``--ctstate``'s without SNAT/DNAT.
STATE_STATES = ("INVALID", "ESTABLISHED", "NEW", "RELATED", "UNTRACKED")


@dataclass(frozen=True, slots=True)
class ModuleSpec:
    """A match module: option name -> number of values, and a builder from the options."""

    options: dict[str, int]
    build: Callable[[list[Opt], int], Match]


def _one(opts: list[Opt], name: str) -> Opt | None:
    found = [o for o in opts if o[0] == name]
    if len(found) > 1:
        raise NetfilterError(f"option {name} given twice")
    return found[0] if found else None


def _ports(proto: str) -> Callable[[list[Opt], int], Match]:
    def build(opts: list[Opt], version: int) -> Match:
        s, d = _one(opts, "--sport"), _one(opts, "--dport")
        flags = _one(opts, "--tcp-flags")
        syn = _one(opts, "--syn")
        parsed_flags = None
        flags_neg = False
        if flags is not None:
            mask_s, _, comp_s = (flags[2] or "").partition(" ")
            parsed_flags = (frozenset(mask_s.split(",")) - {"NONE"}, frozenset(comp_s.split(",")) - {"NONE"})
            parsed_flags = (
                frozenset({"FIN", "SYN", "RST", "PSH", "ACK", "URG"})
                if "ALL" in parsed_flags[0]
                else parsed_flags[0],
                parsed_flags[1],
            )
            flags_neg = flags[1]
        elif syn is not None:
            parsed_flags = (frozenset({"FIN", "SYN", "RST", "ACK"}), frozenset({"SYN"}))
            flags_neg = syn[1]
        return Ports(
            proto,
            sport=parse_port_range(s[2] or "") if s else None,
            sport_neg=bool(s and s[1]),
            dport=parse_port_range(d[2] or "") if d else None,
            dport_neg=bool(d and d[1]),
            flags=parsed_flags,
            flags_neg=flags_neg,
        )

    return build


def _multiport(opts: list[Opt], version: int) -> Match:
    alias = {
        "--source-ports": "sports",
        "--sports": "sports",
        "--destination-ports": "dports",
        "--dports": "dports",
        "--ports": "ports",
    }
    if len(opts) != 1:
        raise NetfilterError("multiport needs exactly one of --sports, --dports, --ports")
    name, neg, value = opts[0]
    ranges = tuple(parse_port_range(p) for p in (value or "").split(","))
    if len(ranges) > 15:
        raise NetfilterError(f"multiport takes at most 15 ports, got {len(ranges)}")
    return Multiport(alias[name], ranges, neg)


def _comment(opts: list[Opt], version: int) -> Match:
    c = _one(opts, "--comment")
    if c is None:
        raise NetfilterError("comment match needs --comment TEXT")
    if len(c[2] or "") > 255:
        raise NetfilterError("comment is longer than 255 characters")
    return Comment(c[2] or "")


def _mark(opts: list[Opt], version: int) -> Match:
    m = _one(opts, "--mark")
    if m is None:
        raise NetfilterError("mark match needs --mark VALUE[/MASK]")
    value, mask = parse_mark(m[2] or "")
    return Mark(value, mask, m[1])


def _statistic(opts: list[Opt], version: int) -> Match:
    mode = _one(opts, "--mode")
    if mode is None or mode[2] not in ("random", "nth"):
        raise NetfilterError("statistic match needs --mode random or --mode nth")
    prob, every, packet = _one(opts, "--probability"), _one(opts, "--every"), _one(opts, "--packet")
    if mode[2] == "random":
        if prob is None or every is not None or packet is not None:
            raise NetfilterError("--mode random takes --probability only")
        try:
            p = float(prob[2] or "")
        except ValueError:
            raise NetfilterError(f"invalid --probability {prob[2]!r}") from None
        if not 0.0 <= p <= 1.0:
            raise NetfilterError(f"--probability {p} must be within 0..1")
        return Statistic("random", probability=round(p * PROBABILITY_SCALE), negated=prob[1])
    if every is None or prob is not None:
        raise NetfilterError("--mode nth needs --every N (and optionally --packet P)")
    n = parse_int(every[2] or "", "--every")
    pk = parse_int(packet[2] or "", "--packet") if packet else 0
    if n < 1 or not 0 <= pk < n:
        raise NetfilterError(f"--every {n} --packet {pk}: need every >= 1 and 0 <= packet < every")
    return Statistic("nth", every=n, packet=pk, negated=every[1])


def _recent(opts: list[Opt], version: int) -> Match:
    actions = [o for o in opts if o[0] in ("--set", "--rcheck", "--update", "--remove")]
    if len(actions) != 1:
        raise NetfilterError("recent match needs exactly one of --set, --rcheck, --update, --remove")
    action = actions[0][0][2:]
    names = {o[0]: o for o in opts}
    seconds = parse_int(names["--seconds"][2] or "", "--seconds") if "--seconds" in names else 0
    hitcount = parse_int(names["--hitcount"][2] or "", "--hitcount") if "--hitcount" in names else 0
    reap = "--reap" in names
    if action in ("set", "remove") and (seconds or hitcount or reap or "--rttl" in names):
        raise NetfilterError(f"--{action} cannot be combined with --seconds, --hitcount, --reap or --rttl")
    if reap and not seconds:
        raise NetfilterError("--reap needs --seconds")
    if hitcount > Recent.PKT_LIST_TOT:
        raise NetfilterError(
            f"--hitcount {hitcount} exceeds the {Recent.PKT_LIST_TOT} stamps the kernel keeps"
        )
    mask = None
    if "--mask" in names:
        mversion, mask = parse_address(names["--mask"][2] or "")
        if mversion != version:
            raise NetfilterError("--mask is of the wrong IP family")
    elif version == 4:
        mask = 0xFFFFFFFF
    else:
        mask = (1 << 128) - 1
    name = names["--name"][2] if "--name" in names else "DEFAULT"
    if not name or len(name) > 199:
        raise NetfilterError("recent --name must have 1 to 199 characters")
    return Recent(
        action,
        name=name or "DEFAULT",
        seconds=seconds,
        hitcount=hitcount,
        reap=reap,
        rttl="--rttl" in names,
        dest="--rdest" in names,
        mask=mask,
        negated=actions[0][1],
    )


def _types(value: str | None) -> frozenset[str]:
    types = frozenset((value or "").upper().split(","))
    bad = types - set(ADDR_TYPES)
    if bad:
        raise NetfilterError(f"unknown address type(s) {sorted(bad)}; expected some of {ADDR_TYPES}")
    return types


def _addrtype(opts: list[Opt], version: int) -> Match:
    s, d = _one(opts, "--src-type"), _one(opts, "--dst-type")
    names = {o[0] for o in opts}
    if "--limit-iface-in" in names and "--limit-iface-out" in names:
        raise NetfilterError("--limit-iface-in and --limit-iface-out are exclusive")
    return AddrType(
        src_types=_types(s[2]) if s else frozenset(),
        src_neg=bool(s and s[1]),
        dst_types=_types(d[2]) if d else frozenset(),
        dst_neg=bool(d and d[1]),
        limit_in="--limit-iface-in" in names,
        limit_out="--limit-iface-out" in names,
    )


def _states(value: str | None) -> frozenset[str]:
    states = frozenset((value or "").upper().split(","))
    bad = states - set(CT_STATES)
    if bad:
        raise NetfilterError(f"unknown conntrack state(s) {sorted(bad)}; expected some of {CT_STATES}")
    return states


_CT_TUPLE = (
    "--ctorigsrc",
    "--ctorigdst",
    "--ctreplsrc",
    "--ctrepldst",
    "--ctorigsrcport",
    "--ctorigdstport",
    "--ctreplsrcport",
    "--ctrepldstport",
)


def _conntrack(opts: list[Opt], version: int) -> Match:
    # libxt_conntrack: conntrack_mt_check refuses a match without options, and the ctdir
    # option has no XTOPT_INVERT (REPLY is itself stored as the inverted ORIGINAL).
    if not opts:
        raise NetfilterError("conntrack: at least one option is required (e.g. --ctstate NEW)")
    st = _one(opts, "--ctstate")
    checks = []
    for name in _CT_TUPLE:
        o = _one(opts, name)
        if o is not None:
            value = o[2] or ""
            if name.endswith("port"):
                parse_port_range(value)
            else:
                cidr = parse_cidr(value)
                if cidr.version != version:
                    raise NetfilterError(f"{name} {value!r} is not an IPv{version} address or prefix")
                # iptables-save prints a host without /32 (/128)
                value = str(cidr).rpartition("/")[0] if cidr.is_host else str(cidr)
            checks.append((name, o[1], value))
    ctdir = _one(opts, "--ctdir")
    if ctdir is not None and ctdir[1]:
        other = "ORIGINAL" if ctdir[2] == "REPLY" else "REPLY"
        raise NetfilterError(f"--ctdir cannot be inverted (! --ctdir {ctdir[2]}); write --ctdir {other}")
    if ctdir is not None and ctdir[2] not in ("ORIGINAL", "REPLY"):
        raise NetfilterError(f"--ctdir {ctdir[2]!r}: expected ORIGINAL or REPLY")
    return Conntrack(
        states=_states(st[2]) if st else frozenset(),
        states_neg=bool(st and st[1]),
        tuple_checks=tuple(checks),
        direction=ctdir[2] if ctdir else None,
    )


def _state(opts: list[Opt], version: int) -> Match:
    st = _one(opts, "--state")
    if st is None:
        raise NetfilterError("state match needs --state LIST")
    # libxt_state.c state_parse_states: SNAT and DNAT are conntrack-only ("Bad state").
    bad = sorted(set((st[2] or "").upper().split(",")) - set(STATE_STATES))
    if bad:
        raise NetfilterError(f"Bad state {bad[0]!r} for -m state; expected some of {STATE_STATES}")
    return Conntrack(states=_states(st[2]), states_neg=st[1], legacy_state=True)


def _set(opts: list[Opt], version: int) -> Match:
    ms = _one(opts, "--match-set")
    if ms is None:
        raise NetfilterError("set match needs --match-set NAME src|dst[,...]")
    name, _, flags = (ms[2] or "").partition(" ")
    fl = tuple(flags.split(","))
    if not name or not flags or any(f not in ("src", "dst") for f in fl) or len(fl) > 6:
        raise NetfilterError(f"--match-set {ms[2]!r}: expected NAME and flags like src or dst,dst")
    extra: list[str] = []
    for o in opts:
        if o[0] != "--match-set":
            extra += [*neg_word(o[1]), o[0], *([o[2]] if o[2] is not None else [])]
    return SetMatch(name, fl, ms[1], tuple(extra))


def _nfacct(opts: list[Opt], version: int) -> Match:
    n = _one(opts, "--nfacct-name")
    if n is None or not n[2] or len(n[2]) > 31:
        raise NetfilterError("nfacct match needs --nfacct-name NAME (1 to 31 characters)")
    return Nfacct(n[2])


def _icmp_for(module: str, option: str, family: int) -> Callable[[list[Opt], int], Match]:
    """The builder of ``-m icmp`` (IPv4 only) or ``-m icmp6`` (IPv6 only), as iptables loads them."""

    def build(opts: list[Opt], version: int) -> Match:
        if version != family:
            raise NetfilterError(
                f"Couldn't load match `{module}' in IPv{version}; use "
                f"{'-m icmp6 --icmpv6-type' if version == 6 else '-m icmp --icmp-type'}"
            )
        t = _one(opts, option)
        if t is None or t[2] is None:
            raise NetfilterError(f"{module} match needs {option} TYPE")
        type_, codes = parse_icmp_type(t[2], version)
        return Icmp(type_, codes, t[1], version)

    return build


MODULES: dict[str, ModuleSpec] = {
    "tcp": ModuleSpec(
        {
            "--sport": 1,
            "--source-port": 1,
            "--dport": 1,
            "--destination-port": 1,
            "--tcp-flags": 2,
            "--syn": 0,
        },
        _ports("tcp"),
    ),
    "udp": ModuleSpec(
        {"--sport": 1, "--source-port": 1, "--dport": 1, "--destination-port": 1}, _ports("udp")
    ),
    "sctp": ModuleSpec(
        {"--sport": 1, "--source-port": 1, "--dport": 1, "--destination-port": 1}, _ports("sctp")
    ),
    "icmp": ModuleSpec({"--icmp-type": 1}, _icmp_for("icmp", "--icmp-type", 4)),
    "icmp6": ModuleSpec({"--icmpv6-type": 1}, _icmp_for("icmp6", "--icmpv6-type", 6)),
    "multiport": ModuleSpec(
        {"--sports": 1, "--dports": 1, "--ports": 1, "--source-ports": 1, "--destination-ports": 1},
        _multiport,
    ),
    "comment": ModuleSpec({"--comment": 1}, _comment),
    "mark": ModuleSpec({"--mark": 1}, _mark),
    "statistic": ModuleSpec({"--mode": 1, "--probability": 1, "--every": 1, "--packet": 1}, _statistic),
    "recent": ModuleSpec(
        {
            "--set": 0,
            "--rcheck": 0,
            "--update": 0,
            "--remove": 0,
            "--seconds": 1,
            "--reap": 0,
            "--hitcount": 1,
            "--rttl": 0,
            "--name": 1,
            "--rsource": 0,
            "--rdest": 0,
            "--mask": 1,
        },
        _recent,
    ),
    "addrtype": ModuleSpec(
        {"--src-type": 1, "--dst-type": 1, "--limit-iface-in": 0, "--limit-iface-out": 0}, _addrtype
    ),
    "conntrack": ModuleSpec({"--ctstate": 1, "--ctdir": 1, **dict.fromkeys(_CT_TUPLE, 1)}, _conntrack),
    "state": ModuleSpec({"--state": 1}, _state),
    "set": ModuleSpec(
        {
            "--match-set": 2,
            "--return-nomatch": 0,
            "--update-counters": 0,
            "--update-subcounters": 0,
            "--packets-eq": 1,
            "--packets-lt": 1,
            "--packets-gt": 1,
            "--bytes-eq": 1,
            "--bytes-lt": 1,
            "--bytes-gt": 1,
        },
        _set,
    ),
    "nfacct": ModuleSpec({"--nfacct-name": 1}, _nfacct),
}

# Option aliases normalised to their canonical names before building.
OPTION_ALIASES = {"--source-port": "--sport", "--destination-port": "--dport"}
