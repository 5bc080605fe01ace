"""``kproxy trace`` through an IPVS node: from manifests (the ipvs mode) or from a real node's dumps.

Theory of operation: :func:`node_from_render` programs an :class:`IpvsNode` (the trace node of
:func:`kproxy.trace.netfilter.trace_node`) with an ipvs-mode render through
:class:`~kproxy.modes.ipvs.mode.IpvsMode`; :func:`node_from_dumps` loads a node's own dumps:

- ``ipvsadm-save -n`` text is replayed as ``ipvsadm-restore`` would (each ``-a`` goes to the
  head of its list, so a sorted save ends in reverse order); ``ipvsadm -Ln`` text is read as
  ``--nosort`` output, i.e. kernel list order, head first (``/proc/net/ip_vs`` is the same);
- a real server listed at weight 0 is taken as added at weight 0 (a dump carries no history;
  for ``mh`` it then holds no table slots) and the trace says so;
- every virtual address that is not a ``--node-ip`` is bound to ``kube-ipvs0``;
- ``--ipset-save`` and ``--iptables-save`` texts, when given, fill the sets and the rules (read
  leniently: unknown matches are reported, never silently taken).

:func:`trace_ipvs` enumerates the packet (nothing changes) and, with ``connections > 1``, also
simulates that many new connections from the source (source ports counting up) on a copy of
the node and reports each real server's share as its probability: IPVS schedulers keep state
(rr cursors, connection counts), so the first packet's answer is not a distribution.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from emulation import ManualClock, Packet
from emulation.errors import EmulationError
from emulation.ipset import load_save
from emulation.ipvs import IpvsTable, Sysctls, format_address, load_list, load_rules
from emulation.netfilter import load
from kproxy.errors import ConfigError
from kproxy.kernel.ipvs_node import IpvsNode
from kproxy.kernel.node import trace_node
from kproxy.modes.ipvs import IpvsConfig, IpvsRender
from kproxy.modes.ipvs.mode import IpvsMode
from kproxy.trace.netfilter import TraceEndpoint, TraceResult, trace_packet

__all__ = ["node_from_dumps", "node_from_render", "trace_ipvs"]


def node_from_render(rendered: IpvsRender, node_ips: Sequence[str]) -> IpvsNode:
    """A trace node programmed with ``rendered`` as :class:`IpvsMode` programs it."""
    config: IpvsConfig = rendered.config
    node = IpvsNode(trace_node(node_ips), ManualClock(), version=6 if config.ipv6 else 4)
    IpvsMode.emulated(config, node).load(rendered)
    return node


def _is_save(text: str) -> bool:
    firsts = (line.split()[:1] for line in text.splitlines() if line.strip())
    return any(w in (["-A"], ["-a"], ["ipvsadm"]) for w in firsts)


def node_from_dumps(ipvs_text: str, *, node_ips: Sequence[str], version: int = 4,
                    ipset_text: str | None = None,
                    iptables_text: str | None = None) -> tuple[IpvsNode, list[str]]:
    """A trace node holding a real node's dumps (see the module docstring).

    Returns:
        The node and the notes the trace should carry.

    Raises:
        ConfigError: a dump does not parse (the message names the line).
    """
    notes: list[str] = []
    sysctls = Sysctls.kube_proxy()
    try:
        if _is_save(ipvs_text):
            table = load_rules(ipvs_text, sysctls=sysctls)
            notes.append("--ipvs-dump read as ipvsadm-save -n: replayed as ipvsadm-restore would, each real "
                         "server added to the head of its list (a sorted save ends in reverse order)")
        else:
            table = load_list(ipvs_text, nosort=True, sysctls=sysctls)
            notes.append("--ipvs-dump read as ipvsadm -Ln --nosort: rows taken as kernel list order, "
                         "head first")
    except EmulationError as err:
        raise ConfigError(f"--ipvs-dump: {err}") from None
    notes += _weight_zero_notes(table)
    node = IpvsNode(trace_node(node_ips), ManualClock(), version=version)
    node.ipvs = table
    try:
        if ipset_text is not None:
            load_save(ipset_text, node.ipsets, exist=True)
        if iptables_text is not None:
            node.netns.ruleset = load(iptables_text, version=version, strict=False)
    except EmulationError as err:
        raise ConfigError(f"--ipset-save/--iptables-save: {err}") from None
    local = set(node_ips)
    addrs = sorted({format_address(s.spec.key.version, s.spec.key.addr) for s in table.services()
                    if not s.spec.key.fwmark and s.spec.key.version == version} - local)
    node.bind(tuple(addrs))
    return node, notes


def _weight_zero_notes(table: IpvsTable) -> list[str]:
    out = []
    for svc in table.services():
        for d in svc.dests:
            if d.weight == 0:
                out.append(f"{svc.spec.key}: real server {d.label} has weight 0 in the dump; taken as "
                           "added at "
                           "weight 0 (a dump carries no history" +
                           ("; mh gives it no table slots)" if svc.spec.scheduler == "mh" else ")"))
    return out


def trace_ipvs(node: IpvsNode, packet: Packet, *, connections: int = 1, zero_builtin_lines: bool = False,
               notes: Sequence[str] = ()) -> TraceResult:
    """Trace ``packet`` through ``node`` (see the module docstring).

    Args:
        node: the node (not changed).
        packet: the first packet of a connection.
        connections: how many new connections to simulate for the endpoint shares (1: the
            traced packet's own answer).
        zero_builtin_lines: as :func:`~kproxy.trace.netfilter.trace_packet`.
        notes: notes to carry (e.g. from :func:`node_from_dumps`).

    Raises:
        ConfigError: ``connections`` < 1.
    """
    if connections < 1:
        raise ConfigError(f"--connections: expected at least 1, got {connections}")
    base = trace_packet(node, packet, zero_builtin_lines=zero_builtin_lines)
    step = next((s for s in node.steps if s.virtual_server is not None), None)
    out = replace(base, ipvs=True, notes=tuple(notes),
                  virtual_server=step.virtual_server if step else None,
                  real_server=step.real_server if step else None)
    if connections == 1:
        return out
    sim = copy.deepcopy(node)
    counts: Counter[str] = Counter()
    # One generator for the whole run: a fresh one per connection would give every
    # connection the same draws, and MASQUERADE --random-fully the same port offset.
    gen = random.Random(0)
    for i in range(connections):
        got = sim.send(replace(packet, sport=(packet.sport + i - 1) % 65535 + 1), gen)
        if got.verdict == "ACCEPT" and got.dnat:
            counts[got.destination] += 1
    shares = tuple(TraceEndpoint(address=a, probability=round(c / connections, 12))
                   for a, c in sorted(counts.items()))
    note = (f"endpoint probabilities are the shares of {connections} simulated new connections from "
            f"{packet.src} (source ports from {packet.sport} up)")
    return replace(out, endpoints=shares, notes=(*out.notes, note))
