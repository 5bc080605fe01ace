"""After a sequence of real packets, the emulator's counters equal ``iptables-save -c``.

A fresh node gets kube-proxy's rules; UDP flows (one datagram and its answer each, fixed sizes)
are sent from pods, the node, localhost and the external client, to ClusterIPs and NodePorts,
with known source ports. The emulator replays the same packets (sampling its own endpoint
choices, answering from the endpoint it chose). Rules whose count cannot depend on a random
choice (the same in every enumerated outcome of every packet) must then show the same packet
and byte counts in both, built-in chain policies included.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest

from emulation import Packet
from emulation.netfilter import Netns
from kproxy.modes.iptables import IptablesRenderer
from kproxy.modes.iptables.mode import program
from tests.conftest import require_kernel
from tests.kernel.harness import (
    PROBE_BYTES,
    REPLY_BYTES,
    CounterKey,
    Probe,
    Topology,
    parse_counters,
    topology,
)
from tests.scenarios import (
    CONFIGS,
    EXTERNAL,
    IN_INTERFACE,
    NODE,
    NODE_IP,
    PA,
    PB,
    POD_CLIENT,
    REMOTE,
    cluster,
    load_emulator,
)
from tests.unit.modes.kube import snapshot_of

pytestmark = pytest.mark.kernel

_UDP_HEADERS = 28
#: (source key, source ip, destination, port, first source port, datagrams).
FLOWS = [
    ("pod", POD_CLIENT, "172.30.0.41", 81, 41000, 3),  # ClusterIP, one endpoint
    ("node", NODE_IP, "172.30.0.41", 81, 42000, 2),  # ClusterIP from the node (masqueraded)
    ("external", EXTERNAL, NODE_IP, 30003, 43000, 4),  # NodePort, two endpoints (random)
    ("localhost", "127.0.0.1", "127.0.0.1", 30003, 44000, 2),  # localhost NodePort
    ("pod", POD_CLIENT, NODE_IP, 30003, 45000, 2),  # NodePort from a pod
]
_NS = {"pod": "pc", "node": "node", "localhost": "node", "external": "client"}
_LINK = {PA: "vp1", PB: "vp2", REMOTE: "eth1", POD_CLIENT: "vp3", EXTERNAL: "eth0"}

Key = CounterKey  # (table, chain, rule index; 0 for the policy)


@pytest.fixture
def node() -> Iterator[Topology]:
    require_kernel("iptables-restore", "iptables-save", "iptables")
    with topology() as topo:
        yield topo


def _counts(outcome_trace: tuple[object, ...]) -> dict[Key, int]:
    out: dict[Key, int] = {}
    for step in outcome_trace:
        if step.result in ("match", "policy"):  # type: ignore[attr-defined]
            key = (step.table, step.chain, step.index)  # type: ignore[attr-defined]
            out[key] = out.get(key, 0) + 1
    return out


def _replay(netns: Netns, packet: Packet, rng: random.Random, unstable: set[Key]) -> Packet:
    """Send ``packet``; mark the rules whose count differs between its possible outcomes."""
    counts = [_counts(o.trace) for _, o in netns.enumerate(packet, trace=True)]
    for key in set().union(*counts):
        if len({c.get(key, 0) for c in counts}) > 1:
            unstable.add(key)
    return netns.send(packet, rng).packet


def _run(node: Topology) -> tuple[dict[Key, tuple[int, int]], dict[Key, tuple[int, int]], set[Key]]:
    """Send :data:`FLOWS` for real and in the emulator: (kernel, emulator, unstable keys)."""
    config = CONFIGS["detect"]
    result = IptablesRenderer(config).render(snapshot_of(cluster(), hostname=NODE), full=True)
    asyncio.run(program(node.kernel, result))
    answers = node.probe(
        [
            Probe(ns=_NS[k], src=src, dst=dst, port=port, proto="udp", count=n, sport=sport, timeout_s=2.0)
            for k, src, dst, port, sport, n in FLOWS
        ]
    )
    assert all(a.kind == "ACCEPT" for flow in answers for a in flow), answers
    real = parse_counters(asyncio.run(node.kernel.save(counters=True)))

    emulator = load_emulator(config)
    rng, unstable = random.Random(0), set()
    for key, src, dst, port, sport, n in FLOWS:
        for i in range(n):
            sent = Packet(
                src=src,
                dst=dst,
                sport=sport + i,
                dport=port,
                protocol="udp",
                in_interface=IN_INTERFACE[key],
                length=_UDP_HEADERS + PROBE_BYTES,
            )
            out = _replay(emulator, sent, rng, unstable)
            answer = Packet(
                src=out.dst,
                dst=out.src,
                sport=out.dport,
                dport=out.sport,
                protocol="udp",
                in_interface=_LINK[out.dst],
                length=_UDP_HEADERS + REPLY_BYTES,
            )
            _replay(emulator, answer, rng, unstable)
    return real, parse_counters(emulator.save(counters=True)), unstable


def test_rule_counters_match_the_kernel(node: Topology) -> None:
    """Every deterministic rule counts the same packets and bytes in the emulator and the kernel."""
    real, predicted, unstable = _run(node)
    assert set(predicted) == set(real)
    stable = sorted(k for k in set(real) - unstable if k[2] != 0)
    assert sum(real[k][0] for k in stable) > 20  # the comparison is not vacuous
    diff = {k: (predicted[k], real[k]) for k in stable if predicted[k] != real[k]}
    assert not diff, diff


@pytest.mark.xfail(
    strict=True,
    reason=(
        "emulator gap: with iptables-nft, a built-in chain created implicitly by `iptables -I` (as "
        "kube-proxy's EnsureRule does) has no policy counter and iptables-save -c shows [0:0]; the "
        "emulator counts every policy"
    ),
)
def test_policy_counters_match_the_kernel(node: Topology) -> None:
    """Built-in chain policy counters of iptables-save -c equal the emulator's."""
    real, predicted, unstable = _run(node)
    policies = sorted(k for k in set(real) - unstable if k[2] == 0)
    assert {k: predicted[k] for k in policies} == {k: real[k] for k in policies}
