"""Hypothesis strategies of snapshot histories for the partial-sync properties (KEP-3453).

Used by :mod:`tests.unit.modes.iptables.test_partial` (against the restore model) and by
``tests/kernel/test_iptables_partial.py`` (through the iptables mode, on both executors).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kproxy.model import Snapshot
from kproxy.modes.iptables import IptablesConfig
from tests.unit.modes.kube import TEST_NODE, endpoint_slice, ep, next_snapshot, port, service, snapshot_of

# A tiny threshold so that histories cross kube-proxy's large-cluster mode both ways.
CONFIG = IptablesConfig(node_ips=("192.168.0.2",), cluster_cidr=("10.0.0.0/8",), large_cluster_threshold=4)
POOL = ("10.1.0.1", "10.1.0.2", "10.2.0.1", "10.2.0.2")
CONDITIONS = ({}, {"ready": False, "serving": True, "terminating": True}, {"ready": False, "serving": False})


@st.composite
def service_states(draw: st.DrawFn, index: int) -> list[dict[str, Any]]:
    """One Service (or none) and its EndpointSlice, with random policies and endpoints."""
    if not draw(st.booleans()):
        return []
    kind = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
    protocols = draw(st.lists(st.sampled_from(["TCP", "UDP"]), min_size=1, max_size=2, unique=True))
    ports = [port(f"p{i}", 80 + i, proto) for i, proto in enumerate(protocols)]
    if kind != "ClusterIP":
        for i, p in enumerate(ports):
            p["nodePort"] = 30000 + index * 10 + i
    spec: dict[str, Any] = {"type": kind}
    if draw(st.booleans()):
        spec["internalTrafficPolicy"] = "Local"
    if kind != "ClusterIP" and draw(st.booleans()):
        spec["externalTrafficPolicy"] = "Local"
        spec["healthCheckNodePort"] = 32000 + index
    if draw(st.booleans()):
        spec["externalIPs"] = [f"192.168.99.{index + 1}"]
    if kind == "LoadBalancer":
        spec["ingress"] = [f"1.2.3.{index + 1}"]
        if draw(st.booleans()):
            spec["loadBalancerSourceRanges"] = draw(st.sampled_from([["203.0.113.0/25"], ["192.168.0.0/16"]]))
    if draw(st.booleans()):
        spec["sessionAffinity"] = "ClientIP"
    svc = service(f"ns{index}", f"svc{index}", f"172.30.0.{index + 1}", ports, **spec)
    eps = [ep(ip, TEST_NODE if draw(st.booleans()) else "other", **draw(st.sampled_from(CONDITIONS)))
           for ip in draw(st.lists(st.sampled_from(POOL), unique=True, max_size=4))]
    if not eps:
        return [svc]
    slice_ports = [(f"p{i}", 8080 + i, proto) for i, proto in enumerate(protocols)]
    return [svc, endpoint_slice(f"ns{index}", f"svc{index}", eps, slice_ports)]


@st.composite
def histories(draw: st.DrawFn) -> list[Snapshot]:
    """Snapshots of a cluster of four Services, one Service changing per step, each with
    ``changed`` set against the snapshot before."""
    services = [draw(service_states(i)) for i in range(4)]
    out = [snapshot_of(doc for docs in services for doc in docs)]
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        index = draw(st.integers(min_value=0, max_value=3))
        services[index] = draw(service_states(index))
        out.append(next_snapshot(out[-1], [doc for docs in services for doc in docs]))
    return out
