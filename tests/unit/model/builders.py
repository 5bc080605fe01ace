"""Small builders of API dicts (v1 Service, discovery.k8s.io/v1 EndpointSlice, v1 Endpoints) for model tests.

Every builder returns a plain dict shaped as the API server returns it, with only the fields
given; omitted fields are left for the model to default. ``parsed``/``snapshot_of`` run the
model over such dicts and insist nothing was reported, so a test's setup cannot fail silently.
"""

from __future__ import annotations

from typing import Any

from kproxy.model import (
    LABEL_SERVICE_NAME,
    EndpointSlice,
    NodeConfig,
    Service,
    Snapshot,
    build_snapshot,
    parse_objects,
)

Obj = dict[str, Any]

NODE = "node-a"
OTHER_NODE = "node-b"


def port(name: str = "http", number: int = 80, *, target: Any = None, protocol: str | None = None,
         node_port: int | None = None) -> Obj:
    """One ``spec.ports`` entry; ``None`` arguments are left out."""
    out: Obj = {"port": number}
    if name:
        out["name"] = name
    if target is not None:
        out["targetPort"] = target
    if protocol is not None:
        out["protocol"] = protocol
    if node_port is not None:
        out["nodePort"] = node_port
    return out


def service(name: str = "svc", namespace: str = "ns", *, cluster_ip: str | None = "10.96.0.10",
            cluster_ips: list[str] | None = None, type: str | None = None,
            ports: list[Any] | None = None, labels: dict[str, str] | None = None,
            ingress: list[Obj] | None = None, **spec: Any) -> Obj:
    """A v1 Service dict; ``spec`` keywords are copied into ``spec`` verbatim (camelCase keys)."""
    body: Obj = dict(spec)
    if cluster_ip is not None:
        body["clusterIP"] = cluster_ip
    if cluster_ips is not None:
        body["clusterIPs"] = cluster_ips
        if cluster_ips and "clusterIP" in body:
            body["clusterIP"] = cluster_ips[0]  # the API keeps clusterIP == clusterIPs[0]
    if type is not None:
        body["type"] = type
    body["ports"] = [port()] if ports is None else ports
    meta: Obj = {"name": name, "namespace": namespace}
    if labels is not None:
        meta["labels"] = labels
    out: Obj = {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": body}
    if ingress is not None:
        out["status"] = {"loadBalancer": {"ingress": ingress}}
    return out


def endpoint(ip: str, *, ready: bool | None = None, serving: bool | None = None,
             terminating: bool | None = None, node: str | None = None, zone: str | None = None,
             zone_hints: list[str] | None = None, node_hints: list[str] | None = None,
             extra_addresses: list[str] | None = None) -> Obj:
    """One ``endpoints`` entry of a slice; unset conditions are left for the model to default."""
    out: Obj = {"addresses": [ip, *(extra_addresses or [])]}
    conditions = {k: v for k, v in (("ready", ready), ("serving", serving),
                                     ("terminating", terminating)) if v is not None}
    if conditions:
        out["conditions"] = conditions
    if node is not None:
        out["nodeName"] = node
    if zone is not None:
        out["zone"] = zone
    hints: Obj = {}
    if zone_hints is not None:
        hints["forZones"] = [{"name": z} for z in zone_hints]
    if node_hints is not None:
        hints["forNodes"] = [{"name": n} for n in node_hints]
    if hints:
        out["hints"] = hints
    return out


def slice_port(name: str | None = "http", number: int = 8080, *, protocol: str | None = None) -> Obj:
    """One ``ports`` entry of a slice; ``name=None`` leaves the name out."""
    out: Obj = {"port": number}
    if name is not None:
        out["name"] = name
    if protocol is not None:
        out["protocol"] = protocol
    return out


def endpoint_slice(name: str = "svc-abc", namespace: str = "ns", *, service_name: str | None = "svc",
                   address_type: str = "IPv4", endpoints: list[Any] | None = None,
                   ports: list[Any] | None = None) -> Obj:
    """A discovery.k8s.io/v1 EndpointSlice dict owned by ``service_name`` (None: no label)."""
    labels = {} if service_name is None else {LABEL_SERVICE_NAME: service_name}
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "addressType": address_type,
        "endpoints": [endpoint("10.0.0.1")] if endpoints is None else endpoints,
        "ports": [slice_port()] if ports is None else ports,
    }


def endpoints_v1(name: str = "svc", namespace: str = "ns", *, subsets: list[Obj]) -> Obj:
    """A v1 Endpoints dict."""
    return {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": name, "namespace": namespace},
            "subsets": subsets}


def parsed(*objs: Obj) -> list[Service | EndpointSlice]:
    """Parse ``objs`` and fail the test if anything was reported."""
    out: list[Service | EndpointSlice] = []
    for obj in objs:
        result = parse_objects(obj, source="test")
        assert result.problems == [], [str(p) for p in result.problems]
        out.extend(result.objects)
    return out


def snapshot_of(*objs: Obj, node: NodeConfig | None = None) -> Snapshot:
    """Parse ``objs`` (nothing may be reported) and build the Snapshot for ``node``."""
    models = parsed(*objs)
    return build_snapshot(
        [o for o in models if isinstance(o, Service)],
        [o for o in models if isinstance(o, EndpointSlice)],
        node or NodeConfig(hostname=NODE),
    )


def addresses(endpoints: Any) -> list[str]:
    """``ip:port`` of each endpoint, in order."""
    return [ep.address for ep in endpoints]
