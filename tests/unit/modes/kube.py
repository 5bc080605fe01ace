"""Build Services and EndpointSlices as API dicts, as kube-proxy's proxier_test.go does.

``service(...)`` mirrors ``makeTestService`` and ``endpoint_slice(...)`` mirrors
``makeTestEndpointSlice``; :func:`snapshot_of` parses them with :func:`kproxy.model.parse_objects`
and builds the Snapshot of kube-proxy's fake node (``test-node``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from kproxy.model import EndpointSlice, NodeConfig, Service, Snapshot, build_snapshot, parse_objects

TEST_NODE = "test-node"


def service(
    ns: str, name: str, cluster_ip: str, ports: Sequence[Mapping[str, Any]], **spec: Any
) -> dict[str, Any]:
    """A v1 Service; ``spec`` keys are camelCase spec fields, plus ``ingress`` (LB IPs)."""
    ingress = spec.pop("ingress", ())
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"clusterIP": cluster_ip, "ports": [dict(p) for p in ports], **spec},
    }
    if ingress:
        body["status"] = {"loadBalancer": {"ingress": [{"ip": ip} for ip in ingress]}}
    return body


def port(name: str, number: int, protocol: str = "TCP", **extra: Any) -> dict[str, Any]:
    """A Service port."""
    return {"name": name, "port": number, "protocol": protocol, **extra}


def ep(address: str, node: str | None = None, **conditions: bool) -> dict[str, Any]:
    """An EndpointSlice endpoint, on ``node``, with optional ready/serving/terminating."""
    out: dict[str, Any] = {"addresses": [address]}
    if node is not None:
        out["nodeName"] = node
    if conditions:
        out["conditions"] = dict(conditions)
    return out


def endpoint_slice(
    ns: str, svc: str, endpoints: Iterable[Mapping[str, Any]], ports: Sequence[tuple[str, int, str]],
    *, suffix: str = "1", family: str = "IPv4",
) -> dict[str, Any]:
    """An EndpointSlice of ``svc``; ``ports`` are ``(name, port, protocol)``."""
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": f"{svc}-{suffix}",
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": family,
        "endpoints": [dict(e) for e in endpoints],
        "ports": [{"name": n, "port": p, "protocol": proto} for n, p, proto in ports],
    }


def objects(docs: Iterable[Mapping[str, Any]]) -> tuple[list[Service], list[EndpointSlice]]:
    """Parse ``docs``; any problem fails the test."""
    result = parse_objects({"apiVersion": "v1", "kind": "List", "items": list(docs)})
    assert not result.problems, result.problems
    services = [o for o in result.objects if isinstance(o, Service)]
    slices = [o for o in result.objects if isinstance(o, EndpointSlice)]
    return services, slices


def snapshot_of(
    docs: Iterable[Mapping[str, Any]], *, hostname: str = TEST_NODE, revision: int = 1
) -> Snapshot:
    """The Snapshot of kube-proxy's fake node for ``docs``."""
    services, slices = objects(docs)
    return build_snapshot(services, slices, NodeConfig(hostname=hostname), revision=revision)


def next_snapshot(
    previous: Snapshot, docs: Iterable[Mapping[str, Any]], *, hostname: str = TEST_NODE
) -> Snapshot:
    """The Snapshot after ``previous`` for ``docs``, with ``changed`` naming what differs."""
    built = snapshot_of(docs, hostname=hostname, revision=previous.revision + 1)
    old, new = previous.ports, built.ports
    changed = frozenset(k[1] for k in set(old) | set(new) if old.get(k) != new.get(k))
    return replace(built, changed=changed)
