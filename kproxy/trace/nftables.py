"""Where one packet goes through nftables: kproxy's rendered ``kube-proxy`` table, or a node's ruleset.

Theory of operation: the node is an :class:`emulation.nftables.Netns` on the one-interface node
model of :func:`~kproxy.kernel.node.trace_node`, with ``route_localnet`` off (the nftables
proxier never sets it: no localhost NodePorts, KEP-3866). It holds either the table the
nftables mode programs on its first full sync of the manifests (:func:`nftables_netns`, through
the mode and :class:`~kproxy.kernel.EmulatedNftables`, so the line numbers are those of
``kproxy render --proxy-mode nftables``), or a node's own ``nft list ruleset`` output read
leniently (:func:`netns_from_ruleset`): every table of the packet's family runs at its hooks in
priority order, another component's ``inet`` filter table included, and a statement the
emulator does not model becomes an explicit ``unknown`` step, never a silent match.

:func:`trace_nftables` enumerates every outcome (``numgen random mod N`` branches N ways, 1/N
each) and folds them as :func:`~kproxy.trace.netfilter.trace_packet` does; each trace step
(a rule that matched, a named set or map lookup with its hit or miss, a numgen branch, a
chain policy, an unknown statement) carries the probability that the packet meets it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from emulation import ManualClock, Packet
from emulation.nftables import Netns, NftablesError, Unknown, load
from kproxy.config.run import RunConfig
from kproxy.errors import ConfigError
from kproxy.kernel.emulated import run_now
from kproxy.kernel.emulated_nftables import EmulatedNftables
from kproxy.kernel.node import trace_node
from kproxy.model import IPFamily, Snapshot
from kproxy.modes.nftables import NftablesMode
from kproxy.modes.nftables.settings import nftables_config
from kproxy.trace.netfilter import TraceLine, TraceResult, _steps, trace_packet

__all__ = ["netns_from_ruleset", "nftables_netns", "trace_nftables", "unknown_statements"]


def nftables_netns(run: RunConfig, snapshot: Snapshot, family: IPFamily) -> Netns:
    """An emulated node after the nftables mode's first full sync of ``snapshot`` for ``family``.

    Raises:
        KernelError: the rendered transaction does not load (a bug: please report it).
    """
    config = nftables_config(run, family)
    netns = Netns(trace_node(config.node_ips, route_localnet=False), ManualClock())
    mode = NftablesMode(config, EmulatedNftables(netns, family), now=lambda: 0.0, history=0)
    run_now(mode.apply(snapshot))
    return netns


def netns_from_ruleset(text: str, node_ips: Sequence[str], *, source: str = "--nft-ruleset") -> Netns:
    """An emulated node holding a node's ``nft list ruleset`` output (every table), read leniently.

    Raises:
        ConfigError: the text is empty or does not parse (naming ``source`` and the line).
    """
    if not any(line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()):
        raise ConfigError(f"{source}: the ruleset is empty; give a node's `nft list ruleset` output")
    try:
        ruleset = load(text, strict=False)
    except NftablesError as err:
        raise ConfigError(f"{source}: {err}") from None
    return Netns(trace_node(list(node_ips), route_localnet=False), ManualClock(), ruleset=ruleset)


def unknown_statements(netns: Netns) -> int:
    """How many statements of the node's ruleset the emulator does not model (lenient load)."""
    return sum(1 for table in netns.ruleset.tables.values() for chain in table.chains.values()
               for rule in chain.rules for st in rule.stmts if isinstance(st, Unknown))


def trace_nftables(netns: Netns, packet: Packet, *, notes: Sequence[str] = ()) -> TraceResult:
    """Enumerate ``packet`` through ``netns`` and summarise it (see the module docstring).

    Raises:
        ConfigError: the ruleset's jumps loop (deeper than the kernel's jump stack).
    """
    try:
        base = trace_packet(netns, packet)
    except ValueError as err:
        raise ConfigError(f"the nftables ruleset cannot be followed: {err}") from None
    met: dict[TraceLine, float] = {}
    for p, outcome in base.outcomes:
        for step in set(_steps(outcome, False)):
            met[step] = met.get(step, 0.0) + p
    trace = tuple(dataclasses.replace(t, probability=round(met.get(t, 0.0), 12)) for t in base.trace)
    found = list(notes)
    unknown = unknown_statements(netns)
    if unknown:
        found.append(f"{unknown} statement(s) of the ruleset are not modelled by the emulator; a rule "
                     "holding one never matches and the outcome is marked uncertain")
    return dataclasses.replace(base, trace=trace, nftables=True, notes=tuple(found))
