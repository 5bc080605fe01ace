"""The netfilter hooks and what runs at each, in priority order: declared once, as data.

Each hook runs its *stages* from the lowest priority to the highest. A stage is a table (its
built-in chain named after the hook), or :data:`CONNTRACK`, the point where conntrack finds or
creates the packet's entry. Priorities are ``enum nf_ip_hook_priorities`` of
include/uapi/linux/netfilter_ipv4.h (netfilter_ipv6.h has the same values). The nat table's
priority says which end of the flow it translates: ``NF_IP_PRI_NAT_DST`` (before routing, at
PREROUTING and OUTPUT) the destination, ``NF_IP_PRI_NAT_SRC`` (at INPUT and POSTROUTING) the
source. Conntrack's confirmation (``NF_IP_PRI_CONNTRACK_CONFIRM``, last at INPUT and
POSTROUTING) is where a walk ends, so it is not a stage here.

The packet path (:mod:`emulation.netfilter.path`), a REJECT's answer
(:mod:`emulation.netfilter.reject`) and the built-in chains of each table
(:data:`~emulation.netfilter.rules.BUILTIN_CHAINS`) all read this one table.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = [
    "CONNTRACK",
    "HOOK_PRIORITIES",
    "NAT",
    "PRIORITY",
    "SOURCE_NAT_HOOKS",
    "STAGES",
    "Hook",
    "hooks_of",
]


class Hook(StrEnum):
    """The five IPv4/IPv6 hooks, in ``enum nf_inet_hooks`` order (``NF_INET_PRE_ROUTING`` = 0 ...)."""

    PREROUTING = "PREROUTING"
    INPUT = "INPUT"
    FORWARD = "FORWARD"
    OUTPUT = "OUTPUT"
    POSTROUTING = "POSTROUTING"


#: The conntrack stage (``nf_conntrack_in``): not a table.
CONNTRACK: Final = "conntrack"
#: The nat table's name (its stage translates instead of walking, for a flow already set up).
NAT: Final = "nat"

#: ``enum nf_ip_hook_priorities`` (include/uapi/linux/netfilter_ipv4.h).
PRIORITY: Final = {
    "NF_IP_PRI_RAW": -300,
    "NF_IP_PRI_CONNTRACK": -200,
    "NF_IP_PRI_MANGLE": -150,
    "NF_IP_PRI_NAT_DST": -100,
    "NF_IP_PRI_FILTER": 0,
    "NF_IP_PRI_SECURITY": 50,
    "NF_IP_PRI_NAT_SRC": 100,
}
_P = PRIORITY

#: Per hook, each stage with its priority, as the tables register them (iptable_raw.c,
#: nf_conntrack_proto.c, iptable_mangle.c, iptable_nat.c, iptable_filter.c, iptable_security.c).
HOOK_PRIORITIES: Final[dict[Hook, tuple[tuple[str, int], ...]]] = {
    Hook.PREROUTING: (
        ("raw", _P["NF_IP_PRI_RAW"]),
        (CONNTRACK, _P["NF_IP_PRI_CONNTRACK"]),
        ("mangle", _P["NF_IP_PRI_MANGLE"]),
        (NAT, _P["NF_IP_PRI_NAT_DST"]),
    ),
    Hook.INPUT: (
        ("mangle", _P["NF_IP_PRI_MANGLE"]),
        ("filter", _P["NF_IP_PRI_FILTER"]),
        ("security", _P["NF_IP_PRI_SECURITY"]),
        (NAT, _P["NF_IP_PRI_NAT_SRC"]),
    ),
    Hook.FORWARD: (
        ("mangle", _P["NF_IP_PRI_MANGLE"]),
        ("filter", _P["NF_IP_PRI_FILTER"]),
        ("security", _P["NF_IP_PRI_SECURITY"]),
    ),
    Hook.OUTPUT: (
        ("raw", _P["NF_IP_PRI_RAW"]),
        (CONNTRACK, _P["NF_IP_PRI_CONNTRACK"]),
        ("mangle", _P["NF_IP_PRI_MANGLE"]),
        (NAT, _P["NF_IP_PRI_NAT_DST"]),
        ("filter", _P["NF_IP_PRI_FILTER"]),
        ("security", _P["NF_IP_PRI_SECURITY"]),
    ),
    Hook.POSTROUTING: (
        ("mangle", _P["NF_IP_PRI_MANGLE"]),
        (NAT, _P["NF_IP_PRI_NAT_SRC"]),
    ),
}

#: Per hook, its stages in the order they run (by priority).
STAGES: Final[dict[Hook, tuple[str, ...]]] = {
    hook: tuple(name for name, _ in sorted(stages, key=lambda s: s[1]))
    for hook, stages in HOOK_PRIORITIES.items()
}

#: Hooks where nat maps the source (``NF_IP_PRI_NAT_SRC``); at the others it maps the destination.
SOURCE_NAT_HOOKS: Final = frozenset(
    hook for hook, stages in HOOK_PRIORITIES.items() for name, p in stages if name == NAT and p > 0
)


def hooks_of(table: str) -> tuple[Hook, ...]:
    """The hooks ``table`` has a built-in chain at, in hook order (``raw``: PREROUTING, OUTPUT)."""
    return tuple(hook for hook in Hook if table in STAGES[hook])
