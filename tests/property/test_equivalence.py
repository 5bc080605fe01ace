"""Properties: every mode forwards every generated packet alike, the documented differences excepted.

Example counts are for the ``ci`` profile; ``HYPOTHESIS_PROFILE=thorough`` multiplies them by 20.
"""

from __future__ import annotations

import os

from hypothesis import event, given, settings
from hypothesis import strategies as st

from kproxy.testing import assert_equivalent, clusters, compare, get_mode, packets
from kproxy.testing.modes import IptablesSampledAdapter
from kproxy.testing.outcome import Verdict

THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"


def scaled(n: int) -> int:
    """``n`` examples under the ci profile, 20 times more under ``thorough``."""
    return n * 20 if THOROUGH else n


@settings(max_examples=scaled(120), deadline=None, derandomize=not THOROUGH)
@given(st.data())
def test_modes_agree_on_every_packet(kproxy_modes: tuple[str, ...], data: st.DataObject) -> None:
    """The chosen modes agree on verdict, endpoints, distribution and masquerade for any packet."""
    cluster = data.draw(clusters(), label="cluster")
    for _ in range(4):
        packet = data.draw(packets(cluster), label="packet")
        result = assert_equivalent(cluster, packet, kproxy_modes)
        event(f"target={packet.target}")
        for difference in result.excused:
            event(f"known difference: {difference.name}")


@settings(max_examples=scaled(40), deadline=None, derandomize=not THOROUGH)
@given(st.data())
def test_sampling_agrees_with_enumeration_within_the_bound(data: st.DataObject) -> None:
    """The iptables rules sampled over 400 connections stay within the stated bound of their enumeration."""
    cluster = data.draw(clusters(max_services=2, protocols=("TCP", "UDP")), label="cluster")
    packet = data.draw(packets(cluster), label="packet")
    sampled = IptablesSampledAdapter(samples=400, seed=data.draw(st.integers(0, 2**16), label="seed"))
    result = compare(cluster, packet, ("iptables", sampled), differences=())
    assert result.equivalent, result


@settings(max_examples=scaled(100), deadline=None, derandomize=not THOROUGH)
@given(st.data())
def test_kernel_modes_agree_on_masquerade_for_every_translated_packet(data: st.DataObject) -> None:
    """Whenever iptables translates a packet it also decides masquerade, and the sampled path agrees."""
    cluster = data.draw(clusters(max_services=2, protocols=("TCP", "UDP")), label="cluster")
    packet = data.draw(packets(cluster), label="packet")
    enumerated = get_mode("iptables").outcome(cluster, packet)
    sampled = IptablesSampledAdapter(samples=20).outcome(cluster, packet)
    assert enumerated.masquerade is not None
    if enumerated.translated and enumerated.verdict is Verdict.ACCEPT:
        assert sampled.masquerade == enumerated.masquerade
