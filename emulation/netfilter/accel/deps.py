"""What a rule reads of a packet, for the flow cache (:mod:`emulation.netfilter.accel.flowcache`).

A path recorded for one packet is the path of every packet equal to it in the fields the
path's tests read. Always keyed: the input interface, IP version, protocol, the TCP SYN flag,
the input mark and the destination address (the chain indexes and the routing decision read
it). Besides those, each rule tested on the path adds what its matches read
(:func:`rule_deps`): the source address up to the bits that decide each prefix test, the
source port, the destination port. A rule whose result can depend on anything else
(``recent`` lists and ``nth`` counters, ipsets, an unknown match or target) is not cacheable.
"""

from __future__ import annotations

from collections.abc import Callable

from emulation.netfilter.matches import (
    AddressMatch,
    AddrType,
    Comment,
    Conntrack,
    Icmp,
    InterfaceMatch,
    Mark,
    Match,
    Multiport,
    Nfacct,
    Ports,
    ProtoMatch,
    Statistic,
)
from emulation.netfilter.rules import Rule
from emulation.netfilter.targets import UnknownTarget

__all__ = ["ALL_BITS", "DPORT", "NOTHING", "SPORT", "Deps", "Prefix", "match_deps", "rule_deps"]

#: Dependency flags beside the source prefix: the path read the source / destination port.
SPORT, DPORT = 1, 2
#: ``(source bits, flags, source prefixes)`` a rule reads: the leading bits of the source it
#: needs whatever the prefixes, the port flags, and the ``-s`` prefixes it compares the
#: source with as ``(version, network, prefix length)`` (see the recorder's ``rule``).
#: ``None``: its result depends on state. Only numbers inside, so the garbage collector
#: stops tracking these tuples (rules made after a load are not frozen).
Prefix = tuple[int, int, int]
Deps = tuple[int, int, tuple[Prefix, ...]] | None
ALL_BITS = 128  # "every bit of the source" for either family (clamped per family)

#: What a rule reads when it reads no more than the always-keyed fields (one object: the
#: walks skip telling the recorder about such rules).
NOTHING: Deps = (0, 0, ())
_PORT_DEPS: tuple[Deps, ...] = ((0, 0, ()), (0, SPORT, ()), (0, DPORT, ()), (0, SPORT | DPORT, ()))
_MULTIPORT = {"sports": _PORT_DEPS[SPORT], "dports": _PORT_DEPS[DPORT], "ports": _PORT_DEPS[SPORT | DPORT]}
_WHOLE_SOURCE: Deps = (ALL_BITS, 0, ())
_WHOLE_TUPLE: Deps = (ALL_BITS, SPORT | DPORT, ())


def _address(m: Match) -> Deps:
    assert isinstance(m, AddressMatch)
    c = m.cidr
    return (0, 0, ((c.version, c.network, c.prefix),)) if m.side == "s" and c.prefix else NOTHING


def _ports(m: Match) -> Deps:
    assert isinstance(m, Ports)
    return _PORT_DEPS[(SPORT if m.sport is not None else 0) | (DPORT if m.dport is not None else 0)]


def _multiport(m: Match) -> Deps:
    assert isinstance(m, Multiport)
    return _MULTIPORT[m.which]


def _addrtype(m: Match) -> Deps:
    assert isinstance(m, AddrType)
    return _WHOLE_SOURCE if m.src_types else NOTHING


def _conntrack(m: Match) -> Deps:
    assert isinstance(m, Conntrack)
    return _WHOLE_TUPLE if m.tuple_checks else NOTHING  # --ctorig*/--ctrepl*: the packet's tuple


def _statistic(m: Match) -> Deps:
    assert isinstance(m, Statistic)
    return NOTHING if m.mode == "random" else None  # nth counts packets: state


def _nothing(m: Match) -> Deps:
    return NOTHING


#: By match class; a class not listed (recent, set, unknown matches) is state: not cacheable.
_BY_CLASS: dict[type, Callable[[Match], Deps]] = {
    AddressMatch: _address,
    Ports: _ports,
    Multiport: _multiport,
    AddrType: _addrtype,
    Conntrack: _conntrack,
    Statistic: _statistic,
    Comment: _nothing,
    Nfacct: _nothing,
    Mark: _nothing,
    ProtoMatch: _nothing,
    InterfaceMatch: _nothing,
    Icmp: _nothing,
}


def match_deps(m: Match) -> Deps:
    """What ``m`` reads of the packet beside the always-keyed fields; ``None`` if not a pure function.

    Matches on fields the cache always keys (destination, protocol, interfaces, mark), on
    values the path itself decides (conntrack state of a new flow, the output interface), and
    annotations read nothing extra. ``recent``, ``set``, ``statistic --mode nth`` and unknown
    matches depend on state.
    """
    f = _BY_CLASS.get(type(m))
    return None if f is None else f(m)


def rule_deps(rule: Rule) -> Deps:
    """The union of what the rule's matches read, or ``None`` when the rule is not cacheable."""
    if type(rule.target) is UnknownTarget:
        return None
    out = NOTHING
    for matches in (rule.basic, rule.matches):
        for m in matches:
            f = _BY_CLASS.get(type(m))
            if f is None:
                return None
            d = f(m)
            if d is None:
                return None
            if d is not NOTHING:
                out = d if out is NOTHING else (max(out[0], d[0]), out[1] | d[1], out[2] + d[2])  # type: ignore[index]
    return out
