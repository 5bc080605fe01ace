"""Refused and dropped traffic: the emulator's verdicts and rule counters equal the kernel's.

A fresh node (:func:`tests.kernel.harness.topology`) gets kube-proxy's rules for the scenario
cluster plus two Services of this test: ``ns20/rej``, a LoadBalancer with no endpoints (TCP and
UDP; ClusterIP, NodePort, external IP and LoadBalancer IP), and ``ns21/fw``, a LoadBalancer
with ``loadBalancerSourceRanges`` (TCP and UDP, one endpoint). Real packets are then sent that
kube-proxy's rules REJECT (no endpoints: ``-j REJECT`` in filter KUBE-SERVICES for ClusterIPs,
KUBE-EXTERNAL-SERVICES for NodePorts, external and LoadBalancer IPs, as
``TestNoEndpointsReject`` in kube-proxy's proxier_test.go) and DROP (a source outside the
LoadBalancer's source ranges, dropped in KUBE-PROXY-FIREWALL; ``externalTrafficPolicy: Local``
without local endpoints, and ``internalTrafficPolicy: Local`` without local endpoints), from a
pod, the node, ``127.0.0.1`` and the external client, plus one accepted UDP flow. What each
client sees is recorded: connection refused (an ICMP port unreachable; for TCP
``tcp_v4_err`` aborts the connect, for a connected UDP socket the next ``recv`` fails), a
timeout (DROP), or EPERM for a UDP datagram the node itself sends and its OUTPUT chain rejects
(``ip_local_out`` fails, so ``send`` does).

The emulator replays the same packets. Checked:

- each packet's emulated verdict (ACCEPT/REJECT/DROP) is what the client saw;
- every rule whose count cannot depend on a random choice has the same packet and byte
  counters in the emulator as in ``iptables-save -c`` (policies are left out: see the known
  iptables-nft difference in ``test_iptables_counters.py``);
- the kernel's REJECT and DROP rules of kube-proxy counted exactly the refused and dropped
  attempts (so the comparison is not vacuous).

Counting exactly. Every UDP attempt is one datagram (and, when accepted, one answer). A TCP
attempt is one SYN as long as the SYN is never retransmitted: a REJECT answers at once, and a
DROPped attempt is abandoned after :data:`SHORT_TIMEOUT_S`, well before the first
retransmission (the initial RTO is 1 s, ``TCP_TIMEOUT_INIT``, RFC 6298); closing a socket in
SYN_SENT sends nothing. Rather than trusting the timing, the test reads ``TCPSynRetrans`` of
every sending namespace (``/proc/net/netstat``) and requires it to be 0.

ICMP errors. A REJECT is not only a verdict: ``ipt_REJECT`` sends an ICMP port unreachable
(``nf_send_unreach`` -> ``icmp_send``) back to the sender, a packet of the node's own that
crosses filter OUTPUT (and, when the sender is the node itself, lo and filter INPUT) and is
counted by their rules. It carries the refused packet's conntrack entry (``nf_ct_attach``), not
yet confirmed, as RELATED: nat never walks its rules for it and ``--ctstate NEW`` does not match
it. The emulator sends these errors itself (:mod:`emulation.netfilter.reject`), so its counters
are compared as they are (:func:`test_untraced_emulator_answers_rejects_as_the_kernel`, once an expected
failure, checks just that). The node runs with ``net.ipv4.icmp_ratelimit=0``
(:func:`tests.kernel.harness.topology`), so the kernel answers every refused attempt, as the
emulator does (it does not model ICMP rate limits).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from emulation import Packet
from emulation.netfilter import Netns, Outcome
from emulation.packet import Protocol
from kproxy.modes.iptables import IptablesRenderer
from kproxy.modes.iptables.mode import program
from tests.conftest import require_kernel
from tests.kernel.harness import (
    PROBE_BYTES,
    REPLY_BYTES,
    Answer,
    CounterKey,
    Probe,
    parse_counters,
    topology,
)
from tests.kernel.netns import sh
from tests.scenarios import (
    BLOCKED,
    CONFIGS,
    EP_PORT,
    EXTERNAL,
    IN_INTERFACE,
    NODE,
    NODE_IP,
    PA,
    POD_CLIENT,
    POD_LINKS,
    cluster,
    load_emulator,
)
from tests.unit.modes.kube import endpoint_slice, ep, port, service, snapshot_of

pytestmark = pytest.mark.kernel

#: How long an attempt that gets no answer (refused or dropped) may wait: a refusal arrives at
#: once, and a dropped SYN is given up well before TCP's first retransmission (1 s).
SHORT_TIMEOUT_S = 0.3
#: How long an accepted attempt may wait for its answer.
ANSWER_TIMEOUT_S = 2.0
_IP_UDP_HEADERS = 28
#: A Linux SYN: 20 bytes of IP header, 20 of TCP header and 20 of options (MSS, SACK
#: permitted, timestamps, window scale), the defaults of a new network namespace.
_SYN_BYTES = 60
_NS = {"pod": "pc", "node": "node", "localhost": "node", "external": "client", "blocked": "client"}
_SRC = dict(pod=POD_CLIENT, node=NODE_IP, localhost="127.0.0.1", external=EXTERNAL, blocked=BLOCKED)
#: The interface of the node an answer to the client arrives on, by the answering address.
_LINK = {**POD_LINKS, EXTERNAL: "eth0"}
#: kube-proxy's filter chains holding per-service REJECT and DROP rules.
SERVICE_CHAINS = ("KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-PROXY-FIREWALL")


def extra_services() -> list[dict[str, Any]]:
    """This test's Services, added to the scenario cluster."""

    def ports(node_port: int) -> list[dict[str, Any]]:
        return [port("t", 80, "TCP", targetPort=EP_PORT, nodePort=node_port),
                port("u", 81, "UDP", targetPort=EP_PORT, nodePort=node_port)]  # fmt: skip

    return [
        service("ns20", "rej", "172.30.0.60", ports(30020), type="LoadBalancer",
                externalIPs=["192.168.99.60"], ingress=["9.10.11.60"]),
        service("ns21", "fw", "172.30.0.61", ports(30021), type="LoadBalancer",
                loadBalancerSourceRanges=["203.0.113.0/25"], ingress=["5.6.7.61"]),
        endpoint_slice("ns21", "fw", [ep(PA, NODE)], [("t", EP_PORT, "TCP"), ("u", EP_PORT, "UDP")]),
    ]  # fmt: skip


