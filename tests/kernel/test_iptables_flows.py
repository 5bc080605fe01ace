"""The scenario table against the real kernel: the emulator predicts what the kernel does.

For each configuration of the masquerade matrix, kube-proxy's rules are loaded into the node
namespace through :class:`~kproxy.kernel.LinuxNetfilter` (``iptables-restore --noflush`` plus the
jump rules), every case of ``tests.scenarios.CASES`` the kernel can carry is sent
from its namespace, and the answers are compared with the emulator's prediction for the same
rules: the verdict (answered / connection refused / timeout), the set of endpoints that answered,
and the client address each endpoint saw (masquerade).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kproxy.modes.iptables import IptablesRenderer
from tests.conftest import require_kernel
from tests.kernel.harness import Answer, Probe, Topology, topology
from tests.scenarios import CASES, CONFIGS, NODE, SOURCES, Case, cluster, load_emulator, predict
from tests.unit.modes.kube import snapshot_of

pytestmark = pytest.mark.kernel

#: Attempts for a case with several endpoints: each endpoint is missed with probability
#: (1 - p) ** ATTEMPTS, 2e-6 for ATTEMPTS = 20 and p = 0.5.
ATTEMPTS = 20


@pytest.fixture(scope="module")
def node() -> Iterator[Topology]:
    require_kernel("iptables-restore", "iptables-save", "iptables")
    with topology() as topo:
        yield topo


def _probe(case: Case) -> Probe:
    ns, src = SOURCES[case.source]
    several = len(case.endpoints) > 1 or case.sticky
    return Probe(ns=ns, src=src, dst=case.dst, port=case.dport, proto=case.proto,
                 count=ATTEMPTS if several else 2, timeout_s=1.0)


def _summary(answers: list[Answer]) -> tuple[str, set[str], set[tuple[str, str]]]:
    kinds = {a.kind for a in answers}
    assert len(kinds) == 1, f"attempts disagree: {answers}"
    eps = {a.endpoint for a in answers if a.endpoint}
    peers = {(a.endpoint, a.peer) for a in answers if a.endpoint and a.peer}
    return kinds.pop(), eps, peers


@pytest.mark.parametrize("config", list(CONFIGS))
def test_kernel_agrees_with_the_emulator(node: Topology, config: str) -> None:
    """Every case: same verdict, same endpoints, same client address seen by the endpoint."""
    result = IptablesRenderer(CONFIGS[config]).render(snapshot_of(cluster(), hostname=NODE), full=True)
    asyncio.run(node.kernel.apply(result))
    emulator = load_emulator(CONFIGS[config])
    cases = [c for c in CASES if c.kernel]
    answers = node.probe([_probe(c) for c in cases])
    problems = []
    for case, got in zip(cases, answers, strict=True):
        want = predict(emulator, case)
        kind, eps, peers = _summary(got)
        expected_eps = set(want.endpoints) or ({"node:30000"} if want.verdict == "ACCEPT" else set())
        ok = kind == want.verdict
        ok = ok and len(eps) == 1 and eps <= expected_eps if case.sticky else ok and eps == expected_eps
        ok = ok and all(peer in want.peers.get(ep, {SOURCES[case.source][1]}) for ep, peer in peers)
        if not ok:
            problems.append(f"{case.name}: kernel {kind} {sorted(eps)} peers {sorted(peers)}; "
                            f"emulator {want.verdict} {want.endpoints} peers {want.peers}")
    assert not problems, "\n".join(problems)


def test_kernel_rules_equal_the_emulated_save(node: Topology) -> None:
    """After a full sync, iptables-save of the node equals the emulated kernel's save."""
    config = CONFIGS["detect"]
    result = IptablesRenderer(config).render(snapshot_of(cluster(), hostname=NODE), full=True)
    asyncio.run(node.kernel.apply(result))
    real = asyncio.run(node.kernel.save())
    emulated = load_emulator(config).save()
    assert _tables(real) == _tables(emulated)


def _tables(text: str) -> dict[str, dict[str, list[str]]]:
    """``{table: {chain: [rule, ...]}}``; chains unordered, rules in order."""
    out: dict[str, dict[str, list[str]]] = {}
    table: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("*"):
            table = out.setdefault(line[1:], {})
        elif line.startswith(":"):
            table.setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            table.setdefault(line.split()[1], []).append(line)
    return out
