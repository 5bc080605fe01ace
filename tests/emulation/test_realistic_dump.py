# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""A node's whole iptables-save -c dump with kubelet, kube-proxy, Docker and CNI rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulation.clock import ManualClock
from emulation.errors import NetfilterError
from emulation.netfilter import Netns, load, save
from emulation.node import Interface, Node, Route
from emulation.packet import Packet
from tests.emulation.helpers import RNG

DUMP = (Path(__file__).parent / "data" / "node-dump.iptables-save").read_text()


def node_ns() -> Netns:
    node = Node(
        interfaces=(
            Interface(name="eth0", addresses=("192.168.0.2/24",)),
            Interface(name="cni0", addresses=("10.244.1.1/24",)),
            Interface(name="docker0", addresses=("172.17.0.1/16",)),
        ),
        routes=(
            Route(destination="10.244.0.0/16", device="eth0", via="192.168.0.3"),
            Route(destination="default", device="eth0", via="192.168.0.1"),
        ),
    )
    return Netns(node, ManualClock(), ruleset=load(DUMP))


def test_dump_round_trips_with_counters() -> None:
    """The dump loads and saves back to itself (minus iptables-save's comment lines)."""
    expected = "\n".join(line for line in DUMP.splitlines() if not line.startswith("#")) + "\n"
    rs = load(DUMP)
    assert save(load(save(rs, counters=True)), counters=True) == save(rs, counters=True)
    assert sorted(save(rs, counters=True).splitlines()) == sorted(expected.splitlines())


def test_dump_is_refused_in_strict_mode_because_of_physdev() -> None:
    """The CNI's physdev rule is not modelled, so strict loading names its line."""
    with pytest.raises(NetfilterError, match="physdev"):
        load(DUMP, strict=True)


def test_nodeport_from_outside_is_masqueraded_to_an_endpoint() -> None:
    """A client reaching the NodePort is DNATed to one of two endpoints and masqueraded."""
    outcomes = node_ns().enumerate(
        Packet(src="203.0.113.9", dst="192.168.0.2", sport=999, dport=30080, in_interface="eth0")
    )
    dests = {o.destination: p for p, o in outcomes}
    assert set(dests) == {"10.244.1.5:8080", "10.244.2.7:8080"}
    assert all(o.verdict == "ACCEPT" and o.masquerade for _, o in outcomes)
    # FORWARD first walks the CNI chain, whose physdev rule is unknown: flagged, never silently matched.
    assert all(o.uncertain for _, o in outcomes)
    assert all(any(s.result == "unknown" for s in o.trace) is False for _, o in outcomes)  # trace off


def test_service_without_endpoints_is_rejected() -> None:
    """The filter KUBE-SERVICES REJECT rule answers an outside client of a ClusterIP without endpoints."""
    out = node_ns().send(
        Packet(src="203.0.113.9", dst="10.96.0.99", sport=1, dport=80, in_interface="eth0"), RNG, trace=True
    )
    assert out.verdict == "REJECT"
    assert [s.rule for s in out.trace if s.result == "unknown"] == [
        "-A CNI-FORWARD -m physdev --physdev-is-bridged -j ACCEPT"
    ]


def test_cni_accepts_local_pod_traffic_before_kube_proxy_rejects() -> None:
    """On this node the CNI's FORWARD rule accepts local pods' packets before kube-proxy's REJECT is reached."""
    out = node_ns().send(
        Packet(src="10.244.1.7", dst="10.96.0.99", sport=1, dport=80, in_interface="cni0"), RNG
    )
    assert out.verdict == "ACCEPT"


def test_dns_from_a_pod_reaches_coredns_without_masquerade() -> None:
    """A pod's DNS query is DNATed to the CoreDNS pod and keeps its source (and the CNI chain is traced)."""
    out = node_ns().send(
        Packet(src="10.244.1.7", dst="10.96.0.10", sport=5353, dport=53, protocol="udp", in_interface="cni0"),
        RNG,
        trace=True,
    )
    assert (out.verdict, out.destination, out.masquerade) == ("ACCEPT", "10.244.1.3:53", False)
    assert any(s.chain == "CNI-FORWARD" for s in out.trace)
