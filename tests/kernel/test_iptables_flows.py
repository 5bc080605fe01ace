
"""Packet flows through kube-proxy's rules: verdict, endpoints and masquerade, on both executors.

Table-driven (:data:`tests.scenarios.CASES`), under each configuration of the masquerade
matrix (:data:`tests.scenarios.CONFIGS`). On the emulated executor every case's first packet is
enumerated through the emulated node (:func:`tests.scenarios.predict`), so the endpoints come
with their exact probabilities. On Linux, kube-proxy's rules are loaded into the node namespace
of :func:`tests.kernel.harness.topology` through :class:`~kproxy.kernel.LinuxNetfilter`
(``iptables-restore --noflush`` plus the jump rules), every case the kernel can carry is sent
from its namespace as real TCP connections or UDP datagrams, and what the clients and identity
servers saw is the observation: the verdict (answered / connection refused / timeout), the
endpoints that answered, and the client address each endpoint saw. Both must match the table:

- the verdict;
- the endpoints (with their probabilities on the emulator; on Linux, each one answers within
  :data:`ATTEMPTS` connections, or exactly one of them under ClientIP affinity);
- masquerade: the endpoint sees the node's address on the interface towards it
  (:func:`masquerade_source`) when the table says masqueraded, and the client's own otherwise.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from emulation.netfilter import Netns
from kproxy.modes.iptables import IptablesRenderer
from kproxy.modes.iptables.mode import program
from tests.kernel.conftest import Executor
from tests.kernel.harness import Answer, Probe, Topology, topology
from tests.scenarios import (
    CASES,
    CONFIGS,
    NODE,
    NODE_IP,
    PA,
    PB,
    POD_GW,
    REMOTE,
    SOURCES,
    Case,
    case_packet,
    cluster,
    load_emulator,
    predict,
)
from tests.unit.modes.kube import snapshot_of

KERNEL_TOOLS = ("iptables-restore", "iptables-save", "iptables")

#: Connections for a case with several endpoints: each endpoint is missed with probability
#: (1 - p) ** ATTEMPTS, 2e-6 for ATTEMPTS = 20 and p = 0.5.
ATTEMPTS = 20


def masquerade_source(endpoint: str) -> str:
    """The source address an endpoint sees when its packet was masqueraded: the node's address
    on the interface the packet leaves by (``inet_select_addr``): the pod veths' link-local
    gateway for pods on this node, the node IP towards the other node."""
    ip = endpoint.rsplit(":", 1)[0]
    return {PA: POD_GW, PB: POD_GW, REMOTE: NODE_IP}[ip]


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """What happened to a case's new connections on one executor.

    Attributes:
        verdict: ACCEPT, DROP or REJECT.
        endpoints: ``{"ip:port": share}`` of the translated connections: exact probabilities
            (emulated) or the fraction of attempts each endpoint answered (Linux).
        peers: ``{"ip:port": client addresses that endpoint saw}``.
        exact: the shares are exact probabilities.
        uncertain: an unknown match or target was met (emulated only).
    """

    verdict: str
    endpoints: dict[str, float]
    peers: dict[str, set[str]]
    exact: bool
    uncertain: bool = False


class EmulatedFlows:
    """The emulated node, one per configuration."""

    def __init__(self) -> None:
        self._nodes: dict[str, Netns] = {}

    def observe(self, config: str, case: Case) -> Observation:
        """Enumerate the case's first packet under ``config``."""
        netns = self._nodes.setdefault(config, load_emulator(CONFIGS[config]))
        got = predict(netns, case)
        return Observation(verdict=got.verdict, endpoints=got.endpoints, peers=got.peers, exact=True,
                           uncertain=got.uncertain)  # fmt: skip

    def sticks(self, case: Case) -> tuple[str | None, dict[str, float]]:
        """One sampled connection, then the distribution of the client's next one."""
        netns = load_emulator(CONFIGS["detect"])
        first = netns.send(case_packet(case), random.Random(3))
        return first.destination, predict(netns, case, sport=40001).endpoints


