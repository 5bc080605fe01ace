"""parse_objects: Lists, typed lists, v1 Endpoints conversion and per-object error isolation."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.model import EndpointSlice, Service, endpoints_to_slices, parse_objects
from kproxy.model.objects import MAX_LIST_DEPTH

from .builders import NODE, addresses, endpoint_slice, endpoints_v1, port, service, snapshot_of

SUBSET = {
    "addresses": [{"ip": "10.0.0.1", "nodeName": NODE}],
    "notReadyAddresses": [{"ip": "10.0.0.2", "nodeName": "elsewhere"}],
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "metrics", "port": 9100}],
}


def _slices(raw: dict[str, Any]) -> list[EndpointSlice]:
    result = parse_objects(raw, source="ep.yaml")
    assert result.problems == []
    return [o for o in result.objects if isinstance(o, EndpointSlice)]


def test_endpoints_addresses_are_ready_and_not_ready_addresses_not() -> None:
    """``addresses`` become ready endpoints and ``notReadyAddresses`` unready ones."""
    (eps,) = _slices(endpoints_v1(subsets=[SUBSET]))
    assert [(e.address, e.conditions.ready) for e in eps.endpoints] == [
        ("10.0.0.1", True), ("10.0.0.2", False)]


def test_endpoints_keep_node_name() -> None:
    """``nodeName`` of each address is kept, so locality works for converted Endpoints."""
    (eps,) = _slices(endpoints_v1(subsets=[SUBSET]))
    assert [e.node_name for e in eps.endpoints] == [NODE, "elsewhere"]


def test_endpoints_slice_belongs_to_the_service_of_the_same_name() -> None:
    """A converted slice is owned by the Service named like the Endpoints object."""
    (eps,) = _slices(endpoints_v1(name="web", subsets=[SUBSET]))
    assert str(eps.service) == "ns/web"


def test_endpoints_ports_match_service_ports_by_name() -> None:
    """Converted ports match service ports by name, each with its own endpoint port."""
    svc = service(ports=[port("http", 80, target=1), port("metrics", 9000)])
    snap = snapshot_of(svc, endpoints_v1(subsets=[SUBSET]))
    assert addresses(snap.get("ns/svc:http").endpoints) == ["10.0.0.1:8080", "10.0.0.2:8080"]  # type: ignore[union-attr]
    assert addresses(snap.get("ns/svc:metrics").endpoints) == ["10.0.0.1:9100", "10.0.0.2:9100"]  # type: ignore[union-attr]


def test_endpoints_split_by_family() -> None:
    """A subset with IPv4 and IPv6 addresses becomes one slice per family."""
    subset = {"addresses": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}], "ports": [{"port": 80}]}
    slices = _slices(endpoints_v1(subsets=[subset]))
    assert sorted((str(s.address_type), s.endpoints[0].address) for s in slices) == [
        ("IPv4", "10.0.0.1"), ("IPv6", "fd00::1")]


def test_endpoints_bad_address_is_skipped() -> None:
    """A bad address in an Endpoints subset is reported by field and the others kept."""
    subset = {"addresses": [{"ip": "nope"}, {"ip": "10.0.0.1"}], "ports": [{"port": 80}]}
    slice_dicts, problems = endpoints_to_slices(endpoints_v1(subsets=[subset]), source="ep.yaml")
    assert [p.field for p in problems] == ["subsets[0].addresses[0].ip"]
    assert [d["endpoints"][0]["addresses"] for d in slice_dicts] == [["10.0.0.1"]]


def test_kind_list_parses_every_item() -> None:
    """A ``kind: List`` yields each item in order."""
    raw = {"apiVersion": "v1", "kind": "List", "items": [service(), endpoint_slice()]}
    result = parse_objects(raw)
    assert [type(o) for o in result.objects] == [Service, EndpointSlice]
    assert result.problems == []


@pytest.mark.parametrize(
    ("kind", "item", "expected"),
    [("ServiceList", service(), Service), ("EndpointSliceList", endpoint_slice(), EndpointSlice)],
)
def test_typed_list_items_need_no_kind(kind: str, item: dict[str, Any], expected: type) -> None:
    """Items of a typed list (``ServiceList``) without ``kind`` take it from the list."""
    bare = {k: v for k, v in item.items() if k != "kind"}
    result = parse_objects({"apiVersion": "v1", "kind": kind, "items": [bare]})
    assert [type(o) for o in result.objects] == [expected]
    assert result.problems == []


def test_list_with_one_bad_item_parses_the_good_one() -> None:
    """One invalid item in a List is reported with its index, and the other item is parsed."""
    raw = {"kind": "List", "items": [service(name="bad", cluster_ip="nope"), service(name="good")]}
    result = parse_objects(raw, source="all.yaml")
    assert [o.name for o in result.objects] == ["good"]
    (problem,) = result.problems
    assert problem.field == "spec.clusterIP"
    assert "all.yaml" in str(problem) and "items[0]" in str(problem) and "Service ns/bad" in str(problem)


def test_unknown_kinds_are_ignored_without_error() -> None:
    """Kinds kproxy does not read are listed as ignored, not reported."""
    result = parse_objects({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})
    assert (result.objects, result.problems, result.ignored_kinds) == ([], [], ["Deployment"])


@pytest.mark.parametrize(("raw", "field"), [([1, 2], ""), ("text", ""), ({"metadata": {}}, "kind"),
                                            ({"kind": "List", "items": "x"}, "items")])
def test_non_objects_are_reported(raw: Any, field: str) -> None:
    """A document that is not an object, lacks a kind, or has non-list items is one problem."""
    result = parse_objects(raw, source="f.yaml")
    assert result.objects == []
    assert [p.field for p in result.problems] == [field]
    assert "f.yaml" in str(result.problems[0])


def test_empty_document_is_nothing() -> None:
    """An empty YAML document (None) yields nothing and no problem."""
    result = parse_objects(None)
    assert (result.objects, result.problems) == ([], [])


def test_deeply_nested_lists_are_reported_not_followed() -> None:
    """Lists nested beyond MAX_LIST_DEPTH are one problem instead of a RecursionError."""
    raw: dict[str, Any] = service()
    for _ in range(5000):
        raw = {"kind": "List", "items": [raw]}
    result = parse_objects(raw)
    assert result.objects == []
    assert [p.field for p in result.problems] == ["items"]
    assert str(MAX_LIST_DEPTH) in str(result.problems[0])


def test_real_endpoint_slices_win_over_converted_endpoints() -> None:
    """With both kinds in a dump, the Service's EndpointSlices are used and its Endpoints ignored."""
    from kproxy.model import EndpointSlice, NodeConfig, Service, build_snapshot, parse_objects

    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "http", "port": 80}]}}
    eps_slice = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": "web-abc", "namespace": "default",
                              "labels": {"kubernetes.io/service-name": "web"}},
                 "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
                 "endpoints": [{"addresses": ["10.1.0.1"],
                                "conditions": {"ready": False, "serving": True, "terminating": True}}]}
    endpoints = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": "default"},
                 "subsets": [{"notReadyAddresses": [{"ip": "10.1.0.1"}],
                              "ports": [{"name": "http", "port": 8080}]}]}
    result = parse_objects({"kind": "List", "items": [svc, eps_slice, endpoints]})
    services = [o for o in result.objects if isinstance(o, Service)]
    slices = [o for o in result.objects if isinstance(o, EndpointSlice)]
    info = next(iter(build_snapshot(services, slices, NodeConfig())))
    assert [ep.address for ep in info.cluster_endpoints] == ["10.1.0.1:8080"]


def test_converted_endpoints_serve_when_no_slice_exists() -> None:
    """An old dump with only v1 Endpoints is still served from them."""
    from kproxy.model import EndpointSlice, NodeConfig, Service, build_snapshot, parse_objects

    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"clusterIP": "10.0.0.1", "ports": [{"name": "http", "port": 80}]}}
    endpoints = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": "default"},
                 "subsets": [{"addresses": [{"ip": "10.1.0.2"}], "ports": [{"name": "http", "port": 8080}]}]}
    result = parse_objects({"kind": "List", "items": [svc, endpoints]})
    services = [o for o in result.objects if isinstance(o, Service)]
    slices = [o for o in result.objects if isinstance(o, EndpointSlice)]
    info = next(iter(build_snapshot(services, slices, NodeConfig())))
    assert [ep.address for ep in info.cluster_endpoints] == ["10.1.0.2:8080"]
