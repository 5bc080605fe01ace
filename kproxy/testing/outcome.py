"""One outcome type for every mode: verdict, endpoints with probabilities, masquerade, trace.

Theory of operation: each mode adapter (:mod:`kproxy.testing.modes`) answers "what happens to
the first packet of this connection?" with an :class:`Outcome`. Probabilities are exact
:class:`~fractions.Fraction` values where the mode can give them (the userspace balancer's
share over a full rotation), floats where they come from an enumeration of rule probabilities
(kube-proxy writes ``--probability`` with ten decimal digits, so they are exact up to
:data:`PROBABILITY_TOLERANCE`), and estimates when the mode was *sampled* over
``samples`` connections (then :func:`probabilities_agree` allows a stated statistical bound).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction

from kproxy.errors import InvalidArgument

__all__ = [
    "PROBABILITY_TOLERANCE",
    "SAMPLING_Z",
    "EndpointShares",
    "Outcome",
    "Verdict",
    "probabilities_agree",
    "sampling_bound",
]

#: How far an enumerated probability may be from the exact one: kube-proxy prints
#: ``--probability`` with 10 decimals, and a chain of n rules multiplies n such roundings.
PROBABILITY_TOLERANCE = 1e-8
#: Standard deviations allowed for a sampled share (two-sided; a false alarm has probability
#: below 1e-5 per endpoint).
SAMPLING_Z = 4.5


class Verdict(StrEnum):
    """What happened to the packet."""

    ACCEPT = "ACCEPT"
    DROP = "DROP"
    REJECT = "REJECT"


class EndpointShares(Mapping[str, Fraction | float]):
    """A frozen, hashable mapping ``{"ip:port": probability}`` (``[ip6]:port`` for IPv6), sorted.

    Raises:
        InvalidArgument: a probability outside 0..1 or not a number.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Fraction | float] | None = None) -> None:
        pairs = sorted((items or {}).items())
        for address, p in pairs:
            if isinstance(p, bool) or not isinstance(p, Fraction | float | int) or not 0 <= p <= 1 + 1e-9:
                raise InvalidArgument(f"probability of {address} must be in 0..1, got {p!r}")
        self._items: tuple[tuple[str, Fraction | float], ...] = tuple(pairs)

    def __getitem__(self, key: str) -> Fraction | float:
        for address, p in self._items:
            if address == key:
                return p
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (a for a, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{a}: {_fmt(p)}" for a, p in self._items) + "}"


def _fmt(p: Fraction | float) -> str:
    return str(p) if isinstance(p, Fraction) else f"{p:.10g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What one mode does with the first packet of a connection.

    Attributes:
        mode: the mode's name (``userspace``, ``iptables`` ...).
        verdict: ACCEPT (delivered, proxied or routed on), DROP or REJECT (refused).
        endpoints: where accepted connections go, with their probabilities; empty when the
            packet is not translated (delivered to the node or routed on unchanged).
        masquerade: the source is rewritten to the node's; None where the mode has no such
            notion (the userspace mode always connects from its own address).
        samples: None when ``endpoints`` are exact (computed or enumerated); the number of
            connections sampled otherwise.
        summary: one line saying why (the deciding rule, listener or table entry).
        trace: the mode's own trace, one line per step (rules matched, balancer decisions).
        uncertain: the share of connections not sent to an endpoint whose fate is uncertain (a
            match or target the emulator does not model was met on their way); 0 when known.
            Shown by :meth:`describe` (with the share not translated), not compared.
    """

    mode: str
    verdict: Verdict
    endpoints: EndpointShares = field(default_factory=EndpointShares)
    masquerade: bool | None = None
    samples: int | None = None
    summary: str = ""
    trace: tuple[str, ...] = ()
    uncertain: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "verdict", Verdict(self.verdict))
        if not isinstance(self.endpoints, EndpointShares):
            object.__setattr__(self, "endpoints", EndpointShares(self.endpoints))
        if self.samples is not None and self.samples < 1:
            raise InvalidArgument(f"samples must be None or >= 1, got samples={self.samples!r}")
        if isinstance(self.uncertain, bool) or not 0 <= self.uncertain <= 1 + 1e-9:
            raise InvalidArgument(f"uncertain must be a share in 0..1, got uncertain={self.uncertain!r}")

    @property
    def translated(self) -> bool:
        """Some connections are sent to an endpoint."""
        return bool(self.endpoints)

    def describe(self) -> list[str]:
        """The outcome as lines of text (without the trace)."""
        masq = "n/a" if self.masquerade is None else ("yes" if self.masquerade else "no")
        how = "exact" if self.samples is None else f"sampled over {self.samples} connections"
        lines = [f"verdict:    {self.verdict}", f"masquerade: {masq}", f"endpoints:  ({how})"]
        lines += [f"  {a:<30} {_fmt(p)}" for a, p in self.endpoints.items()] or ["  none (not translated)"]
        rest = 1 - float(sum(self.endpoints.values()))
        if self.uncertain > PROBABILITY_TOLERANCE:
            lines.append(f"  {'uncertain:':<30} {_fmt(self.uncertain)}")
            rest -= self.uncertain
        if self.endpoints and self.samples is None and rest > PROBABILITY_TOLERANCE:
            lines.append(f"  {'not translated:':<30} {_fmt(rest)}")
        if self.summary:
            lines.append(f"why:        {self.summary}")
        return lines


def sampling_bound(p: float, samples: int) -> float:
    """The largest distance between a share sampled over ``samples`` connections and ``p`` that
    :func:`probabilities_agree` accepts: ``SAMPLING_Z * sqrt(p(1-p)/n) + 1/n``."""
    return SAMPLING_Z * math.sqrt(max(p * (1 - p), 0.0) / samples) + 1.0 / samples


def probabilities_agree(a: Outcome, b: Outcome) -> bool:
    """Whether ``a`` and ``b`` send connections to the same endpoints in the same proportions.

    Both exact: every probability within :data:`PROBABILITY_TOLERANCE` (exactly equal for two
    Fractions). One sampled: within :func:`sampling_bound` of the exact value. Both sampled:
    within the sum of both bounds around their mean. The endpoint *sets* must be equal in every
    case (an endpoint reached with any positive probability is reached).
    """
    if set(a.endpoints) != set(b.endpoints):
        return False
    for address in a.endpoints:
        pa, pb = float(a.endpoints[address]), float(b.endpoints[address])
        if a.samples is None and b.samples is None:
            if isinstance(a.endpoints[address], Fraction) and isinstance(b.endpoints[address], Fraction):
                if a.endpoints[address] != b.endpoints[address]:
                    return False
            elif abs(pa - pb) > PROBABILITY_TOLERANCE:
                return False
        elif a.samples is None or b.samples is None:
            exact, n = (pa, b.samples) if a.samples is None else (pb, a.samples)
            assert n is not None
            if abs(pa - pb) > sampling_bound(exact, n):
                return False
        else:
            mean = (pa + pb) / 2
            assert b.samples is not None
            if abs(pa - pb) > sampling_bound(mean, a.samples) + sampling_bound(mean, b.samples):
                return False
    return True