class LinuxFlows:
    """The harness's namespaces; every case of a configuration is probed at its first use."""

    def __init__(self, node: Topology) -> None:
        self.node = node
        self._seen: dict[tuple[str, str], Observation] = {}

    def _load(self, config: str) -> None:
        result = IptablesRenderer(CONFIGS[config]).render(snapshot_of(cluster(), hostname=NODE), full=True)
        asyncio.run(program(self.node.kernel, result))

    def observe(self, config: str, case: Case) -> Observation:
        """The case's answers under ``config`` (all of the configuration's cases probed at once)."""
        if not case.kernel:
            pytest.skip("the kernel harness cannot send this case (see Case.kernel)")
        if (config, case.name) not in self._seen:
            self._load(config)
            cases = [c for c in CASES if c.kernel]
            for c, answers in zip(cases, self.node.probe([_probe(c) for c in cases]), strict=True):
                self._seen[(config, c.name)] = _observation(answers)
        return self._seen[(config, case.name)]

    def sticks(self, case: Case) -> tuple[str | None, dict[str, float]]:
        """The first of :data:`ATTEMPTS` connections, and the shares of all of them."""
        self._load("detect")
        (answers,) = self.node.probe([_probe(case)])
        return answers[0].endpoint, _observation(answers).endpoints


def _probe(case: Case) -> Probe:
    ns, src = SOURCES[case.source]
    several = len(case.endpoints) > 1 or case.sticky
    return Probe(ns=ns, src=src, dst=case.dst, port=case.dport, proto=case.proto,
                 count=ATTEMPTS if several else 2, timeout_s=1.0)  # fmt: skip


def _observation(answers: list[Answer]) -> Observation:
    """Every attempt must have the same verdict; an answer from the node's own server (the
    health check node port) is delivered, not translated."""
    kinds = {a.kind for a in answers}
    assert len(kinds) == 1, f"attempts disagree: {answers}"
    translated = [a for a in answers if a.endpoint and not a.endpoint.startswith("node:")]
    endpoints: dict[str, float] = {}
    peers: dict[str, set[str]] = {}
    for a in translated:
        assert a.endpoint is not None and a.peer is not None
        endpoints[a.endpoint] = endpoints.get(a.endpoint, 0.0) + 1 / len(answers)
        peers.setdefault(a.endpoint, set()).add(a.peer)
    return Observation(verdict=kinds.pop(), endpoints=endpoints, peers=peers, exact=False)


@pytest.fixture(scope="module")
def flows(executor: Executor) -> Iterator[EmulatedFlows | LinuxFlows]:
    """The executor's flows: the emulated node, or the harness's namespaces (deleted after)."""
    if executor is Executor.EMULATED:
        yield EmulatedFlows()
        return
    with topology() as node:
        yield LinuxFlows(node)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_flow(flows: EmulatedFlows | LinuxFlows, case: Case, config: str) -> None:
    """The case's verdict, its endpoints (with probabilities where exact), and masquerade."""
    got = flows.observe(config, case)
    want = case.endpoints_for(config)
    assert not got.uncertain
    assert got.verdict == case.verdict_for(config), got
    if got.exact:
        assert got.endpoints == pytest.approx(want, abs=1e-9)
    elif case.sticky:
        assert len(got.endpoints) == 1 and set(got.endpoints) <= set(want), got
    else:
        assert set(got.endpoints) == set(want), got
    source = SOURCES[case.source][1]
    masq = case.masq_for(config) and got.verdict == "ACCEPT"
    for endpoint, peers in got.peers.items():
        assert peers == {masquerade_source(endpoint) if masq else source}, (endpoint, got)


def test_client_ip_affinity_sticks_after_the_first_connection(flows: EmulatedFlows | LinuxFlows) -> None:
    """After a client's first connection, every new connection of that client goes to the same endpoint."""
    case = next(c for c in CASES if c.name == "lb-from-allowed-external")
    first, then = flows.sticks(case)
    assert first in {f"{PA}:8080", f"{REMOTE}:8080"}
    assert then == pytest.approx({first: 1.0})


def test_kernel_rules_equal_the_emulated_save(flows: EmulatedFlows | LinuxFlows) -> None:
    """After a full sync, iptables-save of the node equals the emulated kernel's save (Linux only:
    on the emulator the two are one)."""
    if not isinstance(flows, LinuxFlows):
        pytest.skip("compares the real kernel's save with the emulator's")
    config = CONFIGS["detect"]
    result = IptablesRenderer(config).render(snapshot_of(cluster(), hostname=NODE), full=True)
    asyncio.run(program(flows.node.kernel, result))
    real = asyncio.run(flows.node.kernel.save())
    assert _tables(real) == _tables(load_emulator(config).save())


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
