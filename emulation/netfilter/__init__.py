"""A pure-Python model of Linux netfilter / iptables (IPv4 and IPv6).

Read ``iptables-save`` text (:func:`load`), apply ``iptables-restore`` input atomically
(:func:`apply_restore`), print it back (:func:`save`), and send packets through a node's hooks
(:class:`Netns`: ``send`` samples, ``enumerate`` lists every outcome with its probability).

The reference semantics are the plain walk (:mod:`.traverse`) along the hooks in the order
:mod:`.hooks` declares (:mod:`.path`; a REJECT's answer, :mod:`.reject`); the accelerator
(:mod:`.accel`: compiled, indexed chains and the flow cache) is proven equal to it.
"""

from emulation.netfilter.context import SetLookup, TraceStep
from emulation.netfilter.hooks import Hook
from emulation.netfilter.netns import Netns
from emulation.netfilter.outcome import Outcome
from emulation.netfilter.parse import parse_lines, parse_rule
from emulation.netfilter.rules import Chain, Rule, Ruleset, Table
from emulation.netfilter.ruleset import Counters, apply_restore, load, save
from emulation.netfilter.verdicts import CtState, Delivery, Verdict

__all__ = [
    "Chain",
    "Counters",
    "CtState",
    "Delivery",
    "Hook",
    "Netns",
    "Outcome",
    "Rule",
    "Ruleset",
    "SetLookup",
    "Table",
    "TraceStep",
    "Verdict",
    "apply_restore",
    "load",
    "parse_lines",
    "parse_rule",
    "save",
]