def _docs() -> list[dict[str, Any]]:
    return cluster() + extra_services()


@dataclass(frozen=True, slots=True)
class Flow:
    """``count`` attempts from ``source`` (each a new flow, from source ports ``sport``,
    ``sport + 1`` ...) to ``dst``:``port``; ``verdict`` is what kube-proxy's rules do with them
    (the emulator must agree)."""

    name: str
    source: str
    dst: str
    port: int
    proto: Protocol
    sport: int
    count: int
    verdict: str


# fmt: off
FLOWS: tuple[Flow, ...] = (
    # No endpoints: REJECT, from every kind of client, on every kind of address.
    Flow("clusterip-tcp-from-pod", "pod", "172.30.0.60", 80, "tcp", 41000, 2, "REJECT"),
    Flow("clusterip-udp-from-pod", "pod", "172.30.0.60", 81, "udp", 41100, 2, "REJECT"),
    Flow("clusterip-tcp-from-node", "node", "172.30.0.60", 80, "tcp", 42000, 1, "REJECT"),
    Flow("clusterip-udp-from-node", "node", "172.30.0.60", 81, "udp", 42100, 1, "REJECT"),
    Flow("nodeport-tcp-from-external", "external", NODE_IP, 30020, "tcp", 43000, 1, "REJECT"),
    Flow("nodeport-udp-from-external", "external", NODE_IP, 30020, "udp", 43100, 2, "REJECT"),
    Flow("nodeport-tcp-from-localhost", "localhost", "127.0.0.1", 30020, "tcp", 44000, 1, "REJECT"),
    Flow("nodeport-udp-from-localhost", "localhost", "127.0.0.1", 30020, "udp", 44100, 1, "REJECT"),
    Flow("externalip-tcp-from-external", "external", "192.168.99.60", 80, "tcp", 43200, 1, "REJECT"),
    Flow("externalip-udp-from-external", "external", "192.168.99.60", 81, "udp", 43300, 1, "REJECT"),
    Flow("lb-tcp-from-external", "external", "9.10.11.60", 80, "tcp", 43400, 2, "REJECT"),
    Flow("lb-udp-from-external", "external", "9.10.11.60", 81, "udp", 43500, 1, "REJECT"),
    # DROP: outside the LoadBalancer's source ranges; eTP=Local and iTP=Local, no local endpoints.
    Flow("lb-source-ranges-tcp-blocked", "blocked", "5.6.7.61", 80, "tcp", 45000, 2, "DROP"),
    Flow("lb-source-ranges-udp-blocked", "blocked", "5.6.7.61", 81, "udp", 45100, 2, "DROP"),
    Flow("etp-local-no-local-eps-nodeport", "external", NODE_IP, 30002, "tcp", 45200, 1, "DROP"),
    Flow("etp-local-no-local-eps-lb", "external", "1.2.3.4", 80, "tcp", 45300, 1, "DROP"),
    Flow("itp-local-no-local-eps", "pod", "172.30.0.49", 80, "tcp", 45400, 1, "DROP"),
    # Accepted by the same source ranges: its counters sit beside the DROP's.
    Flow("lb-source-ranges-udp-allowed", "external", "5.6.7.61", 81, "udp", 45500, 2, "ACCEPT"),
)
# fmt: on


