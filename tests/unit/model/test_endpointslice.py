"""parse_endpoint_slice: discovery.k8s.io/v1 defaults and validation, as kube-proxy reads slices."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.errors import InvalidObject
from kproxy.model import EndpointConditions, IPFamily, NamespacedName, Protocol, parse_endpoint_slice

from .builders import endpoint, endpoint_slice, slice_port


def test_slice_belongs_to_the_labelled_service() -> None:
    """The ``kubernetes.io/service-name`` label names the owning Service, in the slice's namespace."""
    eps, problems = parse_endpoint_slice(endpoint_slice(name="web-x1", service_name="web"))
    assert problems == []
    assert eps.service == NamespacedName(namespace="ns", name="web")


@pytest.mark.parametrize("labels", [{}, {"kubernetes.io/service-name": ""}, None])
def test_missing_service_name_label_is_an_error(labels: dict[str, str] | None) -> None:
    """A slice without a non-empty service-name label is refused, naming the label."""
    raw = endpoint_slice()
    raw["metadata"]["labels"] = labels
    with pytest.raises(InvalidObject, match=r"kubernetes\.io/service-name") as info:
        parse_endpoint_slice(raw, source="eps.yaml")
    assert "eps.yaml" in str(info.value) and "EndpointSlice ns/svc-abc" in str(info.value)


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ({}, EndpointConditions(ready=True, serving=True, terminating=False)),
        ({"ready": False}, EndpointConditions(ready=False, serving=True, terminating=False)),
        ({"terminating": True}, EndpointConditions(ready=True, serving=True, terminating=True)),
        ({"ready": False, "serving": False, "terminating": True},
         EndpointConditions(ready=False, serving=False, terminating=True)),
    ],
)
def test_unset_conditions_default(conditions: dict[str, bool], expected: EndpointConditions) -> None:
    """Unset ready and serving mean true and unset terminating false (endpointslicecache.go)."""
    eps, _ = parse_endpoint_slice(endpoint_slice(endpoints=[endpoint("10.0.0.1", **conditions)]))
    assert eps.endpoints[0].conditions == expected


def test_only_the_first_address_is_used() -> None:
    """An endpoint with several addresses is ``addresses[0]``."""
    raw = endpoint_slice(endpoints=[endpoint("10.0.0.1", extra_addresses=["10.0.0.2"])])
    eps, _ = parse_endpoint_slice(raw)
    assert [e.address for e in eps.endpoints] == ["10.0.0.1"]


def test_port_name_and_protocol_default() -> None:
    """A slice port without name or protocol is named "" and uses TCP (discovery/v1 defaults.go)."""
    eps, _ = parse_endpoint_slice(endpoint_slice(ports=[slice_port(None, 9090)]))
    assert [(p.name, p.protocol, p.port) for p in eps.ports] == [("", Protocol.TCP, 9090)]


def test_hints_and_topology_are_read() -> None:
    """nodeName, zone and zone/node hints are kept on the endpoint."""
    raw = endpoint_slice(endpoints=[endpoint("10.0.0.1", node="n1", zone="z1", zone_hints=["z1", "z2"],
                                             node_hints=["n1"])])
    (ep,) = parse_endpoint_slice(raw)[0].endpoints
    assert (ep.node_name, ep.zone, ep.zone_hints, ep.node_hints) == ("n1", "z1", {"z1", "z2"}, {"n1"})


@pytest.mark.parametrize(
    ("address_type", "good", "bad"),
    [("IPv4", "10.0.0.1", "fd00::1"), ("IPv6", "fd00::1", "10.0.0.1")],
)
def test_address_of_wrong_family_is_skipped_and_named(address_type: str, good: str, bad: str) -> None:
    """An address not of the slice's addressType is skipped with an error naming its field; the rest stay."""
    raw = endpoint_slice(address_type=address_type, endpoints=[endpoint(bad), endpoint(good)])
    eps, problems = parse_endpoint_slice(raw, source="eps.yaml")
    assert [e.address for e in eps.endpoints] == [good]
    assert [p.field for p in problems] == ["endpoints[0].addresses[0]"]
    assert "eps.yaml" in str(problems[0]) and "EndpointSlice ns/svc-abc" in str(problems[0])


BAD_PARTS: list[tuple[str, dict[str, Any], str]] = [
    ("bad address", {"endpoints": [endpoint("10.0.0.999"), endpoint("10.0.0.1")]},
     "endpoints[0].addresses[0]"),
    ("no address", {"endpoints": [{"addresses": []}, endpoint("10.0.0.1")]}, "endpoints[0].addresses"),
    ("port zero", {"ports": [slice_port("a", 0), slice_port()]}, "ports[0].port"),
    ("port too large", {"ports": [slice_port("a", 65536), slice_port()]}, "ports[0].port"),
    ("port missing", {"ports": [{"name": "a"}, slice_port()]}, "ports[0].port"),
    ("unknown protocol", {"ports": [slice_port("a", protocol="QUIC"), slice_port()]}, "ports[0].protocol"),
    ("non-bool condition", {"endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": "yes"}}]},
     "endpoints[0].conditions.ready"),
]


@pytest.mark.parametrize(("case", "fields", "field"), BAD_PARTS, ids=[c[0] for c in BAD_PARTS])
def test_bad_part_is_reported_and_the_rest_kept(case: str, fields: dict[str, Any], field: str) -> None:
    """A bad endpoint or port is reported by field and the slice keeps one valid endpoint and port."""
    eps, problems = parse_endpoint_slice(endpoint_slice(**fields), source="eps.yaml")
    assert [e.address for e in eps.endpoints] == ["10.0.0.1"]
    assert [(p.name, p.port) for p in eps.ports] == [("http", 8080)]
    assert [p.field for p in problems] == [field]
    assert field in str(problems[0])


@pytest.mark.parametrize(
    ("change", "field"),
    [({"kind": "Endpoints"}, "kind"), ({"apiVersion": "v1"}, "kind"),
     ({"addressType": "IPv5"}, "addressType"),
     ({"metadata": {"namespace": "ns", "labels": {"kubernetes.io/service-name": "s"}}}, "metadata.name")],
)
def test_unservable_slice_raises(change: dict[str, Any], field: str) -> None:
    """A wrong kind, a missing name or an unknown addressType refuses the whole slice."""
    with pytest.raises(InvalidObject) as info:
        parse_endpoint_slice({**endpoint_slice(), **change})
    assert info.value.field == field


def test_fqdn_slice_has_no_endpoints() -> None:
    """An FQDN slice parses without endpoints (kube-proxy ignores them)."""
    eps, problems = parse_endpoint_slice(endpoint_slice(address_type="FQDN"))
    assert (eps.address_type, eps.endpoints, problems) == (None, (), [])


def test_address_type_is_the_family() -> None:
    """``addressType`` IPv6 parses as IPFamily.IPv6."""
    eps, _ = parse_endpoint_slice(endpoint_slice(address_type="IPv6", endpoints=[endpoint("fd00::1")]))
    assert eps.address_type is IPFamily.IPv6
