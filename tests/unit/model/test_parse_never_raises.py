"""Property: parse_objects never raises on any JSON-like value, and what it returns always builds.

The strategies are local to the model's tests (they draw raw API dicts, not model values);
``_mutations`` swaps, deletes or replaces any field of valid objects, which reaches far deeper
than purely random documents do.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.errors import InvalidObject
from kproxy.model import EndpointSlice, NodeConfig, ParseResult, Service, build_snapshot, parse_objects

from .builders import NODE, endpoint, endpoint_slice, endpoints_v1, port, service

_EDGE_TEXT = ["", "None", "TCP", "UDP", "SCTP", "IPv4", "IPv6", "FQDN", "Local", "Cluster", "ClientIP",
              "LoadBalancer", "NodePort", "ExternalName", "List", "ServiceList", "Service", "EndpointSlice",
              "Endpoints", "10.0.0.1", "::1", "fe80::1%eth0", "::ffff:10.0.0.1", "10.0.0.0/8", "0", "65536",
              "8080", "²", "١٢", "kubernetes.io/service-name"]
_KEYS = ["kind", "apiVersion", "metadata", "name", "namespace", "labels", "spec", "ports", "port",
         "targetPort", "protocol", "nodePort", "clusterIP", "clusterIPs", "type", "items", "endpoints",
         "addresses",
         "addressType", "conditions", "ready", "serving", "terminating", "subsets", "ip", "nodeName", "hints",
         "forZones", "forNodes", "externalIPs", "status", "loadBalancer", "ingress", "ipMode"]

_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**64), max_value=2**64)
            | st.floats(allow_nan=True) | st.text(max_size=10) | st.sampled_from(_EDGE_TEXT))


def _json_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    keys = st.sampled_from(_KEYS) | st.text(max_size=6)
    return st.recursive(
        _SCALARS,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=5),
        max_leaves=max_leaves,
    )


_VALID: list[dict[str, Any]] = [
    service(type="LoadBalancer", cluster_ips=["10.96.0.10", "fd00::10"], externalTrafficPolicy="Local",
            internalTrafficPolicy="Local", healthCheckNodePort=32000, externalIPs=["1.1.1.1"],
            loadBalancerSourceRanges=["1.0.0.0/8"], sessionAffinity="ClientIP",
            sessionAffinityConfig={"clientIP": {"timeoutSeconds": 30}},
            ports=[port("http", 80, target=8080, node_port=30080),
                   port("dns", 53, target="dns", protocol="UDP")],
            ingress=[{"ip": "5.5.5.5"}, {"ip": "6.6.6.6", "ipMode": "Proxy"}]),
    endpoint_slice(endpoints=[endpoint("10.0.0.1", node=NODE, zone="z", zone_hints=["z"], node_hints=[NODE]),
                              endpoint("10.0.0.2", ready=False, serving=True, terminating=True)]),
    endpoints_v1(subsets=[{"addresses": [{"ip": "10.0.0.1", "nodeName": NODE}],
                           "notReadyAddresses": [{"ip": "fd00::1"}],
                           "ports": [{"name": "http", "port": 8080}]}]),
]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _paths(child, (*prefix, i))
    return out


@st.composite
def _mutations(draw: st.DrawFn) -> Any:
    doc: Any = copy.deepcopy(draw(st.sampled_from([*_VALID, {"kind": "List", "items": _VALID}])))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        path = draw(st.sampled_from(_paths(doc)))
        if not path:
            return draw(_json_values(10))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_json_values(10))
    return doc


def _check(raw: Any) -> None:
    result = parse_objects(raw, source="fuzz")
    assert isinstance(result, ParseResult)
    assert all(isinstance(p, InvalidObject) for p in result.problems)
    assert all(isinstance(o, (Service, EndpointSlice)) for o in result.objects)
    build_snapshot([o for o in result.objects if isinstance(o, Service)],
                   [o for o in result.objects if isinstance(o, EndpointSlice)], NodeConfig(hostname=NODE))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_json_values())
def test_arbitrary_json_never_raises(raw: Any) -> None:
    """Any JSON-like value parses into a ParseResult whose objects build a Snapshot."""
    _check(raw)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_mutated_valid_objects_never_raise(raw: Any) -> None:
    """Valid objects with fields deleted or replaced by arbitrary values never make parse_objects raise."""
    _check(raw)


def test_unicode_digit_target_port_does_not_crash() -> None:
    """A targetPort of non-ASCII digits ("²") is a port name, not a crash in ``int()`` (regression)."""
    result = parse_objects(service(ports=[port("http", 80, target="²")]))
    assert [o.ports[0].target_port for o in result.objects if isinstance(o, Service)] == ["²"]
