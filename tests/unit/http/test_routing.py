"""Ingress routing as ingress-nginx lays it out: classes, servers, locations, backends from the Snapshot."""

from __future__ import annotations

import random
from typing import Any

from kproxy.model import (
    DestinationRule,
    EndpointSlice,
    Ingress,
    NodeConfig,
    Service,
    build_snapshot,
    parse_objects,
)
from kproxy.modes.userspace.http.choosers import Attempt, IngressChooser
from kproxy.modes.userspace.http.hashby import HashByRequest
from kproxy.modes.userspace.http.routing import DEFAULT_SERVER, RouteTable

A = "nginx.ingress.kubernetes.io/"


def _svc(name: str, ip: str, ips: list[str], port_name: str = "http") -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "ns"},
             "spec": {"clusterIP": ip, "ports": [{"name": port_name, "port": 80, "targetPort": 8080}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": name}},
             "addressType": "IPv4", "ports": [{"name": port_name, "port": 8080}],
             "endpoints": [{"addresses": [a], "conditions": {"ready": True}} for a in ips]}]


def _ing(name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None,
         created: str = "2024-01-01T00:00:00Z") -> dict[str, Any]:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations or {},
                         "creationTimestamp": created}, "spec": spec}


def _p(path: str, ptype: str, svc: str, port: Any = 80) -> dict[str, Any]:
    return {"path": path, "pathType": ptype, "backend": {"service": {
        "name": svc, "port": {"number": port} if isinstance(port, int) else {"name": port}}}}


def _table(*docs: dict[str, Any], ingress_class: str = "nginx") -> RouteTable:
    objects = parse_objects({"kind": "List", "items": list(docs)}).objects
    snap = build_snapshot([o for o in objects if isinstance(o, Service)],
                          [o for o in objects if isinstance(o, EndpointSlice)], NodeConfig(hostname="n"),
                          ingresses=[o for o in objects if isinstance(o, Ingress)],
                          destination_rules=[o for o in objects if isinstance(o, DestinationRule)])
    return RouteTable.build(snap, ingress_class=ingress_class)


BASE = [*_svc("a", "10.96.0.1", ["10.0.0.1", "10.0.0.2"]), *_svc("b", "10.96.0.2", ["10.0.1.1"])]


def test_longest_prefix_wins_and_exact_beats_prefix() -> None:
    """``/api/v1`` beats ``/api`` and ``/``; Exact ``/api`` beats Prefix ``/api`` for that path."""
    t = _table(*BASE, _ing("x", {"rules": [{"host": "h.example.com", "http": {"paths": [
        _p("/", "Prefix", "a"), _p("/api", "Prefix", "b"), _p("/api/v1", "Prefix", "a", "http"),
        _p("/api", "Exact", "a")]}}]}))
    route = t.route("h.example.com", "/api/v1/users")
    assert route.location is not None and route.location.path == "/api/v1"
    exact = t.route("H.Example.com:8080", "/api")
    assert exact.location is not None and exact.location.path_type == "Exact" and exact.backend is not None
    assert exact.backend.name == "ns-a-80"
    assert t.route("h.example.com", "/api/x").backend.name == "ns-b-80"  # type: ignore[union-attr]
    assert t.route("h.example.com", "/apix").backend.name == "ns-a-80"  # type: ignore[union-attr]


def test_backend_by_port_name_is_named_after_the_name_and_finds_endpoints() -> None:
    """An Ingress naming the Service port by name gets upstream ``ns-a-http`` with the same endpoints."""
    t = _table(*BASE, _ing("x", {"rules": [{"http": {"paths": [_p("/", "Prefix", "a", "http")]}}]}))
    backend = t.route("anything", "/").backend
    assert backend is not None and backend.name == "ns-a-http"
    assert backend.nodes == ("10.0.0.1:8080", "10.0.0.2:8080")


def test_default_backend_serves_the_default_server_and_hosts_without_root() -> None:
    """spec.defaultBackend is the ``_`` server's ``/`` and a host's ``/`` when the host has none."""
    t = _table(*BASE, _ing("x", {"defaultBackend": {"service": {"name": "b", "port": {"number": 80}}},
                                 "rules": [{"host": "h.example.com",
                                            "http": {"paths": [_p("/x", "Exact", "a")]}}]}))
    assert t.route("unknown.org", "/whatever").backend.name == "ns-b-80"  # type: ignore[union-attr]
    assert t.route("h.example.com", "/y").backend.name == "ns-b-80"  # type: ignore[union-attr]
    assert t.route("h.example.com", "/x").backend.name == "ns-a-80"  # type: ignore[union-attr]


def test_nothing_matches_gives_the_default_server_without_location() -> None:
    """No rule for the host and no default backend: the default server has no location (404)."""
    t = _table(*BASE, _ing("x", {"rules": [{"host": "h.example.com",
                                            "http": {"paths": [_p("/", "Prefix", "a")]}}]}))
    route = t.route("other.example.com", "/")
    assert route.server == DEFAULT_SERVER and route.location is None


def test_other_classes_are_not_served_and_classless_ones_are() -> None:
    """A haproxy Ingress is ignored; one with no class is served as the default class."""
    foreign = _ing("f", {"ingressClassName": "haproxy", "rules": [
        {"host": "f.example.com", "http": {"paths": [_p("/", "Prefix", "a")]}}]})
    plain = _ing("p", {"rules": [{"host": "p.example.com", "http": {"paths": [_p("/", "Prefix", "a")]}}]})
    t = _table(*BASE, foreign, plain)
    assert t.route("f.example.com", "/").location is None
    assert t.route("p.example.com", "/").location is not None
    assert _table(*BASE, foreign, ingress_class="haproxy").route("f.example.com", "/").location is not None


