"""Where one packet goes through an emulated node, summarised for a person or as stable JSON.

Theory of operation: :func:`trace_node` models the node ``kproxy trace`` talks about: one
interface ``eth0`` carrying the node IPs (plus a placeholder address per family when none is
given, so MASQUERADE has an address to pick) and default routes out of it, ``lo``, and
``route_localnet`` on (kube-proxy sets it for localhost NodePorts). :func:`trace_packet` builds
the packet (a source that is a node IP or loopback is generated on the node and enters through
OUTPUT; any other arrives on ``eth0`` and enters through PREROUTING), enumerates every outcome
with its probability (:meth:`emulation.netfilter.Netns.enumerate`, tracing on, no state
changed) and folds them into one :class:`TraceResult`:

- ``verdict``: the verdict of the outcomes, or the most probable one when they differ;
- ``endpoints``: the translated destinations of the accepted, DNATed outcomes with their
  summed probabilities, sorted by address (empty when nothing was translated);
- ``masquerade``: some accepted outcome was masqueraded;
- ``trace``: the rules the packet matched (plus unknown matches and deciding policies), the
  paths of every outcome merged in walking order, each once.

The JSON form (:meth:`TraceResult.to_json`) is the contract of ``kproxy trace --json``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from emulation import Packet
from emulation.netfilter import Netns, Outcome, Ruleset, TraceStep
from emulation.netfilter.rules import BUILTIN_CHAINS, Chain
from emulation.netfilter.targets import Jump, UnknownTarget
from kproxy.errors import ConfigError
from kproxy.kernel.node import EXTERNAL_INTERFACE, PLACEHOLDER_IPS, trace_node
from kproxy.trace.detail import trace_detail

__all__ = [
    "EXTERNAL_INTERFACE",
    "PLACEHOLDER_IPS",
    "ChainLoop",
    "Enumerates",
    "TraceEndpoint",
    "TraceLine",
    "TraceResult",
    "find_chain_loop",
    "format_trace",
    "make_packet",
    "parse_host_port",
    "trace_node",
    "trace_packet",
]

_DEFAULT_SPORT = 40000
_VERDICT_ORDER = ("ACCEPT", "DROP", "REJECT")


class Enumerates(Protocol):
    """What :func:`trace_packet` traces through: a :class:`~emulation.netfilter.Netns`, or an
    :class:`~kproxy.kernel.ipvs_node.IpvsNode`."""

    def enumerate(self, packet: Packet, *, trace: bool = False) -> list[tuple[float, Outcome]]:
        """Every outcome of ``packet`` with its probability, changing nothing."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEndpoint:
    """A destination the packet may be translated to: ``address`` (``ip:port``, ``[ip6]:port``)
    and its ``probability`` (0..1)."""

    address: str
    probability: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceLine:
    """One rule the packet met.

    Attributes:
        hook: the netfilter hook (PREROUTING, INPUT, FORWARD, OUTPUT, POSTROUTING).
        table, chain: where the rule lives.
        rule: the rule as ``iptables-save`` prints it, or ``:CHAIN POLICY`` for a policy.
        line: its line in the input (the restore text or the dump), 0 when it has none (a
            policy, or a jump rule kube-proxy installs with ``iptables -I``).
        result: ``match``, ``unknown`` (a match or a target the emulator does not model, so
            what the packet did there is uncertain) or ``policy``; in an nftables trace also
            ``lookup:hit``/``lookup:miss`` (a named set or map lookup) and ``numgen`` (one branch
            of ``numgen random mod N``, its value in ``rule``).
        target: what it did (the jump target, verdict, or ``""``).
    """

    hook: str
    table: str
    chain: str
    rule: str
    line: int
    result: str
    target: str
    probability: float | None = None
    """nftables traces: the probability that the packet meets this step (the summed
    probabilities of the outcomes whose path holds it); None in other traces."""

    @property
    def unknown(self) -> bool:
        """The emulator does not model a match or the target of this rule."""
        return self.result == "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceResult:
    """Everything :func:`trace_packet` found (see the module docstring).

    Attributes:
        packet: the packet sent.
        verdict: ``ACCEPT``, ``DROP`` or ``REJECT``.
        endpoints: translated destinations with probabilities, sorted by address.
        masquerade: an accepted outcome was masqueraded.
        trace: the merged path.
        outcomes: every ``(probability, Outcome)`` the emulator found.
        ipvs: traced through an IPVS node (the ipvs mode); then ``virtual_server`` and
            ``real_server`` say what IPVS used (``TCP 10.96.0.10:53``, ``10.0.0.5:53``; None
            when it matched no service or chose none) and ``notes`` what to know about the
            answer (how a dump was read, simulated connections).
        nftables: traced through nftables (:mod:`kproxy.trace.nftables`): the trace holds set
            and map lookups and numgen branches, each step with its probability.
    """

    packet: Packet
    verdict: str
    endpoints: tuple[TraceEndpoint, ...]
    masquerade: bool
    trace: tuple[TraceLine, ...]
    outcomes: tuple[tuple[float, Outcome], ...]
    ipvs: bool = False
    nftables: bool = False
    virtual_server: str | None = None
    real_server: str | None = None
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """``{"verdict", "endpoints": [{"address", "probability"}], "masquerade", "trace":
        [{"table", "chain", "rule", "line", "unknown"}]}`` (``unknown``: the emulator does not
        model a match or the target of that rule, so the answer is uncertain), plus
        ``"virtual_server"``, ``"real_server"`` for an IPVS trace, ``"notes"``, for an nftables
        trace ``"hook"``, ``"result"`` (``match``, ``policy``, ``unknown``, ``lookup:hit``,
        ``lookup:miss``, ``numgen``), ``"target"`` and ``"probability"`` in each trace entry, and
        each endpoint's ``"trace"`` and ``"source"``, ``"snat"`` and ``"delivery"``
        (:func:`kproxy.trace.detail.trace_detail`)."""
        out: dict[str, Any] = {
            "verdict": self.verdict,
            "endpoints": [{"address": e.address, "probability": e.probability} for e in self.endpoints],
            "masquerade": self.masquerade,
            "trace": [{"table": t.table, "chain": t.chain, "rule": t.rule, "line": t.line,
                       "unknown": t.unknown} for t in self.trace],
        }
        if self.nftables:
            for entry, t in zip(out["trace"], self.trace, strict=True):
                entry.update(hook=t.hook, result=t.result, target=t.target, probability=t.probability)
            out["notes"] = list(self.notes)
        if self.ipvs:
            out.update(virtual_server=self.virtual_server, real_server=self.real_server,
                       notes=list(self.notes))
        shown = {(t.hook, t.table, t.chain, t.rule): (t.line, t.unknown) for t in self.trace}
        out.update(trace_detail(self.outcomes, [(e.address, e.probability) for e in self.endpoints], shown))
        out.setdefault("notes", list(self.notes))
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainLoop:
    """A cycle of jumps (``-j``/``-g``) between chains, which ``iptables-restore`` refuses
    ("Too many links"): ``table``, the ``chains`` in jump order (the first repeated at the end)
    and the input ``line`` of the rule closing the loop (0 when unknown)."""

    table: str
    chains: tuple[str, ...]
    line: int

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return (f"{where}chain loop in table {self.table}: {' -> '.join(self.chains)} "
                "(iptables-restore rejects it: Too many links)")