def _attempts(verdict: str) -> int:
    return sum(f.count for f in FLOWS if f.verdict == verdict)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelRun:
    """What the kernel did: the answers per flow, ``iptables-save -c`` parsed, each rule's
    text by counter key, and the SYN retransmissions of each sending namespace."""

    answers: list[list[Answer]]
    counters: dict[CounterKey, tuple[int, int]]
    rules: dict[CounterKey, str]
    syn_retransmits: dict[str, int]


def _rule_texts(save: str) -> dict[CounterKey, str]:
    """``{(table, chain, index): "-A CHAIN ..."}`` of ``iptables-save -c`` text."""
    out: dict[CounterKey, str] = {}
    table, index = "", dict[str, int]()
    for line in save.splitlines():
        if line.startswith("*"):
            table, index = line[1:], {}
        elif line.startswith("["):
            rule = line.split(" ", 1)[1]
            chain = rule.split()[1]
            index[chain] = index.get(chain, 0) + 1
            out[(table, chain, index[chain])] = rule
    return out


def _syn_retransmits(ns: str) -> int:
    """``TcpExt: TCPSynRetrans`` of a namespace (``/proc/net/netstat`` is per namespace)."""
    text = sh("ip", "netns", "exec", ns, "cat", "/proc/net/netstat").stdout
    lines = [line.split() for line in text.splitlines()]
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names[0] == "TcpExt:":
            return int(dict(zip(names[1:], values[1:], strict=True))["TCPSynRetrans"])
    raise AssertionError("no TcpExt line in /proc/net/netstat")  # fmt: skip


@pytest.fixture(scope="module")
def kernel_run() -> Iterator[KernelRun]:
    """Load the rules into a fresh node, send :data:`FLOWS`, read the counters."""
    require_kernel("iptables-restore", "iptables-save", "iptables")
    with topology() as node:
        result = IptablesRenderer(CONFIGS["detect"]).render(snapshot_of(_docs(), hostname=NODE), full=True)
        asyncio.run(program(node.kernel, result))
        answers = node.probe([
            Probe(ns=_NS[f.source], src=_SRC[f.source], dst=f.dst, port=f.port, proto=f.proto, count=f.count,
                  sport=f.sport, timeout_s=ANSWER_TIMEOUT_S if f.verdict == "ACCEPT" else SHORT_TIMEOUT_S)
            for f in FLOWS
        ])  # fmt: skip
        save = asyncio.run(node.kernel.save(counters=True))
        retrans = {key: _syn_retransmits(node.names[key]) for key in sorted(set(_NS.values()))}
        yield KernelRun(answers=answers, counters=parse_counters(save), rules=_rule_texts(save),
                        syn_retransmits=retrans)  # fmt: skip