def test_wildcard_host_matches_deeper_names_and_exact_host_wins() -> None:
    """``*.example.com`` takes ``a.b.example.com``; an exact server takes precedence."""
    t = _table(*BASE, _ing("x", {"rules": [
        {"host": "*.example.com", "http": {"paths": [_p("/", "Prefix", "a")]}},
        {"host": "b.example.com", "http": {"paths": [_p("/", "Prefix", "b")]}}]}))
    assert t.route("a.b.example.com", "/").server == "*.example.com"
    assert t.route("b.example.com", "/").backend.name == "ns-b-80"  # type: ignore[union-attr]


def test_the_first_ingress_with_affinity_defines_it_and_only_its_locations_set_cookies() -> None:
    """Two Ingresses on one Service: the older one's cookie name wins; locations list its paths only."""
    old = _ing("old", {"rules": [{"host": "h.example.com", "http": {"paths": [_p("/", "Prefix", "a")]}}]},
               {A + "affinity": "cookie", A + "session-cookie-name": "first"}, created="2024-01-01T00:00:00Z")
    new = _ing("new", {"rules": [{"host": "i.example.com", "http": {"paths": [_p("/app", "Prefix", "a")]}}]},
               {A + "affinity": "cookie", A + "session-cookie-name": "second"},
               created="2024-02-01T00:00:00Z")
    plain = _ing("plain", {"rules": [{"host": "j.example.com", "http": {"paths": [_p("/", "Prefix", "a")]}}]},
                 created="2024-03-01T00:00:00Z")
    backend = _table(*BASE, new, plain, old).backends["ns-a-80"]
    assert backend.affinity is not None and backend.affinity.name == "first"
    assert dict(backend.locations) == {"h.example.com": {"/"}, "i.example.com": {"/app"}}


def _attempt(host: str, path: str, cookie: str | None = None, **kw: Any) -> Attempt:
    return Attempt(host=host, default_server=False, location_path=path, cookie_header=cookie,
                   request=HashByRequest(request_uri=path, remote_addr="192.0.2.1"), now_s=1e9, **kw)


def test_chooser_sets_the_cookie_only_on_declared_locations() -> None:
    """The same backend through a plain Ingress's host is balanced but gets no cookie."""
    aff = _ing("aff", {"rules": [{"host": "h.example.com", "http": {"paths": [_p("/", "Prefix", "a")]}}]},
               {A + "affinity": "cookie"})
    plain = _ing("plain", {"rules": [{"host": "j.example.com", "http": {"paths": [_p("/", "Prefix", "a")]}}]},
                 created="2025-01-01T00:00:00Z")
    t = _table(*BASE, aff, plain)
    chooser = IngressChooser(t.backends["ns-a-80"], rng=random.Random(3), worker_pid=1)
    assert chooser.choose(_attempt("h.example.com", "/")).set_cookies
    assert chooser.choose(_attempt("j.example.com", "/")).set_cookies == ()


def test_round_robin_without_affinity_and_hash_by_is_consistent() -> None:
    """No annotations: a rotation over the endpoints; upstream-hash-by: the same URI, the same node."""
    rr = _table(*BASE, _ing("x", {"rules": [{"http": {"paths": [_p("/", "Prefix", "a")]}}]}))
    chooser = IngressChooser(rr.backends["ns-a-80"], rng=random.Random(1), worker_pid=1)
    picks = [chooser.choose(_attempt("h", "/")).node for _ in range(4)]
    assert picks == ["10.0.0.1:8080", "10.0.0.2:8080"] * 2
    hb = _table(*BASE, _ing("x", {"rules": [{"http": {"paths": [_p("/", "Prefix", "a")]}}]},
                            {A + "upstream-hash-by": "$request_uri"}))
    hchooser = IngressChooser(hb.backends["ns-a-80"], rng=random.Random(1), worker_pid=1)
    assert len({hchooser.choose(_attempt("h", "/same")).node for _ in range(10)}) == 1


def test_round_robin_skips_tried_nodes_on_a_retry() -> None:
    """A retry never goes back to a node this request already tried while others remain."""
    rr = _table(*BASE, _ing("x", {"rules": [{"http": {"paths": [_p("/", "Prefix", "a")]}}]}))
    chooser = IngressChooser(rr.backends["ns-a-80"], rng=random.Random(1), worker_pid=1)
    first = chooser.choose(_attempt("h", "/")).node
    assert first is not None
    for _ in range(5):
        assert chooser.choose(_attempt("h", "/", last_failed=True, tried=[first])).node != first


def test_an_internal_traffic_policy_local_service_keeps_every_ready_endpoint() -> None:
    """ingress-nginx reads the EndpointSlices itself: internalTrafficPolicy Local (no endpoint on this
    node) does not empty the upstream, which would answer 503."""
    svc = _svc("c", "10.96.0.3", ["10.0.2.1", "10.0.2.2"])
    svc[0]["spec"]["internalTrafficPolicy"] = "Local"
    t = _table(*svc, _ing("x", {"rules": [{"http": {"paths": [_p("/", "Prefix", "c")]}}]}))
    backend = t.route("anything", "/").backend
    assert backend is not None and backend.nodes == ("10.0.2.1:8080", "10.0.2.2:8080")
