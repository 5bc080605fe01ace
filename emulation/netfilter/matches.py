"""Match modules (``-m NAME ...``) and the basic ``-s -d -i -o -p`` matches, as data.

Each match is a frozen value with ``test(ctx, uid) -> True | False | None`` (``None`` is
"unknown": the emulator cannot tell, see :class:`UnknownMatch`) and ``save_args()``, its
options in the canonical order ``iptables-save`` prints them. Kernel sources of each
behaviour are named in the class docstrings (``net/netfilter/xt_*.c``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from emulation.addr import Cidr, parse_address, parse_cidr
from emulation.errors import NetfilterError
from emulation.netfilter.context import Ctx, RecentEntry
from emulation.netfilter.tokens import quote

__all__ = [
    "MODULES",
    "AddrType",
    "AddressMatch",
    "Comment",
    "Conntrack",
    "InterfaceMatch",
    "Mark",
    "Match",
    "Multiport",
    "Nfacct",
    "Opt",
    "Ports",
    "ProtoMatch",
    "Recent",
    "SetMatch",
    "Statistic",
    "UnknownMatch",
]

Opt = tuple[str, bool, str | None]  # (option, negated, value)
PROTO_NUMBERS = {"icmp": 1, "tcp": 6, "udp": 17, "sctp": 132, "icmpv6": 58, "ipv6-icmp": 58}
#: Userspace stores a probability as ``lround(p * 2**31)``; the kernel matches when
#: ``(get_random_u32() & 0x7FFFFFFF) < that`` (xt_statistic.c), i.e. with probability n / 2**31.
PROBABILITY_SCALE = 0x80000000


class Match:
    """Base of every match: ``module`` name (``""`` for basic matches)."""

    module: ClassVar[str] = ""

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        """Whether the packet in ``ctx`` matches (``None``: unknown)."""
        raise NotImplementedError

    def save_args(self) -> list[str]:
        """The options after ``-m module`` (or the basic option itself), canonical and quoted."""
        raise NotImplementedError


def _neg(flag: bool) -> list[str]:
    return ["!"] if flag else []


def parse_port_range(text: str) -> tuple[int, int]:
    """``"80"`` -> (80, 80); ``"1000:2000"`` -> (1000, 2000); ``":5"``/``"5:"`` open ends."""
    lo_s, sep, hi_s = text.partition(":")
    try:
        lo = int(lo_s) if lo_s else 0
        hi = (int(hi_s) if hi_s else 65535) if sep else lo
    except ValueError:
        raise NetfilterError(f"invalid port {text!r}; expected a number or a range like 1000:2000") from None
    if not (0 <= lo <= 65535 and 0 <= hi <= 65535) or lo > hi:
        raise NetfilterError(f"invalid port range {text!r}")
    return lo, hi


def _port_text(r: tuple[int, int]) -> str:
    return str(r[0]) if r[0] == r[1] else f"{r[0]}:{r[1]}"


def parse_int(text: str, what: str) -> int:
    """Parse a decimal or ``0x`` hex integer, naming ``what`` in the error."""
    try:
        return int(text, 0)
    except ValueError:
        raise NetfilterError(f"invalid {what} {text!r}; expected a number") from None


def parse_mark(text: str, default_mask: int = 0xFFFFFFFF) -> tuple[int, int]:
    """``"0x4000/0x4000"`` -> (0x4000, 0x4000); without a mask, ``default_mask``."""
    v, sep, m = text.partition("/")
    value, mask = parse_int(v, "mark"), (parse_int(m, "mask") if sep else default_mask)
    if not (0 <= value <= 0xFFFFFFFF and 0 <= mask <= 0xFFFFFFFF):
        raise NetfilterError(f"mark {text!r} does not fit in 32 bits")
    return value, mask


# --- basic matches (ipt_ip in net/ipv4/netfilter/ip_tables.c: ip_packet_match) ---------------


@dataclass(frozen=True, slots=True)
class AddressMatch(Match):
    """``[!] -s CIDR`` / ``[!] -d CIDR``: prefix containment of the current address."""

    side: str  # "s" or "d"
    cidr: Cidr
    negated: bool = False

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        value = ctx.src if self.side == "s" else ctx.dst
        return self.cidr.contains(ctx.version, value) != self.negated

    def save_args(self) -> list[str]:
        return [*_neg(self.negated), f"-{self.side}", str(self.cidr)]


@dataclass(frozen=True, slots=True)
class InterfaceMatch(Match):
    """``[!] -i NAME`` / ``[!] -o NAME``; a trailing ``+`` matches any name with that prefix."""

    side: str  # "i" or "o"
    name: str
    negated: bool = False

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        dev = ctx.iif if self.side == "i" else ctx.oif
        if dev is None:
            # No such interface on this hook (e.g. -i in OUTPUT): ip_tables compares with "".
            hit = self.name == "+"
        elif self.name.endswith("+"):
            hit = dev.startswith(self.name[:-1])
        else:
            hit = dev == self.name
        return hit != self.negated

    def save_args(self) -> list[str]:
        return [*_neg(self.negated), f"-{self.side}", self.name]


@dataclass(frozen=True, slots=True)
class ProtoMatch(Match):
    """``[!] -p PROTO`` (name or number; ``all``/``0`` matches every protocol)."""

    proto: str
    negated: bool = False

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if self.proto in ("all", "0"):
            hit = True
        else:
            want = PROTO_NUMBERS.get(self.proto)
            have = PROTO_NUMBERS[ctx.proto if ctx.proto != "icmp" or ctx.version == 4 else "icmpv6"]
            hit = (want if want is not None else int(self.proto)) == have
        return hit != self.negated

    def save_args(self) -> list[str]:
        return [*_neg(self.negated), "-p", self.proto]


# --- match modules ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ports(Match):
    """``-m tcp|udp|sctp [!] --sport R [!] --dport R`` (xt_tcpudp.c, xt_sctp.c).

    ``--tcp-flags``/``--syn`` is modelled from :attr:`Packet.syn`: a SYN packet carries only
    SYN, any later packet only ACK.
    """

    proto: str
    sport: tuple[int, int] | None = None
    sport_neg: bool = False
    dport: tuple[int, int] | None = None
    dport_neg: bool = False
    flags: tuple[frozenset[str], frozenset[str]] | None = None
    flags_neg: bool = False

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if ctx.proto != self.proto:
            return False
        if self.sport is not None and (self.sport[0] <= ctx.sport <= self.sport[1]) == self.sport_neg:
            return False
        if self.dport is not None and (self.dport[0] <= ctx.dport <= self.dport[1]) == self.dport_neg:
            return False
        if self.flags is not None:
            have = frozenset({"SYN"} if ctx.syn else {"ACK"})
            mask, comp = self.flags
            if ((have & mask) == comp) == self.flags_neg:
                return False
        return True

    def save_args(self) -> list[str]:
        out: list[str] = []
        if self.sport is not None:
            out += [*_neg(self.sport_neg), "--sport", _port_text(self.sport)]
        if self.dport is not None:
            out += [*_neg(self.dport_neg), "--dport", _port_text(self.dport)]
        if self.flags is not None:
            order = ("FIN", "SYN", "RST", "PSH", "ACK", "URG")
            mask, comp = (",".join(f for f in order if f in s) or "NONE" for s in self.flags)
            out += [*_neg(self.flags_neg), "--tcp-flags", mask, comp]
        return out

    @property
    def module(self) -> str:  # type: ignore[override]
        return self.proto


@dataclass(frozen=True, slots=True)
class Icmp(Match):
    """``-m icmp --icmp-type T``: the emulated ICMP packet is always an echo request (type 8)."""

    type_: str
    negated: bool = False
    module: ClassVar[str] = "icmp"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if ctx.proto != "icmp":
            return False
        return (self.type_ in ("any", "8", "echo-request", "128")) != self.negated

    def save_args(self) -> list[str]:
        return [*_neg(self.negated), "--icmp-type", self.type_]


@dataclass(frozen=True, slots=True)
class Multiport(Match):
    """``-m multiport [!] --sports|--dports|--ports LIST`` (xt_multiport.c, up to 15 ports)."""

    which: str  # "sports", "dports" or "ports"
    ranges: tuple[tuple[int, int], ...]
    negated: bool = False
    module: ClassVar[str] = "multiport"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if ctx.proto not in ("tcp", "udp", "sctp"):
            return False
        ports = {"sports": (ctx.sport,), "dports": (ctx.dport,), "ports": (ctx.sport, ctx.dport)}[self.which]
        hit = any(lo <= p <= hi for p in ports for lo, hi in self.ranges)
        return hit != self.negated

    def save_args(self) -> list[str]:
        return [*_neg(self.negated), f"--{self.which}", ",".join(_port_text(r) for r in self.ranges)]


@dataclass(frozen=True, slots=True)
class Comment(Match):
    """``-m comment --comment TEXT``: always matches (xt_comment.c)."""

    text: str
    module: ClassVar[str] = "comment"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        return True

    def save_args(self) -> list[str]:
        return ["--comment", quote(self.text) if self.text else '""']


@dataclass(frozen=True, slots=True)
class Mark(Match):
    """``-m mark [!] --mark V[/M]``: ``(nfmark & M) == V`` (xt_mark.c)."""

    value: int
    mask: int = 0xFFFFFFFF
    negated: bool = False
    module: ClassVar[str] = "mark"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        return ((ctx.mark & self.mask) == self.value) != self.negated

    def save_args(self) -> list[str]:
        text = f"{self.value:#x}" if self.mask == 0xFFFFFFFF else f"{self.value:#x}/{self.mask:#x}"
        return [*_neg(self.negated), "--mark", text]


@dataclass(frozen=True, slots=True)
class Statistic(Match):
    """``-m statistic --mode random --probability P`` or ``--mode nth --every N --packet P``.

    Random: ``probability`` is the kernel's 31-bit threshold ``lround(P * 2**31)``; the match
    holds with probability ``threshold / 2**31`` (:attr:`p`). The evaluator asks its oracle
    (sample: ``rng.random() < p``, which has the same distribution as the kernel's
    ``(get_random_u32() & 0x7FFFFFFF) < threshold``; enumerate: both branches).
    Nth: the counter starts at ``every - 1 - packet`` and the match holds when the increment
    wraps it to 0 (xt_statistic.c), so packet number ``packet`` (0-based) of every ``every``
    matches. The counter belongs to the rule and advances only when this match is evaluated.
    """

    mode: str
    probability: int = 0
    every: int = 0
    packet: int = 0
    negated: bool = False
    module: ClassVar[str] = "statistic"

    @property
    def p(self) -> float:
        """The exact probability the kernel applies."""
        return self.probability / PROBABILITY_SCALE

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if self.mode == "random":
            return ctx.oracle(self.p) != self.negated
        count = ctx.nth_count(uid, self.every - 1 - self.packet)
        count = 0 if count == self.every - 1 else count + 1
        ctx.nth_overlay[uid] = count
        return (count == 0) != self.negated

    def save_args(self) -> list[str]:
        if self.mode == "random":
            return ["--mode", "random", *_neg(self.negated), "--probability", f"{self.p:.11f}"]
        return [
            "--mode",
            "nth",
            *_neg(self.negated),
            "--every",
            str(self.every),
            "--packet",
            str(self.packet),
        ]


@dataclass(frozen=True, slots=True)
class Recent(Match):
    """``-m recent`` (xt_recent.c, ``recent_mt``), with the kernel's defaults.

    Lists hold at most :attr:`LIST_TOT` addresses (``ip_list_tot``; the least recently
    updated is evicted) and :attr:`PKT_LIST_TOT` time stamps each (``ip_pkt_list_tot``).
    ``--rcheck``/``--update`` match when at least ``hitcount`` (default 1) stamps are within
    ``seconds`` (all stamps without ``--seconds``); ``--update`` then adds a stamp; ``--reap``
    drops the least recently updated entry if its newest stamp is older than ``seconds``.
    """

    action: str  # set, rcheck, update, remove
    name: str = "DEFAULT"
    seconds: int = 0
    hitcount: int = 0
    reap: bool = False
    rttl: bool = False
    dest: bool = False
    mask: int | None = None  # None: all ones for the packet's family
    negated: bool = False
    module: ClassVar[str] = "recent"
    LIST_TOT: ClassVar[int] = 100
    PKT_LIST_TOT: ClassVar[int] = 20

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        addr = ctx.dst if self.dest else ctx.src
        if self.mask is not None:
            addr &= self.mask
        key = (ctx.version, addr)
        ret = self.negated
        table = ctx.recent_table(self.name, write=False)
        entry = table.get(key)
        if entry is None:
            if self.action != "set":
                return ret
            table = ctx.recent_table(self.name, write=True)
            if len(table) >= self.LIST_TOT:
                del table[next(iter(table))]
            table[key] = RecentEntry((ctx.now,))
            return not ret
        if self.action == "set":
            ret = not ret
        elif self.action == "remove":
            del ctx.recent_table(self.name, write=True)[key]
            return not ret
        else:
            since = ctx.now - self.seconds
            hits = 0
            for stamp in entry.stamps:
                if self.seconds and stamp < since:
                    continue
                hits += 1
                if not self.hitcount or hits >= self.hitcount:
                    ret = not ret
                    break
            if self.reap:
                table = ctx.recent_table(self.name, write=True)
                oldest = next(iter(table))
                if (
                    not (oldest == key and self.action == "update" and ret)
                    and table[oldest].stamps[-1] < since
                ):
                    del table[oldest]
        if self.action == "set" or (self.action == "update" and ret):
            table = ctx.recent_table(self.name, write=True)
            table.pop(key, None)
            table[key] = RecentEntry((*entry.stamps, ctx.now)[-self.PKT_LIST_TOT :])
        return ret

    def save_args(self) -> list[str]:
        out = [*_neg(self.negated), f"--{self.action}"]
        if self.seconds:
            out += ["--seconds", str(self.seconds)]
        if self.reap:
            out.append("--reap")
        if self.hitcount:
            out += ["--hitcount", str(self.hitcount)]
        if self.rttl:
            out.append("--rttl")
        out += ["--name", self.name]
        if self.mask is not None:
            from emulation.addr import format_address

            out += ["--mask", format_address(4 if self.mask <= 0xFFFFFFFF else 6, self.mask)]
        out.append("--rdest" if self.dest else "--rsource")
        return out


ADDR_TYPES = (
    "UNSPEC",
    "UNICAST",
    "LOCAL",
    "BROADCAST",
    "ANYCAST",
    "MULTICAST",
    "BLACKHOLE",
    "UNREACHABLE",
    "PROHIBIT",
    "THROW",
    "NAT",
    "XRESOLVE",
)


@dataclass(frozen=True, slots=True)
class AddrType(Match):
    """``-m addrtype [!] --src-type T,.. [!] --dst-type T,.. [--limit-iface-in|out]`` (xt_addrtype.c)."""

    src_types: frozenset[str] = frozenset()
    src_neg: bool = False
    dst_types: frozenset[str] = frozenset()
    dst_neg: bool = False
    limit_in: bool = False
    limit_out: bool = False
    module: ClassVar[str] = "addrtype"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        dev = ctx.iif if self.limit_in else ctx.oif if self.limit_out else None
        if self.src_types:
            t = ctx.node.address_type(ctx.version, ctx.src, dev)
            if (t in self.src_types) == self.src_neg:
                return False
        if self.dst_types:
            t = ctx.node.address_type(ctx.version, ctx.dst, dev)
            if (t in self.dst_types) == self.dst_neg:
                return False
        return True

    def save_args(self) -> list[str]:
        out: list[str] = []
        for types, neg, opt in (
            (self.src_types, self.src_neg, "--src-type"),
            (self.dst_types, self.dst_neg, "--dst-type"),
        ):
            if types:
                out += [*_neg(neg), opt, ",".join(t for t in ADDR_TYPES if t in types)]
        if self.limit_in:
            out.append("--limit-iface-in")
        if self.limit_out:
            out.append("--limit-iface-out")
        return out


CT_STATES = ("INVALID", "NEW", "RELATED", "ESTABLISHED", "UNTRACKED", "SNAT", "DNAT")


@dataclass(frozen=True, slots=True)
class Conntrack(Match):
    """``-m conntrack`` / ``-m state`` (xt_conntrack.c, xt_state.c).

    ``--ctstate`` tests the packet's state (INVALID, NEW, RELATED, ESTABLISHED, UNTRACKED) and
    the pseudo-states SNAT/DNAT (the entry's source / destination is translated). Also
    ``--ctorigsrc/--ctorigdst/--ctreplsrc/--ctrepldst``, ``--ctorigdstport`` etc. and ``--ctdir``.
    """

    states: frozenset[str] = frozenset()
    states_neg: bool = False
    tuple_checks: tuple[tuple[str, bool, str], ...] = ()  # (option, negated, value)
    direction: str | None = None
    legacy_state: bool = False  # written as -m state --state

    @property
    def module(self) -> str:  # type: ignore[override]
        return "state" if self.legacy_state else "conntrack"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if self.states:
            have = {ctx.ctstate}
            if ctx.ct_dnat:
                have.add("DNAT")
            if ctx.ct_snat:
                have.add("SNAT")
            if bool(have & self.states) == self.states_neg:
                return False
        for opt, neg, value in self.tuple_checks:
            tup = ctx.ct_orig if opt.startswith("--ctorig") else ctx.ct_reply
            if tup is None:
                return False
            field_ = opt.removeprefix("--ctorig").removeprefix("--ctrepl")
            idx = {"src": 0, "srcport": 1, "dst": 2, "dstport": 3}[field_]
            if field_ in ("src", "dst"):
                hit = parse_cidr(value).contains(ctx.version, tup[idx])
            else:
                lo, hi = parse_port_range(value)
                hit = lo <= tup[idx] <= hi
            if hit == neg:
                return False
        if self.direction is not None:
            return (self.direction == "REPLY") == ctx.ct_dir_reply
        return True

    def save_args(self) -> list[str]:
        states = ",".join(s for s in CT_STATES if s in self.states)
        if self.legacy_state:
            return [*_neg(self.states_neg), "--state", states]
        out: list[str] = []
        if self.states:
            out += [*_neg(self.states_neg), "--ctstate", states]
        for opt, neg, value in self.tuple_checks:
            out += [*_neg(neg), opt, value]
        if self.direction:
            out += ["--ctdir", self.direction]
        return out


@dataclass(frozen=True, slots=True)
class SetMatch(Match):
    """``-m set [!] --match-set NAME FLAGS``: ipset membership through the pluggable lookup.

    Each flag (``src``/``dst``) gives one ``(ip, port, protocol)`` key; a missing lookup or set
    is unknown. Other options (``--return-nomatch`` ...) are kept for printing only.
    """

    name: str
    flags: tuple[str, ...]
    negated: bool = False
    extra: tuple[str, ...] = ()
    module: ClassVar[str] = "set"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        if ctx.set_lookup is None:
            return None
        from emulation.addr import format_address

        keys = tuple(
            (format_address(ctx.version, ctx.src), ctx.sport, ctx.proto)
            if f == "src"
            else (format_address(ctx.version, ctx.dst), ctx.dport, ctx.proto)
            for f in self.flags
        )
        hit = ctx.set_lookup(self.name, keys)
        return None if hit is None else hit != self.negated

    def save_args(self) -> list[str]:
        return [*_neg(self.negated), "--match-set", self.name, ",".join(self.flags), *self.extra]


@dataclass(frozen=True, slots=True)
class Nfacct(Match):
    """``-m nfacct --nfacct-name NAME``: counts in the kernel's accounting object; always matches."""

    name: str
    module: ClassVar[str] = "nfacct"

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        return True

    def save_args(self) -> list[str]:
        return ["--nfacct-name", self.name]


@dataclass(frozen=True, slots=True)
class UnknownMatch(Match):
    """A match module the emulator does not model (lenient mode): always evaluates to unknown."""

    name: str
    args: tuple[str, ...] = ()

    @property
    def module(self) -> str:  # type: ignore[override]
        return self.name

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        return None

    def save_args(self) -> list[str]:
        return [a if a == "!" or a.startswith("-") else quote(a) for a in self.args]


# --- building modules from their options ---------------------------------------------------------


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
    st = _one(opts, "--ctstate")
    checks = []
    for name in _CT_TUPLE:
        o = _one(opts, name)
        if o is not None:
            value = o[2] or ""
            if name.endswith("port"):
                parse_port_range(value)
            else:
                value = str(parse_cidr(value))
            checks.append((name, o[1], value))
    ctdir = _one(opts, "--ctdir")
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
            extra += [*_neg(o[1]), o[0], *([o[2]] if o[2] is not None else [])]
    return SetMatch(name, fl, ms[1], tuple(extra))


def _nfacct(opts: list[Opt], version: int) -> Match:
    n = _one(opts, "--nfacct-name")
    if n is None or not n[2] or len(n[2]) > 31:
        raise NetfilterError("nfacct match needs --nfacct-name NAME (1 to 31 characters)")
    return Nfacct(n[2])


def _icmp(opts: list[Opt], version: int) -> Match:
    t = _one(opts, "--icmp-type") or _one(opts, "--icmpv6-type")
    if t is None:
        raise NetfilterError("icmp match needs --icmp-type TYPE")
    return Icmp(t[2] or "", t[1])


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
    "icmp": ModuleSpec({"--icmp-type": 1}, _icmp),
    "icmp6": ModuleSpec({"--icmpv6-type": 1}, _icmp),
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
