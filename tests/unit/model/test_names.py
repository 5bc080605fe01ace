"""ServicePortName: kube-proxy's key for a service port, and its text form."""

from __future__ import annotations

import pytest

import kproxy.model
from kproxy.model import Protocol, ServicePortName


@pytest.mark.parametrize(
    ("port", "protocol", "text"),
    [
        ("http", Protocol.TCP, "ns/svc:http"),
        ("dns", Protocol.UDP, "ns/svc:dns"),
        ("", Protocol.TCP, "ns/svc"),
        ("", Protocol.SCTP, "ns/svc"),
    ],
)
def test_text_is_namespace_name_and_port_name(port: str, protocol: Protocol, text: str) -> None:
    """The text is ``namespace/name:port`` (``namespace/name`` when unnamed), never the protocol."""
    assert str(ServicePortName(namespace="ns", name="svc", port=port, protocol=protocol)) == text


def test_protocol_is_part_of_identity() -> None:
    """Two names that differ only in protocol are different keys with the same text."""
    tcp = ServicePortName(namespace="ns", name="svc", port="p", protocol=Protocol.TCP)
    udp = ServicePortName(namespace="ns", name="svc", port="p", protocol=Protocol.UDP)
    assert tcp != udp
    assert len({tcp, udp}) == 2
    assert str(tcp) == str(udp)


@pytest.mark.parametrize("text", ["ns/svc:http", "ns/svc"])
def test_parse_round_trips_text(text: str) -> None:
    """``ServicePortName.parse`` reads back what ``str`` writes."""
    assert str(ServicePortName.parse(text)) == text


@pytest.mark.parametrize("text", ["svc", "/svc", "ns/", ""])
def test_parse_rejects_malformed_text(text: str) -> None:
    """Text without a namespace and a name is a ValueError."""
    with pytest.raises(ValueError, match="namespace/name"):
        ServicePortName.parse(text)


def test_exports_are_importable() -> None:
    """Every name in ``kproxy.model.__all__`` exists."""
    missing = [name for name in kproxy.model.__all__ if not hasattr(kproxy.model, name)]
    assert missing == []
