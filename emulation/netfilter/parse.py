"""Parsing ``iptables-save`` / ``iptables-restore`` text.

:func:`parse_lines` turns the text into :class:`Line` commands (``*table``, ``:CHAIN``,
``-A``/``-I``/``-D``/``-N``/``-X``/``-F``/``-P``, ``COMMIT``), keeping line numbers; it checks
only the framing. :func:`parse_rule` turns the words of one rule into a :class:`Rule`, the way
iptables' option parser does (xshared.c ``do_parse``): an option belongs to the most recent
module that knows it, ``-p tcp --dport 80`` loads the ``tcp`` match implicitly, and ``!``
negates the next option. Strict mode refuses modules and targets the emulator does not
model; lenient mode keeps them as :class:`UnknownMatch` / :class:`UnknownTarget`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from emulation.addr import parse_cidr
from emulation.errors import NetfilterError
from emulation.netfilter.matches import (
    MODULES,
    OPTION_ALIASES,
    AddressMatch,
    InterfaceMatch,
    Match,
    Opt,
    ProtoMatch,
    UnknownMatch,
)
from emulation.netfilter.rules import Rule
from emulation.netfilter.targets import TABLE_ONLY, TARGETS, Jump, Target, UnknownTarget
from emulation.netfilter.tokens import split_words

__all__ = ["Line", "parse_lines", "parse_rule"]

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
_COUNTERS = re.compile(r"\[(\d+):(\d+)\]")
_CHAIN_NAME = re.compile(r"[^\s!]{1,28}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Line:
    """One command of a restore input.

    Attributes:
        kind: ``table``, ``chain``, ``rule`` (``-A``/``-I``/``-D``), ``new``, ``delete``,
            ``flush``, ``policy`` or ``commit``.
        number: 1-based line number; ``text`` the line itself.
        table, chain: what it applies to (``chain`` may be ``""`` for ``-F``/``-X`` of all).
        words: the rest of the words (the rule spec, or ``[policy]``).
        op: for rules, ``-A``, ``-I`` or ``-D``; ``position`` for ``-I n``/``-D n``.
        counters: ``[packets:bytes]`` given on the line.
    """

    kind: str
    number: int
    text: str
    table: str = ""
    chain: str = ""
    words: tuple[str, ...] = ()
    op: str = ""
    position: int | None = None
    counters: tuple[int, int] = (0, 0)


def _chain_arg(words: list[str], i: int, number: int, text: str) -> str:
    if i >= len(words):
        raise NetfilterError("missing chain name", line=number, text=text)
    name = words[i]
    if not _CHAIN_NAME.fullmatch(name) or name.startswith("-"):
        raise NetfilterError(
            f"invalid chain name {name!r} (1-28 characters, no spaces)", line=number, text=text
        )
    return name


def parse_lines(text: str) -> list[Line]:
    """Split restore text into commands, checking its framing.

    Raises:
        NetfilterError: a command outside ``*table ... COMMIT``, a missing ``COMMIT``, an
            unknown command or table, or an unterminated quote (naming the line).
    """
    out: list[Line] = []
    table = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            if table:
                raise NetfilterError(f"*{line[1:]} before COMMIT of table {table}", line=number, text=raw)
            table = line[1:].strip()
            if table not in ("raw", "mangle", "filter", "nat", "security"):
                raise NetfilterError(f"unknown table {table!r}", line=number, text=raw)
            out.append(Line(kind="table", number=number, text=raw, table=table))
            continue
        if not table:
            raise NetfilterError("command outside a *table ... COMMIT block", line=number, text=raw)
        if line == "COMMIT":
            out.append(Line(kind="commit", number=number, text=raw, table=table))
            table = ""
            continue
        if line.startswith(":"):
            parts = line[1:].split()
            if len(parts) not in (2, 3):
                raise NetfilterError("expected ':CHAIN POLICY [packets:bytes]'", line=number, text=raw)
            counters = (0, 0)
            if len(parts) == 3:
                m = _COUNTERS.fullmatch(parts[2])
                if not m:
                    raise NetfilterError(f"bad counters {parts[2]!r}", line=number, text=raw)
                counters = (int(m[1]), int(m[2]))
            name = _chain_arg(parts, 0, number, raw)
            out.append(
                Line(
                    kind="chain",
                    number=number,
                    text=raw,
                    table=table,
                    chain=name,
                    words=(parts[1],),
                    counters=counters,
                )
            )
            continue
        try:
            words = split_words(line)
        except NetfilterError as e:
            raise NetfilterError(str(e), line=number, text=raw) from None
        counters = (0, 0)
        if words and _COUNTERS.fullmatch(words[0]):
            m = _COUNTERS.fullmatch(words[0])
            assert m is not None
            counters = (int(m[1]), int(m[2]))
            words = words[1:]
        if not words:
            raise NetfilterError("empty command", line=number, text=raw)
        cmd = words[0]
        if cmd in ("-A", "--append", "-I", "--insert", "-D", "--delete"):
            chain = _chain_arg(words, 1, number, raw)
            rest = words[2:]
            position = None
            op = {"--append": "-A", "--insert": "-I", "--delete": "-D"}.get(cmd, cmd)
            if op in ("-I", "-D") and rest and rest[0].isdigit():
                position = int(rest[0])
                rest = rest[1:]
                if position < 1:
                    raise NetfilterError(f"rule number {position} must be at least 1", line=number, text=raw)
            out.append(
                Line(
                    kind="rule",
                    number=number,
                    text=raw,
                    table=table,
                    chain=chain,
                    words=tuple(rest),
                    op=op,
                    position=position,
                    counters=counters,
                )
            )
        elif cmd in ("-N", "--new-chain"):
            out.append(
                Line(
                    kind="new", number=number, text=raw, table=table, chain=_chain_arg(words, 1, number, raw)
                )
            )
        elif cmd in ("-X", "--delete-chain", "-F", "--flush"):
            chain = _chain_arg(words, 1, number, raw) if len(words) > 1 else ""
            kind = "delete" if cmd in ("-X", "--delete-chain") else "flush"
            out.append(Line(kind=kind, number=number, text=raw, table=table, chain=chain))
        elif cmd in ("-P", "--policy"):
            if len(words) != 3:
                raise NetfilterError("expected -P CHAIN ACCEPT|DROP", line=number, text=raw)
            out.append(
                Line(kind="policy", number=number, text=raw, table=table, chain=words[1], words=(words[2],))
            )
        else:
            raise NetfilterError(
                f"unknown command {cmd!r}; expected -A, -I, -D, -N, -X, -F, -P or COMMIT",
                line=number,
                text=raw,
            )
    if table:
        raise NetfilterError(f"table {table} is missing its COMMIT line")
    return out


@dataclass
class _Module:
    name: str
    known: bool
    opts: list[Opt]


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
    if (
        proto
        not in (
            "all",
            "tcp",
            "udp",
            "sctp",
            "icmp",
            "icmpv6",
            "ipv6-icmp",
            "udplite",
            "esp",
            "ah",
            "gre",
            "dccp",
            "mh",
        )
        and not proto.isdigit()
    ):
        raise NetfilterError(f"-p {value!r}: unknown protocol")
    return ProtoMatch(proto, neg)


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
    words = list(words)
    basic: dict[str, tuple[str, bool]] = {}
    modules: list[_Module] = []
    target_name: str | None = None
    goto = False
    target_opts: list[Opt] = []
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
            basic[kind] = (words[i + 1], neg)
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
                target_name, goto = words[i + 1], w in ("-g", "--goto")
            i += 2
            continue
        if not w.startswith("-"):
            raise NetfilterError(f"unexpected word {w!r}")
        opt = OPTION_ALIASES.get(w, w)
        # Find who owns this option: the target (after -j), the latest module knowing it, an
        # unmodelled module, or the protocol's implicit match.
        dest: list[Opt] | None = None
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
            proto = basic.get("p", ("", False))[0].lower()
            if proto in MODULES and w in MODULES[proto].options:
                mod = _Module(proto, True, [])
                modules.append(mod)
                dest, nargs = mod.opts, MODULES[proto].options[w]
        if dest is None:
            raise NetfilterError(f"unknown option {w!r}")
        if nargs < 0:  # unmodelled: take the following plain words as values
            j = i + 1
            while j < len(words) and words[j] != "!" and not words[j].startswith("-"):
                j += 1
            values = words[i + 1 : j]
            dest.append((opt, neg, " ".join(values) if values else None))
            i = j
        else:
            if i + nargs >= len(words):
                raise NetfilterError(f"option {w} needs {nargs} value(s)")
            value = " ".join(words[i + 1 : i + 1 + nargs]) if nargs else None
            dest.append((opt, neg, value))
            i += 1 + nargs
        neg = False
    if neg:
        raise NetfilterError("'!' at the end of the rule negates nothing")

    basic_matches = tuple(
        _basic_match(k, basic[k][0], basic[k][1], version) for k in ("s", "d", "i", "o", "p") if k in basic
    )
    matches: list[Match] = []
    for mod in modules:
        if mod.known:
            matches.append(MODULES[mod.name].build(mod.opts, version))
        elif strict:
            raise NetfilterError(f"match module {mod.name!r} is not modelled (strict mode)")
        else:
            args: list[str] = []
            for name, n, value in mod.opts:
                args += [*(["!"] if n else []), name, *([value] if value is not None else [])]
            matches.append(UnknownMatch(mod.name, tuple(args)))
    return Rule(
        chain=chain,
        basic=basic_matches,
        matches=tuple(matches),
        target=_build_target(target_name, goto, target_opts, table, version, strict, is_chain),
        line=line,
        counters=counters,
    )


def _build_target(
    name: str | None,
    goto: bool,
    opts: list[Opt],
    table: str,
    version: int,
    strict: bool,
    is_chain: Callable[[str], bool],
) -> Target | None:
    if name is None:
        return None
    if is_chain(name):
        if opts:
            raise NetfilterError(f"a jump to chain {name} takes no options")
        return Jump(name, goto)
    if goto:
        raise NetfilterError(f"goto to {name!r}: no such chain")
    spec = TARGETS.get(name)
    if spec is None:
        if name not in EXTENSION_TARGETS:
            raise NetfilterError(f"jump to {name!r}: no such chain in table {table} (and no such target)")
        if strict:
            raise NetfilterError(f"target {name!r} is not modelled (strict mode)")
        args: list[str] = []
        for oname, n, value in opts:
            args += [*(["!"] if n else []), oname, *([value] if value is not None else [])]
        return UnknownTarget(name, tuple(args))
    only = TABLE_ONLY.get(name)
    if only is not None and only != table:
        raise NetfilterError(f"target {name} is only valid in the {only} table, not {table}")
    return spec.build(opts, version)
