"""A pure-Python model of Linux netfilter / iptables (IPv4 and IPv6).

Read ``iptables-save`` text (:func:`load`), apply ``iptables-restore`` input atomically
(:func:`apply_restore`), print it back (:func:`save`), and send packets through a node's hooks
(:class:`Netns`: ``send`` samples, ``enumerate`` lists every outcome with its probability).
"""

from emulation.netfilter.context import SetLookup, TraceStep
from emulation.netfilter.evaluate import Netns, Outcome
from emulation.netfilter.parse import parse_lines, parse_rule
from emulation.netfilter.rules import Chain, Rule, Ruleset, Table
from emulation.netfilter.ruleset import Counters, apply_restore, load, save

__all__ = [
    "Chain",
    "Counters",
    "Netns",
    "Outcome",
    "Rule",
    "Ruleset",
    "SetLookup",
    "Table",
    "TraceStep",
    "apply_restore",
    "load",
    "parse_lines",
    "parse_rule",
    "save",
]
