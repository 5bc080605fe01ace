"""Ingress and Istio DestinationRule: parsing, validation, and their place in the Snapshot."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.errors import InvalidObject
from kproxy.model import (
    HashAlgorithm,
    HashKey,
    NodeConfig,
    PathType,
    build_snapshot,
    parse_destination_rule,
    parse_ingress,
    parse_objects,
)
from kproxy.sources.base import Event, EventType
from kproxy.sync.tracker import ChangeTracker


def _ingress(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "web", "namespace": "shop", **meta}, "spec": spec}


def _path(path: str = "/", ptype: str = "Prefix", port: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"path": path, "pathType": ptype,
            "backend": {"service": {"name": "web", "port": port or {"number": 80}}}}


def test_rules_paths_and_backends_by_number_or_name() -> None:
    """Hosts, path types and a backend port given by number or by name are all read."""
    ing, problems = parse_ingress(_ingress({"rules": [
        {"host": "shop.example.com",
         "http": {"paths": [_path("/", "Prefix"), _path("/api", "Exact", {"name": "http"})]}},
        {"host": "*.example.com", "http": {"paths": [_path("/x", "ImplementationSpecific")]}}]}))
    assert problems == []
    assert [r.host for r in ing.rules] == ["shop.example.com", "*.example.com"]
    api = ing.rules[0].paths[1]
    assert api.path_type is PathType.Exact and api.backend.port_name == "http" and api.backend.port == "http"
    assert ing.rules[0].paths[0].backend.port == 80


def test_class_from_annotation_wins_over_ingress_class_name() -> None:
    """The legacy kubernetes.io/ingress.class annotation is read first, as ingress-nginx does."""
    ing, _ = parse_ingress(_ingress({"ingressClassName": "other", "defaultBackend": _path()["backend"]},
                                    annotations={"kubernetes.io/ingress.class": "nginx"}))
    assert ing.ingress_class == "nginx"
    ing2, _ = parse_ingress(_ingress({"ingressClassName": "other", "defaultBackend": _path()["backend"]}))
    assert ing2.ingress_class == "other"
    ing3, _ = parse_ingress(_ingress({"defaultBackend": _path()["backend"]}))
    assert ing3.ingress_class is None


@pytest.mark.parametrize(("bad", "field"), [
    (_path("api", "Prefix"), "spec.rules[0].http.paths[1].path"),
    (_path("/", "Regex"), "spec.rules[0].http.paths[1].pathType"),
    (_path("/", "Prefix", {"number": 70000}), "spec.rules[0].http.paths[1].backend.service.port.number"),
    (_path("/", "Prefix", {"number": 80, "name": "http"}),
     "spec.rules[0].http.paths[1].backend.service.port"),
    ({"path": "/", "pathType": "Prefix", "backend": {"resource": {"kind": "Bucket", "name": "b"}}},
     "spec.rules[0].http.paths[1].backend.resource"),
])
def test_a_bad_path_is_reported_with_file_object_and_field_and_the_rest_kept(bad: dict[str, Any],
                                                                            field: str) -> None:
    """The wrong path is left out and named; the good one is served."""
    ing, problems = parse_ingress(_ingress({"rules": [{"host": "a.example.com", "http": {
        "paths": [_path("/ok"), bad]}}]}), source="apps.yaml")
    assert [p.path for p in ing.rules[0].paths] == ["/ok"]
    assert [(p.source, p.obj, p.field) for p in problems] == [("apps.yaml", "Ingress shop/web", field)]


def test_an_ip_host_is_refused() -> None:
    """A rule host must be a DNS name, never an IP."""
    with pytest.raises(InvalidObject, match=r"spec.rules\[0\].host"):
        parse_ingress(_ingress({"rules": [{"host": "10.0.0.1", "http": {"paths": [_path()]}}]}))


def test_an_ingress_with_nothing_to_serve_is_refused() -> None:
    """Neither rules nor a default backend: the object is rejected."""
    with pytest.raises(InvalidObject):
        parse_ingress(_ingress({}))


def test_one_bad_object_never_stops_the_others() -> None:
    """In a List, a broken Ingress is reported and the next one is parsed."""
    result = parse_objects({"kind": "List", "items": [
        _ingress({"rules": [{"host": "1.2.3.4"}]}),
        {**_ingress({"defaultBackend": _path()["backend"]}), "metadata": {"name": "good"}}]}, source="f.yaml")
    assert [o.name for o in result.objects] == ["good"]
    assert len(result.problems) == 1 and result.problems[0].source == "f.yaml"


def _dr(spec: dict[str, Any], api: str = "networking.istio.io/v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "DestinationRule", "metadata": {"name": "web", "namespace": "shop"},
            "spec": spec}


def test_destination_rule_consistent_hash_variants() -> None:
    """Each consistentHash key and algorithm is read; port level takes precedence over top level."""
    dr, problems = parse_destination_rule(_dr({"host": "web", "trafficPolicy": {
        "loadBalancer": {"consistentHash": {"httpCookie": {"name": "u", "path": "/", "ttl": "60s"},
                                            "maglev": {"tableSize": 251}}},
        "portLevelSettings": [{"port": {"number": 8080},
                               "loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}}}]}}))
    assert problems == []
    top = dr.policy_for(80)
    assert top is not None and top.consistent_hash is not None
    assert top.consistent_hash.key is HashKey.COOKIE and top.consistent_hash.cookie_ttl_s == 60
    assert top.consistent_hash.algorithm is HashAlgorithm.MAGLEV and top.consistent_hash.size == 251
    port = dr.policy_for(8080)
    assert port is not None and port.consistent_hash is not None
    assert port.consistent_hash.key is HashKey.HEADER and port.consistent_hash.name == "x-user"
    assert port.consistent_hash.algorithm is HashAlgorithm.RING_HASH
    assert dr.fqdn() == "web.shop.svc.cluster.local"


def test_destination_rule_with_two_hash_keys_reports_the_field() -> None:
    """Two keys at once is ambiguous: the policy is left out and the field named."""
    dr, problems = parse_destination_rule(_dr({"host": "web", "trafficPolicy": {"loadBalancer": {
        "consistentHash": {"httpHeaderName": "a", "useSourceIp": True}}}}), source="dr.yaml")
    assert dr.load_balancer is None
    assert [(p.source, p.field) for p in problems] == [
        ("dr.yaml", "spec.trafficPolicy.loadBalancer.consistentHash")]


def test_destination_rule_older_api_versions_are_read() -> None:
    """v1beta1 and v1alpha3 carry the same fields."""
    dr, _ = parse_destination_rule(_dr({"host": "web"}, api="networking.istio.io/v1beta1"))
    assert dr.host == "web"
    with pytest.raises(InvalidObject, match="apiVersion"):
        parse_destination_rule(_dr({"host": "web"}, api="example.com/v1"))


def test_ingresses_and_rules_travel_in_the_snapshot() -> None:
    """The tracker hands the HTTP plane's objects out with each Snapshot, like build_snapshot."""
    ing, _ = parse_ingress(_ingress({"defaultBackend": _path()["backend"]}))
    dr, _ = parse_destination_rule(_dr({"host": "web"}))
    tracker = ChangeTracker(NodeConfig(hostname="n"))
    tracker.apply_all([Event(type=EventType.ADDED, obj=ing), Event(type=EventType.ADDED, obj=dr)])
    assert tracker.pending_count == 1
    snap = tracker.checkout()
    assert snap.ingresses == (ing,) and snap.destination_rules == (dr,)
    assert snap.same_state(build_snapshot([], [], NodeConfig(hostname="n"), ingresses=[ing],
                                          destination_rules=[dr]))
    assert tracker.pending_count == 0
    tracker.apply(Event(type=EventType.DELETED, obj=ing))
    assert tracker.pending_count == 1 and tracker.checkout().ingresses == ()
