"""Snapshots rendered by the ebpf mode's renderer (Cilium's agent layout), for the socket-LB
tests that load them into the emulated and the Linux kernel."""

from __future__ import annotations

from typing import Any

from kproxy.model import NodeConfig, Snapshot, build_snapshot
from kproxy.modes.ebpf import EbpfConfig
from tests.unit.modes.kube import TEST_NODE, endpoint_slice, ep, objects, port, service

NODE = EbpfConfig(node_ips=("192.168.1.10",))


def web_snapshot(endpoints: tuple[str, ...], *, revision: int = 1, affinity: bool = False) -> Snapshot:
    """ns/web (10.96.0.10:80 -> 8080) with ``endpoints``, and ns/empty (10.96.0.12:80) with none."""
    extra: dict[str, Any] = {}
    if affinity:
        extra = {"sessionAffinity": "ClientIP",
                 "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}}}
    docs = [
        service("ns", "web", "10.96.0.10", [port("http", 80)], **extra),
        endpoint_slice("ns", "web", [ep(a, TEST_NODE) for a in endpoints], [("http", 8080, "TCP")]),
        service("ns", "empty", "10.96.0.12", [port("http", 80)]),
    ]
    services, slices = objects(docs)
    return build_snapshot(services, slices, NodeConfig(hostname=TEST_NODE), revision=revision)
