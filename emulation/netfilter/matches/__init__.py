"""Match modules (``-m NAME ...``) and the basic ``-s -d -i -o -p`` matches, as data.

Each match is a frozen value with ``test(ctx, uid) -> True | False | None`` (``None`` is
"unknown": the emulator cannot tell, see :class:`UnknownMatch`), ``compile(uid)`` (the same
test as a closure) and ``save_args()``, its options in the canonical order ``iptables-save``
prints them. Kernel sources of each behaviour are named in the class docstrings
(``net/netfilter/xt_*.c``). The submodules hold one family each; this package re-exports them.
"""

from emulation.netfilter.matches.annotations import Comment, Nfacct, UnknownMatch
from emulation.netfilter.matches.base import (
    PROBABILITY_SCALE,
    PROTO_NUMBERS,
    Match,
    Opt,
    Pred,
    parse_int,
    parse_mark,
    parse_port_range,
)
from emulation.netfilter.matches.basic import AddressMatch, InterfaceMatch, ProtoMatch
from emulation.netfilter.matches.conntrack import CT_STATES, Conntrack
from emulation.netfilter.matches.header import Multiport, Ports
from emulation.netfilter.matches.icmp import Icmp
from emulation.netfilter.matches.meta import ADDR_TYPES, AddrType, Mark, SetMatch
from emulation.netfilter.matches.modules import MODULES, OPTION_ALIASES, ModuleSpec
from emulation.netfilter.matches.stateful import Recent, Statistic

__all__ = [
    "ADDR_TYPES",
    "CT_STATES",
    "MODULES",
    "OPTION_ALIASES",
    "PROBABILITY_SCALE",
    "PROTO_NUMBERS",
    "AddrType",
    "AddressMatch",
    "Comment",
    "Conntrack",
    "Icmp",
    "InterfaceMatch",
    "Mark",
    "Match",
    "ModuleSpec",
    "Multiport",
    "Nfacct",
    "Opt",
    "Ports",
    "Pred",
    "ProtoMatch",
    "Recent",
    "SetMatch",
    "Statistic",
    "UnknownMatch",
    "parse_int",
    "parse_mark",
    "parse_port_range",
]
