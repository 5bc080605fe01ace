"""A pure-Python model of Linux nftables (the ip, ip6 and inet families), standalone.

Public API (stable; kproxy's nftables mode consumes it):

- :func:`load(text) -> Ruleset <load>`: a ruleset from ``nft list ruleset`` output or an
  ``nft -f`` script, block form or command form.
- :func:`apply(ruleset, text) -> Ruleset <apply>`: an ``nft -f`` transaction, atomic: on
  :class:`NftablesError` (its message starts ``line N:``) nothing changes.
- :func:`list_ruleset(ruleset) -> str <list_ruleset>`: ``nft list ruleset`` in nft 1.0.6's own
  format; :func:`canonical` sorts set elements, to compare with the kernel's listing.
- :class:`Netns`: one node's nftables state; ``send(packet, rng)`` samples one outcome and
  commits it (counters, conntrack, dynamic sets); ``enumerate(packet)`` lists every outcome
  with its probability (``numgen random mod N`` branches N ways, 1/N each). Outcomes are
  :class:`emulation.netfilter.Outcome` values, so callers treat both models alike.

Both ``load`` and ``apply`` take ``strict`` (default ``True``): an expression this model does
not know is then an error; with ``strict=False`` it becomes an :class:`Unknown` statement that
evaluates to "maybe" (the outcome is marked ``uncertain``), never a silent match.
"""

from emulation.nftables.exprs import Unknown
from emulation.nftables.listing import canonical, list_ruleset
from emulation.nftables.model import (
    Chain,
    ChainType,
    Element,
    Family,
    NftablesError,
    NftHook,
    Policy,
    Rule,
    Ruleset,
    SetFlag,
    Table,
    TableSet,
)
from emulation.nftables.netns import Netns
from emulation.nftables.ruleset import apply, load
from emulation.nftables.types import Verdict, VerdictKind

__all__ = [
    "Chain",
    "ChainType",
    "Element",
    "Family",
    "Netns",
    "NftHook",
    "NftablesError",
    "Policy",
    "Rule",
    "Ruleset",
    "SetFlag",
    "Table",
    "TableSet",
    "Unknown",
    "Verdict",
    "VerdictKind",
    "apply",
    "canonical",
    "list_ruleset",
    "load",
]