def _visit(table: str, chains: Mapping[str, Chain], name: str, path: list[str],
           state: dict[str, int]) -> ChainLoop | None:
    state[name] = 1  # on the current path; 2 when done
    for rule in chains[name].rules:
        target = rule.target
        if not isinstance(target, Jump) or target.chain not in chains:
            continue
        if state.get(target.chain) == 1:
            names = [*path, name]
            return ChainLoop(table=table, chains=(*names[names.index(target.chain):], target.chain),
                             line=rule.line)
        if target.chain not in state:
            found = _visit(table, chains, target.chain, [*path, name], state)
            if found is not None:
                return found
    state[name] = 2
    return None


def find_chain_loop(ruleset: Ruleset) -> ChainLoop | None:
    """The first loop of jumps between chains in ``ruleset`` (tables and chains by name), if any."""
    for tname in sorted(ruleset.tables):
        chains = ruleset.tables[tname].chains
        state: dict[str, int] = {}
        for start in sorted(chains):
            if start not in state:
                loop = _visit(tname, chains, start, [], state)
                if loop is not None:
                    return loop
    return None


def parse_host_port(text: str, *, flag: str, need_port: bool) -> tuple[str, int | None]:
    """Parse ``IP``, ``IP:PORT``, ``[IP6]:PORT`` or a bare IPv6 address.

    Raises:
        ConfigError: not an address (naming ``flag``), or no port where one is needed.
    """
    host, port = text.strip(), None
    if host.startswith("["):
        inner, sep, rest = host[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigError(f"{flag}: expected [IPv6]:PORT, got {text!r}")
        host, port_text = inner, rest[1:] if rest else None
    elif host.count(":") == 1:
        host, port_text = host.split(":")
    else:
        port_text = None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{flag}: expected IP[:PORT] (IPv6 as [IP]:PORT), got {text!r}") from None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
            raise ConfigError(f"{flag}: port must be 1..65535, got {port_text!r} in {text!r}")
        port = int(port_text)
    if need_port and port is None:
        raise ConfigError(f"{flag}: a port is needed, e.g. 10.96.0.10:80, got {text!r}")
    return str(ip), port


def make_packet(src: str, dst: str, proto: str, node_ips: Sequence[str]) -> Packet:
    """The packet for ``--src IP[:PORT] --dst IP:PORT --proto P`` (see the module docstring).

    Raises:
        ConfigError: a malformed address, mixed families, or an unknown protocol.
    """
    if proto not in ("tcp", "udp", "sctp"):
        raise ConfigError(f"--proto: expected tcp, udp or sctp, got {proto!r}")
    s_ip, s_port = parse_host_port(src, flag="--src", need_port=False)
    d_ip, d_port = parse_host_port(dst, flag="--dst", need_port=True)
    s_addr, d_addr = ipaddress.ip_address(s_ip), ipaddress.ip_address(d_ip)
    if s_addr.version != d_addr.version:
        raise ConfigError(f"--src {src} and --dst {dst} are of different IP families")
    local = s_addr.is_loopback or any(_same(s_ip, ip) for ip in node_ips)
    return Packet(src=s_ip, dst=d_ip, sport=s_port or _DEFAULT_SPORT, dport=d_port or 0,
                  protocol=proto,  # type: ignore[arg-type]
                  in_interface=None if local else EXTERNAL_INTERFACE)


def _same(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


_RuleKey = tuple[str, str, int, str]


def _unknown_targets(netns: object) -> frozenset[_RuleKey]:
    """``(table, chain, line, rule)`` of every rule whose target the emulator does not model."""
    ruleset = getattr(netns, "ruleset", None)
    if not isinstance(ruleset, Ruleset):
        return frozenset()
    return frozenset((tname, cname, rule.line, rule.text())
                     for tname, table in ruleset.tables.items() for cname, chain in table.chains.items()
                     for rule in chain.rules if isinstance(rule.target, UnknownTarget))


def _steps(outcome: Outcome, zero_builtin_lines: bool,
           unknown_targets: frozenset[_RuleKey] = frozenset()) -> list[TraceLine]:
    out = []
    for s in outcome.trace:
        if s.result == "nomatch":
            continue
        out.append(_line(s, zero_builtin_lines, unknown_targets))
    return out


def _line(s: TraceStep, zero_builtin_lines: bool,
          unknown_targets: frozenset[_RuleKey] = frozenset()) -> TraceLine:
    line = s.line
    if zero_builtin_lines and s.chain in BUILTIN_CHAINS.get(s.table, ()):
        line = 0
    result = s.result
    if result == "match" and (s.table, s.chain, s.line, s.rule) in unknown_targets:
        result = "unknown"
    return TraceLine(hook=s.hook, table=s.table, chain=s.chain, rule=s.rule, line=line,
                     result=result, target=s.target)


def _merge(paths: list[list[TraceLine]]) -> list[TraceLine]:
    """Merge paths in walking order: a step not seen yet goes just before the next step of its
    own path that is already merged (so a branch's steps stay together), else at the end."""
    merged: list[tuple[TraceLine, int]] = []
    for path in paths:
        counts: dict[TraceLine, int] = {}
        keys = []
        for step in path:
            counts[step] = counts.get(step, 0) + 1
            keys.append((step, counts[step]))
        known = set(merged)
        for i, key in enumerate(keys):
            if key in known:
                continue
            anchor = next((k for k in keys[i + 1:] if k in known), None)
            merged.insert(merged.index(anchor) if anchor is not None else len(merged), key)
    return [step for step, _ in merged]


def trace_packet(netns: Netns | Enumerates, packet: Packet, *,
                 zero_builtin_lines: bool = False) -> TraceResult:
    """Enumerate ``packet``'s outcomes in ``netns`` and summarise them (module docstring).

    Args:
        netns: the emulated node (not changed).
        packet: what to send.
        zero_builtin_lines: report line 0 for rules of built-in chains (when they were
            installed outside the restore text the lines refer to, as kube-proxy's jumps are).
    """
    outcomes = sorted(netns.enumerate(packet, trace=True), key=lambda po: (-po[0], po[1].destination))
    unknown = _unknown_targets(netns)
    weight = dict.fromkeys(_VERDICT_ORDER, 0.0)
    for p, o in outcomes:
        weight[o.verdict] = weight.get(o.verdict, 0.0) + p
    verdict = max(weight, key=weight.__getitem__)  # ties: the first in _VERDICT_ORDER
    endpoints: dict[str, float] = {}
    for p, o in outcomes:
        if o.verdict == "ACCEPT" and o.dnat:
            endpoints[o.destination] = endpoints.get(o.destination, 0.0) + p
    return TraceResult(
        packet=packet,
        verdict=verdict,
        endpoints=tuple(TraceEndpoint(address=a, probability=round(p, 12))
                        for a, p in sorted(endpoints.items())),
        masquerade=any(o.masquerade for _, o in outcomes if o.verdict == "ACCEPT"),
        trace=tuple(_merge([_steps(o, zero_builtin_lines, unknown) for _, o in outcomes])),
        outcomes=tuple(outcomes),
    )


def format_trace(result: TraceResult) -> str:
    """A report for a person debugging a node: the packet, the verdict, where it may go, each
    outcome, and the rules it matched in order."""
    p = result.packet
    where = (f"arriving on {p.in_interface} (PREROUTING)" if p.in_interface
             else "generated on the node (OUTPUT)")
    out = [f"packet: {p.protocol} {_hp(p.src, p.sport)} -> {_hp(p.dst, p.dport)}, {where}",
           f"verdict: {result.verdict}",
           f"masquerade: {'yes' if result.masquerade else 'no'}"]
    if result.ipvs:
        out.append(f"virtual server: {result.virtual_server or 'none'}")
        out.append(f"real server: {result.real_server or 'none'}")
        out += [f"note: {n}" for n in result.notes]
    if result.endpoints:
        out.append("endpoints:")
        out += [f"  {e.address:<28} probability {e.probability:.10f}" for e in result.endpoints]
    else:
        out.append("endpoints: none (the destination was not translated)")
    out.append(f"outcomes ({len(result.outcomes)}):")
    for prob, o in result.outcomes:
        nat = []
        if o.dnat:
            nat.append(f"DNAT to {o.destination}")
        if o.masquerade:
            nat.append(f"masqueraded to {o.packet.src}")
        elif o.snat:
            nat.append(f"SNAT to {o.packet.src}")
        extra = f" [{', '.join(nat)}]" if nat else ""
        flag = "  (uncertain: a match or target the emulator does not model was met)" if o.uncertain else ""
        out.append(f"  p={prob:.10f} {o.verdict:<6} {o.reason}{extra}{flag}")
    out.append("rules matched (hook, table, chain, input line):")
    if result.nftables:
        out += [f"note: {n}" for n in result.notes]
    for t in result.trace:
        line = f"line {t.line}" if t.line else "-"
        label = {"match": "", "policy": "policy ", "unknown": "UNKNOWN "}.get(t.result, t.result + " ")
        if t.probability is not None:
            label = {"lookup:hit": "hit: ", "lookup:miss": "miss: ", "unknown": "UNKNOWN "}.get(t.result, "")
            shown = t.target and t.result != "policy" and not t.rule.endswith(t.target)
            target = f" -> {t.target}" if shown else ""
            out.append(f"  {t.hook:<11} {t.table:<17} {t.chain:<40} {line:<9} p={t.probability:.4f} "
                       f"{label}{t.rule}{target}")
            continue
        out.append(f"  {t.hook:<11} {t.table:<6} {t.chain:<26} {line:<10} {label}{t.rule}")
    return "\n".join(out) + "\n"


def _hp(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
