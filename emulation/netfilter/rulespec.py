"""Parsing the words of one rule (``-A CHAIN`` excluded) into a :class:`Rule`.

It follows iptables' option parser (xshared.c ``do_parse``): an option belongs to the most
recent module that knows it, ``-p tcp --dport 80`` loads the ``tcp`` match implicitly, and
``!`` negates the next option. Strict mode refuses modules and targets the emulator does not
model; lenient mode keeps them as :class:`UnknownMatch` / :class:`UnknownTarget`.

Theory of operation: parsing runs in two phases. Routing decides, word by word, which option
goes to the basic matches, to which module or to the target; it looks only at the option
words, ``!``, the words after ``-p -m -j -g`` and whether a word starts with ``-``. So it is
the same for every rule of the same *shape* (those words kept, every other word a
placeholder), and its result, a :class:`_Plan` of word positions, is cached per shape; a
ruleset of 100,000 rules has a few dozen shapes. Building then reads the values at those
positions and calls the module and target builders, whose results are cached too (identical
options give the same frozen match value, shared between rules). Errors come from the same
checks in the same order as an uncached parse, so a rule is accepted or refused, with the
same message, either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from emulation.addr import parse_cidr
from emulation.errors import NetfilterError
from emulation.netfilter.matches import (
    MODULES,
    OPTION_ALIASES,
    PROTO_NUMBERS,
    AddressMatch,
    InterfaceMatch,
    Match,
    Opt,
    ProtoMatch,
    UnknownMatch,
)
from emulation.netfilter.rules import Rule
from emulation.netfilter.target_options import TABLE_ONLY, TARGETS
from emulation.netfilter.targets import Jump, Target, UnknownTarget

__all__ = ["EXTENSION_TARGETS", "parse_rule"]

_BASIC = {
    "-s": "s",
    "--source": "s",
    "--src": "s",
    "-d": "d",
    "--destination": "d",
    "--dst": "d",
    "-i": "i",
    "--in-interface": "i",
    "-o": "o",
    "--out-interface": "o",
    "-p": "p",
    "--protocol": "p",
}
_PROTOCOLS = frozenset(
    {"all", "tcp", "udp", "sctp", "icmp", "icmpv6", "ipv6-icmp", "udplite", "esp", "ah", "gre", "dccp", "mh"}
    | {"mobility-header"}
)
#: The name iptables-save prints for a protocol given by number or alias (its
#: ``getprotobynumber``, /etc/protocols of netbase; checked with iptables-save 1.8.9 in a
#: namespace: ``-p 6`` saves as ``-p tcp``, ``-p icmpv6`` and ``-p 58`` as ``-p ipv6-icmp``,
#: ``-p mh`` as ``-p mobility-header``). The rule keeps that name, so it compares and saves as
#: the kernel's would.
_PROTO_SAVE_NAMES = {
    "1": "icmp",
    "6": "tcp",
    "17": "udp",
    "33": "dccp",
    "47": "gre",
    "50": "esp",
    "51": "ah",
    "58": "ipv6-icmp",
    "132": "sctp",
    "135": "mobility-header",
    "136": "udplite",
    "icmpv6": "ipv6-icmp",
    "mh": "mobility-header",
}
#: Target extensions iptables ships that the emulator does not model (lenient: unknown).
EXTENSION_TARGETS = frozenset(
    {
        "AUDIT",
        "CHECKSUM",
        "CLASSIFY",
        "CLUSTERIP",
        "CONNSECMARK",
        "DNPT",
        "DSCP",
        "ECN",
        "HL",
        "HMARK",
        "IDLETIMER",
        "LED",
        "NETMAP",
        "NFLOG",
        "NFQUEUE",
        "RATEEST",
        "SECMARK",
        "SET",
        "SNPT",
        "SYNPROXY",
        "TCPMSS",
        "TCPOPTSTRIP",
        "TEE",
        "TOS",
        "TPROXY",
        "TRACE",
        "TTL",
        "ULOG",
    }
)
#: Options whose next word routing reads (so the shape keeps it).
_KEEP_NEXT = frozenset({"-p", "--protocol", "-m", "--match"})
#: Options naming a target: routing reads only whether the name is a known target.
_TARGET_NEXT = frozenset({"-j", "--jump", "-g", "--goto"})
#: What a shape holds instead of a target name routing treats like a chain's.
_CHAIN_LIKE = "\0chain"
#: Shapes remembered; kube-proxy's rulesets have a few dozen, so this is only a memory bound.
_MAX_PLANS = 4096

# Where an option's value comes from: no value, one word, or several words joined by spaces.
_Where = int | tuple[int, ...] | None
_PlanOpt = tuple[str, bool, _Where]


@dataclass(frozen=True, slots=True)
class _Plan:
    """The routing of one rule shape: word positions for every value.

    ``basic`` is ``(kind, position, negated)`` in s, d, i, o, p order; ``modules`` is
    ``(name, known, options, unmodelled option or "")`` in order; ``target`` the position of the name after
    ``-j``/``-g`` (or ``None``).
    """

    basic: tuple[tuple[str, int, bool], ...]
    modules: tuple[tuple[str, bool, tuple[_PlanOpt, ...], str], ...]
    target: int | None
    goto: bool
    target_opts: tuple[_PlanOpt, ...]


_plans: dict[tuple[str | None, ...], _Plan] = {}


def _shape(words: Sequence[str]) -> tuple[str | None, ...]:
    out: list[str | None] = []
    prev = ""
    for w in words:
        if w[:1] == "-" or w == "!" or prev in _KEEP_NEXT:
            out.append(w)
        elif prev in _TARGET_NEXT:
            out.append(w if w in TARGETS else _CHAIN_LIKE)
        else:
            out.append(None)
        prev = w
    return tuple(out)


@dataclass
class _Module:
    name: str
    known: bool
    opts: list[_PlanOpt]
    unmodelled: str = ""  # an option of a modelled module that the model does not know


def _owner(
    w: str,
    words: Sequence[str],
    basic: dict[str, tuple[int, bool]],
    modules: list[_Module],
    target_name: str | None,
    target_opts: list[_PlanOpt],
) -> tuple[list[_PlanOpt], int]:
    """Who owns option ``w``, and how many values it takes (-1: the plain words that follow).

    The target (after -j), the latest module knowing it, an unmodelled module, or the
    protocol's implicit match (appended to ``modules``). Raises on an unknown option.
    """
    dest: list[_PlanOpt] | None = None
    nargs = 0
    tspec = TARGETS.get(target_name) if target_name else None
    if tspec is not None and w in tspec.options:
        dest, nargs = target_opts, tspec.options[w]
    if dest is None:
        for mod in reversed(modules):
            if mod.known and (w in MODULES[mod.name].options):
                dest, nargs = mod.opts, MODULES[mod.name].options[w]
                break
    if dest is None and target_name is not None and tspec is None:
        dest, nargs = target_opts, -1
    if dest is None:
        unknown = [m for m in modules if not m.known]
        if unknown:
            dest, nargs = unknown[-1].opts, -1
    if dest is None:
        proto = words[basic["p"][0]].lower() if "p" in basic else ""
        if proto in MODULES and w in MODULES[proto].options:
            mod = _Module(proto, True, [])
            modules.append(mod)
            dest, nargs = mod.opts, MODULES[proto].options[w]
    if dest is None and modules and modules[-1].known and w.startswith("--"):
        # An option of the last module that the model does not know (conntrack's
        # --ctstatus, say): the whole match becomes unknown (strict mode refuses it).
        mod = modules[-1]
        mod.known, mod.unmodelled = False, w
        dest, nargs = mod.opts, -1
    if dest is None:
        raise NetfilterError(f"unknown option {w!r}")
    return dest, nargs


def _route(words: Sequence[str]) -> _Plan:
    """Phase one: who owns each word (see the module docstring). Raises on bad syntax."""
    basic: dict[str, tuple[int, bool]] = {}
    modules: list[_Module] = []
    target_name: str | None = None
    target_pos: int | None = None
    goto = False
    target_opts: list[_PlanOpt] = []
    neg = False
    i = 0
    while i < len(words):
        w = words[i]
        if w == "!":
            if neg:
                raise NetfilterError("double negation '! !'")
            neg = True
            i += 1
            continue
        if w in _BASIC:
            if i + 1 >= len(words):
                raise NetfilterError(f"option {w} needs a value")
            kind = _BASIC[w]
            if kind in basic:
                raise NetfilterError(f"option -{kind} given twice")
            basic[kind] = (i + 1, neg)
            neg = False
            i += 2
            continue
        if w in ("-m", "--match", "-j", "--jump", "-g", "--goto", "-c", "--set-counters"):
            if neg:
                raise NetfilterError(f"'!' cannot negate {w}")
            if i + 1 >= len(words):
                raise NetfilterError(f"option {w} needs a value")
            if w in ("-m", "--match"):
                name = words[i + 1]
                modules.append(_Module(name, name in MODULES, []))
            elif w in ("-c", "--set-counters"):
                i += 1  # packets, then bytes
            else:
                if target_name is not None:
                    raise NetfilterError("more than one target (-j/-g)")
                target_name, target_pos, goto = words[i + 1], i + 1, w in ("-g", "--goto")
            i += 2
            continue
        if not w.startswith("-"):
            raise NetfilterError(f"unexpected word {w!r}")
        opt = OPTION_ALIASES.get(w, w)
        dest, nargs = _owner(w, words, basic, modules, target_name, target_opts)
        if nargs < 0:  # unmodelled: take the following plain words as values
            j = i + 1
            while j < len(words) and words[j] != "!" and not words[j].startswith("-"):
                j += 1
            dest.append((opt, neg, tuple(range(i + 1, j)) if j > i + 1 else None))
            i = j
        else:
            if i + nargs >= len(words):
                raise NetfilterError(f"option {w} needs {nargs} value(s)")
            where: _Where = (
                None if nargs == 0 else i + 1 if nargs == 1 else tuple(range(i + 1, i + 1 + nargs))
            )
            dest.append((opt, neg, where))
            i += 1 + nargs
        neg = False
    if neg:
        raise NetfilterError("'!' at the end of the rule negates nothing")
    return _Plan(
        basic=tuple((k, basic[k][0], basic[k][1]) for k in ("s", "d", "i", "o", "p") if k in basic),
        modules=tuple((m.name, m.known, tuple(m.opts), m.unmodelled) for m in modules),
        target=target_pos,
        goto=goto,
        target_opts=tuple(target_opts),
    )


def _values(words: Sequence[str], opts: tuple[_PlanOpt, ...]) -> tuple[Opt, ...]:
    out: list[Opt] = []
    for name, neg, where in opts:
        if where is None:
            out.append((name, neg, None))
        elif isinstance(where, int):
            out.append((name, neg, words[where]))
        else:
            out.append((name, neg, " ".join(words[p] for p in where)))
    return tuple(out)


@lru_cache(maxsize=1 << 16)
def _basic_match(kind: str, value: str, neg: bool, version: int) -> Match:
    if kind in ("s", "d"):
        cidr = parse_cidr(value)
        if cidr.version != version:
            raise NetfilterError(f"-{kind} {value}: not an IPv{version} address")
        return AddressMatch(kind, cidr, neg)
    if kind in ("i", "o"):
        if not value or len(value) > 15:
            raise NetfilterError(f"-{kind} {value!r}: interface names have 1-15 characters")
        return InterfaceMatch(kind, value, neg)
    proto = value.lower()
    if proto not in _PROTOCOLS and not proto.isdigit():
        raise NetfilterError(f"-p {value!r}: unknown protocol")
    return ProtoMatch(_PROTO_SAVE_NAMES.get(proto, proto), neg)


#: Match modules the kernel registers with a ``.proto`` (xt_tcpudp.c icmp_mt, ip6t_icmp6 in
#: ip6_tables.c): ``xt_check_match`` refuses them unless the rule has ``-p`` of that number,
#: not inverted ("only valid for protocol N"), as the real tools do (checked in a namespace).
_MATCH_PROTO = {"icmp": 1, "icmp6": 58}


def _check_match_proto(name: str, basic: tuple[Match, ...], version: int) -> None:
    want = _MATCH_PROTO[name]
    proto = next((m for m in basic if isinstance(m, ProtoMatch)), None)
    number = None
    if proto is not None and not proto.negated:
        number = PROTO_NUMBERS.get(proto.proto)
        if number is None and proto.proto.isdigit():
            number = int(proto.proto)
    if number != want:
        prefix = "ip" if version == 4 else "ip6"
        raise NetfilterError(f"{prefix}_tables: {name} match: only valid for protocol {want}")


@lru_cache(maxsize=1 << 16)
def _module(name: str, opts: tuple[Opt, ...], version: int) -> Match:
    return MODULES[name].build(list(opts), version)


@lru_cache(maxsize=1 << 16)
def _target(name: str, opts: tuple[Opt, ...], version: int) -> Target:
    return TARGETS[name].build(list(opts), version)


@lru_cache(maxsize=1 << 16)
def _jump(name: str, goto: bool) -> Jump:
    return Jump(name, goto)


def _unknown_args(opts: tuple[Opt, ...]) -> tuple[str, ...]:
    args: list[str] = []
    for name, n, value in opts:
        args += [*(["!"] if n else []), name, *([value] if value is not None else [])]
    return tuple(args)


def parse_rule(
    chain: str,
    words: list[str] | tuple[str, ...],
    *,
    table: str,
    version: int,
    strict: bool,
    is_chain: Callable[[str], bool],
    line: int = 0,
    counters: tuple[int, int] = (0, 0),
) -> Rule:
    """Build a :class:`Rule` from the words after ``-A CHAIN``.

    Args:
        is_chain: whether a user chain of that name exists in the table (a jump target).

    Raises:
        NetfilterError: bad syntax, a value out of range, an unknown option, a target used in
            the wrong table, or (strict) an unmodelled module or target. Messages do not carry
            the line; the caller adds it.
    """
    shape = _shape(words)
    plan = _plans.get(shape)
    if plan is None:
        plan = _route(words)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[shape] = plan
    basic = tuple([_basic_match(k, words[pos], neg, version) for k, pos, neg in plan.basic])
    matches: list[Match] = []
    for name, known, popts, unmodelled in plan.modules:
        opts = _values(words, popts)
        if known:
            matches.append(_module(name, opts, version))
            if name in _MATCH_PROTO:
                _check_match_proto(name, basic, version)
        elif strict and unmodelled:
            raise NetfilterError(f"option {unmodelled!r} of match {name!r} is not modelled (strict mode)")
        elif strict:
            raise NetfilterError(f"match module {name!r} is not modelled (strict mode)")
        else:
            matches.append(UnknownMatch(name, _unknown_args(opts)))
    target = None
    if plan.target is not None:
        target = _build_target(
            words[plan.target], plan.goto, _values(words, plan.target_opts), table, version, strict, is_chain
        )
    return Rule(
        chain=chain,
        basic=basic,
        matches=tuple(matches),
        target=target,
        line=line,
        counters=counters,
    )


def _build_target(
    name: str,
    goto: bool,
    opts: tuple[Opt, ...],
    table: str,
    version: int,
    strict: bool,
    is_chain: Callable[[str], bool],
) -> Target:
    if is_chain(name):
        if opts:
            raise NetfilterError(f"a jump to chain {name} takes no options")
        return _jump(name, goto)
    if goto:
        raise NetfilterError(f"goto to {name!r}: no such chain")
    if name not in TARGETS:
        if name not in EXTENSION_TARGETS:
            raise NetfilterError(f"jump to {name!r}: no such chain in table {table} (and no such target)")
        if strict:
            raise NetfilterError(f"target {name!r} is not modelled (strict mode)")
        return UnknownTarget(name, _unknown_args(opts))
    only = TABLE_ONLY.get(name)
    if only is not None and only != table:
        raise NetfilterError(f"target {name} is only valid in the {only} table, not {table}")
    return _target(name, opts, version)
