"""Packet flows through kube-proxy's rules in the emulated kernel: verdict, endpoints, masquerade.

Table-driven (``scenarios.CASES``), under each configuration of the masquerade matrix; the same
table runs against the real kernel in ``tests/kernel/test_iptables_flows.py``.
"""

from __future__ import annotations

import random

import pytest

from tests.scenarios import CASES, CONFIGS, PA, REMOTE, Case, case_packet, load_emulator, predict

_NETNS = {name: load_emulator(config) for name, config in CONFIGS.items()}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_flow(case: Case, config: str) -> None:
    """The emulator gives the case's verdict, endpoints with probabilities, and masquerade."""
    got = predict(_NETNS[config], case)
    assert not got.uncertain
    assert got.verdict == case.verdict_for(config)
    assert got.endpoints == pytest.approx(case.endpoints_for(config), abs=1e-9)
    assert got.masq == (case.masq_for(config) if got.verdict == "ACCEPT" else False)


def test_client_ip_affinity_sticks_after_the_first_connection() -> None:
    """After one sampled connection, every new connection of that client goes to the same endpoint."""
    netns = load_emulator(CONFIGS["detect"])
    case = next(c for c in CASES if c.name == "lb-from-allowed-external")
    first = netns.send(case_packet(case), random.Random(3))
    assert first.destination in {f"{PA}:8080", f"{REMOTE}:8080"}
    again = predict(netns, case, sport=40001)
    assert again.endpoints == {first.destination: 1.0}