def _counts(outcome: Outcome) -> dict[CounterKey, int]:
    out: dict[CounterKey, int] = {}
    for step in outcome.trace:
        if step.result in ("match", "policy"):
            key = (step.table, step.chain, step.index)
            out[key] = out.get(key, 0) + 1
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    """The emulator's side: each attempt's outcome (traced), the counters, the rules whose
    count depends on a random choice, and how many ICMP errors the emulator sent for REJECTs
    (counted in the traces of its sends, when they were traced)."""

    outcomes: list[list[Outcome]]
    counters: dict[CounterKey, tuple[int, int]]
    unstable: set[CounterKey]
    errors_sent: int


def _send(
    netns: Netns, packet: Packet, rng: random.Random, unstable: set[CounterKey], *, trace: bool
) -> tuple[Outcome, int]:
    """Send ``packet`` (committing it, traced when ``trace``); mark the rules whose count differs
    between its possible outcomes. Returns the outcome, traced when the packet had only one
    possible outcome (``enumerate``'s trace: the packet's own steps), and how many errors the
    emulator sent for a REJECT of it, as the send's trace shows them (0 untraced)."""
    traced = netns.enumerate(packet, trace=True)
    counts = [_counts(o) for _, o in traced]
    for key in set().union(*counts):
        if len({c.get(key, 0) for c in counts}) > 1:
            unstable.add(key)
    outcome = netns.send(packet, rng, trace=trace)
    errors = sum(step.result == "answer" for step in outcome.trace)
    if len(traced) == 1:
        want, got = traced[0][1].packet, outcome.packet
        if outcome.masquerade:  # --random-fully: send draws the port, enumerate takes offset 0
            want, got = replace(want, sport=0), replace(got, sport=0)
        assert (traced[0][1].verdict, want) == (outcome.verdict, got)
        return replace(traced[0][1], packet=outcome.packet), errors  # the port the flow really got
    return outcome, errors


def replay(*, trace: bool = False) -> Replay:
    """Send :data:`FLOWS` through the emulator (and the answers to the accepted ones), which
    answers every REJECT itself (see the module docstring); ``trace``: send them traced."""
    netns = load_emulator(CONFIGS["detect"], _docs())
    rng, unstable, errors = random.Random(0), set[CounterKey](), 0
    outcomes: list[list[Outcome]] = []
    for f in FLOWS:
        length = _SYN_BYTES if f.proto == "tcp" else _IP_UDP_HEADERS + PROBE_BYTES
        got = []
        for i in range(f.count):
            sent = Packet(src=_SRC[f.source], dst=f.dst, sport=f.sport + i, dport=f.port, protocol=f.proto,
                          in_interface=IN_INTERFACE[f.source], length=length)  # fmt: skip
            out, sent_errors = _send(netns, sent, rng, unstable, trace=trace)
            got.append(out)
            errors += sent_errors
            if out.verdict == "ACCEPT":
                p = out.packet
                answer = Packet(src=p.dst, dst=p.src, sport=p.dport, dport=p.sport, protocol="udp",
                                in_interface=_LINK[p.dst], length=_IP_UDP_HEADERS + REPLY_BYTES)  # fmt: skip
                errors += _send(netns, answer, rng, unstable, trace=trace)[1]
        outcomes.append(got)
    counters = parse_counters(netns.save(counters=True))
    return Replay(outcomes=outcomes, counters=counters, unstable=unstable, errors_sent=errors)


def _seen(flow: Flow, outcome: Outcome) -> tuple[str, str | None]:
    """What the client sees of a packet the emulator gave ``outcome`` (traced): (kind,
    endpoint). The last step of a traced REJECT or DROP is the rule that decided it."""
    if outcome.verdict == "ACCEPT":
        return "ACCEPT", outcome.destination
    in_output = bool(outcome.trace) and outcome.trace[-1].hook == "OUTPUT"
    if flow.proto == "udp" and IN_INTERFACE[flow.source] is None and in_output:
        return "EPERM", None
    return ("REJECT" if outcome.verdict == "REJECT" else "DROP"), None


