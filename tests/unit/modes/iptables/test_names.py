"""Chain names, probabilities and the public surface of kproxy.modes.iptables."""

from __future__ import annotations

from itertools import pairwise

import pytest

import kproxy.modes.iptables as iptables
from kproxy.modes.iptables import (
    compute_probability,
    endpoint_chain_name,
    external_chain_name,
    firewall_chain_name,
    is_service_chain_name,
    local_policy_chain_name,
    service_chain_name,
)

# Names that appear in kube-proxy's proxier_test.go expected outputs.
PORT_HASHES = [
    ("ns1/svc1:p80", "tcp", "XPGD46QRK7WJZT7O"),
    ("ns2/svc2:p80", "tcp", "GNZBNJ2PO5MGZ6GT"),
    ("ns3/svc3:p80", "tcp", "X27LE4BHSL4DOUIK"),
    ("ns4/svc4:p80", "tcp", "4SW47YFZTEDKD3PK"),
    ("ns5/svc5:p80", "tcp", "NUKIZ6OKUXPJNT4C"),
    ("ns2/svc2:p8080", "tcp", "2VJB64SDSIJUP5T6"),
]
ENDPOINTS = [
    ("ns1/svc1:p80", "tcp", "10.180.0.1:80", "KUBE-SEP-SXIVWICOYRO3J4NJ"),
    ("ns2/svc2:p80", "tcp", "10.180.0.2:80", "KUBE-SEP-RS4RBKLTHTF2IUXJ"),
    ("ns3/svc3:p80", "tcp", "10.180.0.3:80", "KUBE-SEP-OYPFS5VJICHGATKP"),
    ("ns5/svc5:p80", "tcp", "10.180.0.3:80", "KUBE-SEP-I77PXRDZVX7PMWMN"),
    ("ns4/svc4:p80", "tcp", "10.180.0.4:80", "KUBE-SEP-UKSFD7AGPMPPLUHC"),
    ("ns1/svc1:p80", "tcp", "10.0.0.0:80", "KUBE-SEP-DKGQUZGBKLTPAR56"),
    ("ns3/svc3:p8081", "tcp", "203.0.113.4:8081", "KUBE-SEP-RUVVH7YV3PHQBDOS"),
]


@pytest.mark.parametrize(("spn", "proto", "digest"), PORT_HASHES)
def test_port_chain_names(spn: str, proto: str, digest: str) -> None:
    """SVC/SVL/EXT/FW chains share kube-proxy's hash of the port name and protocol."""
    assert service_chain_name(spn, proto) == "KUBE-SVC-" + digest
    assert local_policy_chain_name(spn, proto) == "KUBE-SVL-" + digest
    assert external_chain_name(spn, proto) == "KUBE-EXT-" + digest
    assert firewall_chain_name(spn, proto) == "KUBE-FW-" + digest


@pytest.mark.parametrize(("spn", "proto", "endpoint", "chain"), ENDPOINTS)
def test_endpoint_chain_names(spn: str, proto: str, endpoint: str, chain: str) -> None:
    """KUBE-SEP names hash the port name, protocol and ip:port with no separator."""
    assert endpoint_chain_name(spn, proto, endpoint) == chain


def test_protocol_is_part_of_the_hash() -> None:
    """The same port name over UDP gets another chain."""
    assert service_chain_name("ns1/svc1:p80", "udp") != service_chain_name("ns1/svc1:p80", "tcp")


def test_names_fit_iptables() -> None:
    """Every name is at most 28 characters, iptables' limit."""
    assert len(firewall_chain_name("a" * 300, "sctp")) <= 28
    assert len(endpoint_chain_name("ns/x", "tcp", "[2001:db8::1]:80")) == 25


def test_service_chain_prefixes() -> None:
    """Only per-service chains are candidates for stale-chain deletion."""
    assert all(is_service_chain_name(p + "X") for p in ("KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-",
                                                         "KUBE-FW-", "KUBE-EXT-"))
    assert not any(is_service_chain_name(c) for c in ("KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-FIREWALL"))


@pytest.mark.parametrize(("n", "text"), [
    (1, "1.0000000000"), (2, "0.5000000000"), (3, "0.3333333333"), (10, "0.1000000000"),
    (100, "0.0100000000"), (1000, "0.0010000000"), (10000, "0.0001000000"),
    (100000, "0.0000100000"), (100001, "0.0000099999"),
])
def test_compute_probability(n: int, text: str) -> None:
    """TestComputeProbability: 1/n to ten decimals."""
    assert compute_probability(n) == text


def test_probabilities_strictly_increase() -> None:
    """As the remaining endpoints shrink the printed probability strictly grows."""
    values = [float(compute_probability(n)) for n in range(20000, 0, -1)]
    assert all(a < b for a, b in pairwise(values))


def test_compute_probability_rejects_zero() -> None:
    """Zero endpoints has no probability."""
    with pytest.raises(ValueError, match="n=0"):
        compute_probability(0)


def test_exports() -> None:
    """Everything in __all__ exists, once."""
    assert all(hasattr(iptables, name) for name in iptables.__all__)
    assert len(set(iptables.__all__)) == len(iptables.__all__)
