"""Do the modes forward a packet the same way? :func:`compare` answers, :func:`assert_equivalent` insists.

Theory of operation: every mode's adapter answers the packet (:mod:`kproxy.testing.modes`); the
documented differences that apply (:mod:`kproxy.testing.differences`) excuse the modes they name;
every other pair must agree on the verdict, on the endpoint set and its distribution
(:func:`~kproxy.testing.outcome.probabilities_agree`: exact for computed and enumerated modes,
within a stated statistical bound for sampled ones), and on masquerade where both modes have one.
A disagreement is reported with every mode's outcome side by side and every mode's trace.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from emulation.errors import NetfilterError
from kproxy.errors import InvalidArgument, KproxyError
from kproxy.testing.cluster import Cluster, Packet
from kproxy.testing.differences import KNOWN_DIFFERENCES, KnownDifference, applicable_differences
from kproxy.testing.modes import DEFAULT_MODES, DumpAdapter, ModeAdapter, get_mode
from kproxy.testing.outcome import Outcome, probabilities_agree
from kproxy.trace.netfilter import trace_packet

__all__ = [
    "Comparison", "NotEquivalent", "assert_equivalent", "compare", "disagreements", "format_comparison",
]


class NotEquivalent(KproxyError, AssertionError):
    """Two modes forward a packet differently; the message shows every outcome and trace.

    Attributes:
        comparison: the :class:`Comparison` that failed.
    """

    def __init__(self, comparison: Comparison) -> None:
        self.comparison = comparison
        super().__init__(format_comparison(comparison))


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """Every mode's answer for one packet, and what was made of it.

    Attributes:
        cluster, packet: what was compared.
        outcomes: ``{mode: Outcome}`` in the order the modes were given.
        excused: the known differences that applied (their modes were not compared).
        mismatches: ``(mode_a, mode_b, what)`` for each disagreeing pair (``what``: verdict,
            endpoints, masquerade); empty when the modes agree.
    """

    cluster: Cluster
    packet: Packet
    outcomes: Mapping[str, Outcome]
    excused: tuple[KnownDifference, ...]
    mismatches: tuple[tuple[str, str, str], ...]

    @property
    def equivalent(self) -> bool:
        """No pair of compared modes disagrees."""
        return not self.mismatches


def disagreements(a: Outcome, b: Outcome) -> list[str]:
    """What ``a`` and ``b`` disagree on: a sublist of ``["verdict", "endpoints", "masquerade"]``.

    Masquerade is compared only for accepted, translated packets where both modes have the notion.
    """
    out = []
    if a.verdict is not b.verdict:
        out.append("verdict")
    if not probabilities_agree(a, b):
        out.append("endpoints")
    if (a.masquerade is not None and b.masquerade is not None and a.translated and b.translated
            and a.masquerade != b.masquerade):
        out.append("masquerade")
    return out


def _adapters(modes: Sequence[str | ModeAdapter]) -> list[ModeAdapter]:
    if isinstance(modes, str) or not modes:
        raise InvalidArgument(f"modes must be a non-empty sequence of mode names, got {modes!r}")
    adapters = [get_mode(m) for m in modes]
    names = [a.name for a in adapters]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"modes: each mode once, got {names}")
    return adapters


def compare(
    cluster: Cluster,
    packet: Packet,
    modes: Sequence[str | ModeAdapter] = DEFAULT_MODES,
    *,
    differences: tuple[KnownDifference, ...] = KNOWN_DIFFERENCES,
    trace: bool = False,
) -> Comparison:
    """Ask every mode about ``packet`` and compare them (see the module docstring).

    Args:
        cluster: the cluster and node.
        packet: the packet.
        modes: mode names (see :func:`~kproxy.testing.modes.available_modes`) or adapters.
        differences: the known differences allowed (default: all of them; ``()`` allows none).
        trace: collect every mode's trace (always done again when they disagree).

    Raises:
        InvalidArgument: an unknown mode, a mode named twice, or no mode.
    """
    adapters = _adapters(modes)
    outcomes = {a.name: a.outcome(cluster, packet, trace=trace) for a in adapters}
    excused = applicable_differences(cluster, packet, outcomes, differences)
    skip = {m for d in excused for m in d.modes}
    compared = [m for m in outcomes if m not in skip]
    mismatches = []
    for i, ma in enumerate(compared):
        for mb in compared[i + 1:]:
            mismatches += [(ma, mb, what) for what in disagreements(outcomes[ma], outcomes[mb])]
    if mismatches and not trace:
        outcomes = {a.name: a.outcome(cluster, packet, trace=True) for a in adapters}
    if mismatches or trace:
        outcomes = {a.name: _detailed(a, cluster, packet, outcomes[a.name]) for a in adapters}
    return Comparison(cluster=cluster, packet=packet, outcomes=outcomes, excused=excused,
                      mismatches=tuple(mismatches))


def assert_equivalent(
    cluster: Cluster,
    packet: Packet,
    modes: Sequence[str | ModeAdapter] = DEFAULT_MODES,
    *,
    differences: tuple[KnownDifference, ...] = KNOWN_DIFFERENCES,
) -> Comparison:
    """Fail unless every mode forwards ``packet`` alike, known differences excepted.

    Returns:
        The :class:`Comparison` (for statistics: which differences applied).

    Raises:
        AssertionError: a :class:`NotEquivalent` whose message shows each mode's outcome side by
            side, each mismatch, and each mode's trace.
        InvalidArgument: see :func:`compare`.
    """
    result = compare(cluster, packet, modes, differences=differences)
    if not result.equivalent:
        raise NotEquivalent(result)
    return result


def _detailed(adapter: ModeAdapter, cluster: Cluster, packet: Packet, outcome: Outcome) -> Outcome:
    """``outcome`` with a netfilter mode's trace as ``kproxy trace`` shows it (input line numbers,
    UNKNOWN steps, every outcome with its probability) and the uncertain share of the connections
    not sent to an endpoint; other modes as is."""
    netns_of = getattr(adapter, "netns", None)
    if not callable(netns_of):
        return outcome
    try:
        # Rendered rules: the built-in chains' jumps are not in the restore input (as kproxy trace).
        result = trace_packet(netns_of(cluster, packet.family), packet.to_emulated(),
                              zero_builtin_lines=not isinstance(adapter, DumpAdapter))
    except (NetfilterError, InvalidArgument):
        return outcome
    lines = []
    for t in result.trace:
        where = f"line {t.line}" if t.line else "-"
        label = {"match": "", "policy": "policy ", "unknown": "UNKNOWN "}.get(t.result, t.result + " ")
        lines.append(f"{t.hook} {t.table} {t.chain} ({where}): {label}{t.rule}")
    for p, o in result.outcomes:
        flag = " (uncertain: a match or target the emulator does not model was met)" if o.uncertain else ""
        lines.append(f"outcome p={p:.10g} {o.verdict} {o.reason}{flag}")
    uncertain = min(1.0, sum(p for p, o in result.outcomes
                             if o.uncertain and not (o.verdict == "ACCEPT" and o.dnat)))
    return dataclasses.replace(outcome, trace=tuple(lines), uncertain=uncertain)


def _wrap(line: str, width: int) -> list[str]:
    """``line`` wrapped at spaces to ``width``, continuation lines indented under its value;
    a word longer than a line is cut and marked with an ellipsis."""
    if len(line) <= width:
        return [line]
    body = line.lstrip()
    lead = len(line) - len(body)
    label = re.match(r"\S+\s{2,}", body)  # "why:        " or "endpoint:port   "
    hang = min(lead + (label.end() if label else 2), width // 2)
    pieces = textwrap.wrap(body, width, initial_indent=" " * lead, subsequent_indent=" " * hang,
                           break_long_words=False, break_on_hyphens=False) or [line]
    return [p if len(p) <= width else p[:width - 1] + "…" for p in pieces]


def _side_by_side(columns: Mapping[str, list[str]], width: int = 58) -> list[str]:
    names = list(columns)
    wrapped = {n: [w for line in columns[n] for w in _wrap(line, width)] for n in names}
    rows = max(len(c) for c in wrapped.values())
    out = ["  ".join(f"{n[:width]:<{width}}" for n in names).rstrip(),
           "  ".join("-" * width for _ in names)]
    for r in range(rows):
        cells = [(wrapped[n][r] if r < len(wrapped[n]) else "") for n in names]
        out.append("  ".join(f"{c:<{width}}" for c in cells).rstrip())
    return out


def format_comparison(comparison: Comparison) -> str:
    """The comparison for a person: the packet, the outcomes side by side, mismatches, traces."""
    c = comparison
    lines = [f"packet: {c.packet}", f"cluster: {c.cluster!r}", ""]
    lines += _side_by_side({m: o.describe() for m, o in c.outcomes.items()})
    lines.append("")
    for ma, mb, what in c.mismatches:
        lines.append(f"MISMATCH: {ma} and {mb} disagree on {what}")
    for d in c.excused:
        lines.append(f"known difference {d.name}: {', '.join(sorted(d.modes))} not compared "
                     f"({d.explanation})")
    for m, o in c.outcomes.items():
        lines.append(f"trace of {m}:")
        lines += [f"  {t}" for t in o.trace] or ["  (none)"]
    return "\n".join(lines)