def _compared(kernel_run: KernelRun, emulated: Replay) -> list[CounterKey]:
    """Rule counters (not policies) of both, minus the unstable ones (both have the same rules)."""
    assert set(emulated.counters) <= set(kernel_run.counters)
    assert set(kernel_run.counters) <= set(emulated.counters)
    return sorted(k for k in set(kernel_run.counters) - emulated.unstable if k[2] != 0)


Counts = tuple[int, int]


def _diff(kernel_run: KernelRun, emulated: Replay) -> dict[CounterKey, tuple[Counts, Counts]]:
    """``{key: (emulator, kernel)}`` of every compared counter that differs."""
    return {k: (emulated.counters[k], kernel_run.counters[k]) for k in _compared(kernel_run, emulated)
            if emulated.counters[k] != kernel_run.counters[k]}  # fmt: skip


def _packets(kernel_run: KernelRun, chains: tuple[str, ...], target: str) -> int:
    """Packets the kernel counted on the filter rules of ``chains`` whose target is ``target``."""
    return sum(kernel_run.counters[k][0] for k, rule in kernel_run.rules.items()
               if k[0] == "filter" and k[1] in chains and _target(rule) == target)  # fmt: skip


def _target(rule: str) -> str:
    """The target of an ``iptables-save`` rule (``REJECT`` of ``... -j REJECT --reject-with ...``)."""
    return rule.rsplit(" -j ", 1)[-1].split()[0]


def test_no_syn_was_retransmitted(kernel_run: KernelRun) -> None:
    """The exact-count assumption holds: every TCP attempt was a single SYN."""
    assert kernel_run.syn_retransmits == dict.fromkeys(kernel_run.syn_retransmits, 0)


def test_verdicts_match_what_clients_saw(kernel_run: KernelRun) -> None:
    """Every attempt: the emulator's verdict is kube-proxy's, and is what the client saw
    (refused, timed out, EPERM on the node, or answered by the endpoint the emulator chose)."""
    emulated = replay()
    problems = []
    for flow, got, outs in zip(FLOWS, kernel_run.answers, emulated.outcomes, strict=True):
        for i, (answer, outcome) in enumerate(zip(got, outs, strict=True)):
            want = _seen(flow, outcome)
            if outcome.verdict != flow.verdict or (answer.kind, answer.endpoint) != want:
                problems.append(f"{flow.name}[{i}]: kernel {answer.kind} {answer.endpoint}; "
                                f"emulator {outcome.verdict}, so expected {want}")  # fmt: skip
    assert not problems, "\n".join(problems)


def test_rule_counters_match_the_kernel(kernel_run: KernelRun) -> None:
    """Every deterministic rule counts the same packets and bytes in the emulator (sending
    traced, so walking every packet, and answering each REJECT with one ICMP error) as in
    the kernel."""
    emulated = replay(trace=True)
    assert not _diff(kernel_run, emulated)
    assert emulated.errors_sent == _attempts("REJECT")


def test_kube_proxy_reject_and_drop_rules_counted_every_attempt(kernel_run: KernelRun) -> None:
    """In the kernel, kube-proxy's per-service ``-j REJECT`` rules counted exactly the refused
    attempts and its per-service ``-j DROP`` rules exactly the dropped ones; KUBE-FIREWALL's
    localnet DROP and KUBE-FORWARD's INVALID DROP counted nothing."""
    assert _packets(kernel_run, SERVICE_CHAINS, "REJECT") == _attempts("REJECT")
    assert _packets(kernel_run, SERVICE_CHAINS, "DROP") == _attempts("DROP")
    assert _packets(kernel_run, ("KUBE-FIREWALL", "KUBE-FORWARD"), "DROP") == 0


def test_untraced_emulator_answers_rejects_as_the_kernel(kernel_run: KernelRun) -> None:
    """The emulator sends the REJECTs' ICMP errors itself (untraced, its flow cache on), and its
    counters equal the kernel's (a strict expected failure until the emulator sent them)."""
    assert not _diff(kernel_run, replay())
