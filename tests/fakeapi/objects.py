"""Raw API objects (dicts, as the API server serves them) for the fake API server's tests."""

from __future__ import annotations

import datetime
from typing import Any

__all__ = ["endpoint_slice", "node", "rfc3339", "service"]


def rfc3339(epoch_s: float) -> str:
    """``epoch_s`` (wall-clock seconds) as the RFC 3339 text the API writes, with sub-seconds."""
    when = datetime.datetime.fromtimestamp(epoch_s, tz=datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def service(name: str, cluster_ip: str, *, namespace: str = "default", ports: tuple[int, ...] = (80,),
            labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A v1 Service with unnamed (one port) or ``p<port>`` (several) TCP ports."""
    port_specs = [{"port": p, "protocol": "TCP", "targetPort": p} if len(ports) == 1
                  else {"name": f"p{p}", "port": p, "protocol": "TCP", "targetPort": p} for p in ports]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip], "type": "ClusterIP",
                     "ports": port_specs, **spec}}


def endpoint_slice(service_name: str, addresses: list[str], port: int, *, namespace: str = "default",
                   name: str | None = None, port_name: str = "", node_name: str | None = None,
                   trigger_time: float | None = None, ready: bool = True,
                   labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A discovery.k8s.io/v1 EndpointSlice of IPv4 ``addresses`` on one TCP ``port``.

    Args:
        trigger_time: wall-clock seconds for ``endpoints.kubernetes.io/last-change-trigger-time``.
    """
    meta: dict[str, Any] = {"name": name or f"{service_name}-abc", "namespace": namespace,
                            "labels": {"kubernetes.io/service-name": service_name, **(labels or {})}}
    if trigger_time is not None:
        meta["annotations"] = {"endpoints.kubernetes.io/last-change-trigger-time": rfc3339(trigger_time)}
    endpoint: dict[str, Any] = {"conditions": {"ready": ready, "serving": ready, "terminating": False}}
    if node_name is not None:
        endpoint["nodeName"] = node_name
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta,
            "addressType": "IPv4",
            "endpoints": [{**endpoint, "addresses": [a]} for a in addresses],
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]}


def node(name: str, *, zone: str | None = None, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A v1 Node with an optional zone label and taints."""
    labels = {"kubernetes.io/hostname": name}
    if zone is not None:
        labels["topology.kubernetes.io/zone"] = zone
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {"taints": list(taints or [])}}
