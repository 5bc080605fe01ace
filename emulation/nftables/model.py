"""The objects of an nftables ruleset, as frozen values: tables, chains, rules, sets and maps.

Theory of operation: a :class:`Ruleset` is immutable; a transaction (:func:`~.ruleset.apply`)
builds a new one from a mutable working copy and shares nothing mutable with the old one, so
a failed transaction leaves the caller's ruleset as it was (as ``nf_tables_api.c`` aborts a
whole batch). Chains are addressed by ``(family, table, chain)``; a rule by its chain and
its ``handle``, numbered per table from 1 in creation order as the kernel numbers them
(``nf_tables_alloc_handle``). Values are kept typed (:mod:`.types`) so that listing prints
them as ``nft list ruleset`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from emulation.errors import InputError
from emulation.nftables.exprs import Stmt
from emulation.nftables.types import Datum, Key

__all__ = [
    "Chain",
    "ChainType",
    "Element",
    "Family",
    "NftHook",
    "NftablesError",
    "Policy",
    "Rule",
    "Ruleset",
    "SetFlag",
    "Table",
    "TableSet",
]


class NftablesError(InputError):
    """Rejected nft input (``nft -f``) or an operation the kernel would refuse."""


class Family(StrEnum):
    """Table families this model evaluates (``NFPROTO_IPV4``, ``NFPROTO_IPV6``, ``NFPROTO_INET``)."""

    IP = "ip"
    IP6 = "ip6"
    INET = "inet"


class ChainType(StrEnum):
    """Base chain types (``nft_chain_filter``, ``nft_chain_nat``, ``nft_chain_route``)."""

    FILTER = "filter"
    NAT = "nat"
    ROUTE = "route"


class NftHook(StrEnum):
    """The hooks a base chain of the ip, ip6 and inet families can attach to."""

    PREROUTING = "prerouting"
    INPUT = "input"
    FORWARD = "forward"
    OUTPUT = "output"
    POSTROUTING = "postrouting"


class Policy(StrEnum):
    """A base chain's policy."""

    ACCEPT = "accept"
    DROP = "drop"


class SetFlag(StrEnum):
    """Set flags (``NFT_SET_*``), in the order nft lists them (``set_print_declaration``)."""

    CONSTANT = "constant"
    INTERVAL = "interval"
    TIMEOUT = "timeout"
    DYNAMIC = "dynamic"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    """One rule: its statements in order, its comment and its counter's starting values.

    Attributes:
        handle: the kernel's rule handle (per table, from 1).
        stmts: the statements, left to right.
        comment: the rule's ``comment "..."`` or ``None``.
        line: the input line it was created from (0 when not known).
    """

    handle: int
    stmts: tuple[Stmt, ...]
    comment: str | None = None
    line: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Chain:
    """A chain; a base chain has ``type``, ``hook``, ``priority`` (an integer) and ``policy``."""

    name: str
    rules: tuple[Rule, ...] = ()
    type: ChainType | None = None
    hook: NftHook | None = None
    priority: int = 0
    policy: Policy = Policy.ACCEPT
    comment: str | None = None

    @property
    def is_base(self) -> bool:
        """Whether the chain is attached to a hook."""
        return self.hook is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Element:
    """One set or map element: its key (one :data:`Key` part per concatenated type), its data
    (a map's value, ``None`` in a set), its comment and, for a timeout set, when it expires
    (seconds on the model's clock, ``None`` for never)."""

    key: tuple[Key, ...]
    data: Datum | None = None
    comment: str | None = None
    expires_s: float | None = None
    packets: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class TableSet:
    """A named set, or a map when ``data_type`` is given (``"verdict"`` for a verdict map).

    Attributes:
        key_types: the concatenated key types (``("ipv4_addr", "inet_proto", "inet_service")``).
        data_type: a map's value type(s), ``.``-joined as written, or ``None`` for a set.
        flags: ``interval``, ``timeout``, ``dynamic``, ``constant``.
        timeout_s: the default element timeout in seconds (``None``: none).
        size: the declared maximum number of elements (``None``: none declared).
        elements: the elements in insertion order.
        counter: every element has a counter (the set's ``counter`` statement).
    """

    name: str
    key_types: tuple[str, ...]
    data_type: str | None = None
    flags: frozenset[SetFlag] = frozenset()
    timeout_s: float | None = None
    size: int | None = None
    comment: str | None = None
    elements: tuple[Element, ...] = ()
    counter: bool = False

    @property
    def is_map(self) -> bool:
        """Whether it is a map (it has a data type)."""
        return self.data_type is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Table:
    """A table: its family, name, comment, sets and chains in creation order (dicts keep it)."""

    family: Family
    name: str
    comment: str | None = None
    sets: dict[str, TableSet] = field(default_factory=dict)
    chains: dict[str, Chain] = field(default_factory=dict)
    next_handle: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Ruleset:
    """Every table, by ``(family, name)``, in creation order."""

    tables: dict[tuple[Family, str], Table] = field(default_factory=dict)
