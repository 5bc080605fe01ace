"""kube-proxy's endpoint categorisation, as a pure function.

Mirrors ``CategorizeEndpoints`` in kube-proxy's ``pkg/proxy/topology.go``: cluster endpoints
are the ready ones (narrowed by topology hints when every ready endpoint carries one and one
matches this node or zone), falling back to serving-and-terminating endpoints when none is
ready; local endpoints apply the same ready-then-terminating rule among this node's endpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar
from typing import Protocol as TypingProtocol

__all__ = ["Categorized", "EndpointLike", "TopologyMode", "categorize_endpoints", "topology_mode"]


class EndpointLike(TypingProtocol):
    """What categorisation reads of an endpoint."""

    @property
    def address(self) -> str: ...
    @property
    def is_local(self) -> bool: ...
    @property
    def ready(self) -> bool: ...
    @property
    def serving(self) -> bool: ...
    @property
    def terminating(self) -> bool: ...
    @property
    def zone_hints(self) -> frozenset[str]: ...
    @property
    def node_hints(self) -> frozenset[str]: ...


E = TypeVar("E", bound=EndpointLike)


class TopologyMode(StrEnum):
    """Which hints narrow the cluster endpoints (``""`` means none)."""

    NONE = ""
    PREFER_SAME_NODE = "PreferSameNode"
    PREFER_SAME_ZONE = "PreferSameZone"


@dataclass(frozen=True, slots=True, kw_only=True)
class Categorized(Generic[E]):
    """The result of :func:`categorize_endpoints`.

    Attributes:
        cluster: endpoints for Cluster traffic policy (empty if the port never uses it).
        local: endpoints for Local traffic policy (empty if the port never uses it).
        all_reachable: the union of both, sorted by address.
        has_any_endpoints: whether any usable endpoint exists anywhere in the cluster.
        topology: the topology mode that narrowed ``cluster``.
    """

    cluster: tuple[E, ...]
    local: tuple[E, ...]
    all_reachable: tuple[E, ...]
    has_any_endpoints: bool
    topology: TopologyMode


def topology_mode(endpoints: Sequence[EndpointLike], node_name: str, zone: str | None) -> TopologyMode:
    """Choose the topology mode from the hints of the ready endpoints (``topologyModeFromHints``).

    PreferSameNode when every ready endpoint has a node hint and one names this node;
    otherwise PreferSameZone when every ready endpoint has a zone hint and one names this
    node's zone; otherwise none. No ready endpoint means none.
    """
    ready = [ep for ep in endpoints if ep.ready]
    if not ready:
        return TopologyMode.NONE
    if all(ep.node_hints for ep in ready) and any(node_name in ep.node_hints for ep in ready):
        return TopologyMode.PREFER_SAME_NODE
    if all(ep.zone_hints for ep in ready) and zone and any(zone in ep.zone_hints for ep in ready):
        return TopologyMode.PREFER_SAME_ZONE
    return TopologyMode.NONE


def _available(ep: EndpointLike, mode: TopologyMode, node_name: str, zone: str | None) -> bool:
    if mode is TopologyMode.PREFER_SAME_NODE:
        return node_name in ep.node_hints
    if mode is TopologyMode.PREFER_SAME_ZONE:
        return zone in ep.zone_hints
    return True


def categorize_endpoints(
    endpoints: Sequence[E],
    *,
    uses_cluster: bool,
    uses_local: bool,
    node_name: str,
    zone: str | None,
) -> Categorized[E]:
    """Split a service port's endpoints as kube-proxy's ``CategorizeEndpoints`` does.

    Args:
        endpoints: every endpoint of the port, sorted by address.
        uses_cluster: the port ever uses Cluster policy (``UsesClusterEndpoints``).
        uses_local: the port ever uses Local policy (``UsesLocalEndpoints``).
        node_name: this node's name (for node hints).
        zone: this node's ``topology.kubernetes.io/zone`` label, or None.

    Returns:
        The categorised endpoints; every tuple keeps the input order.
    """
    cluster: tuple[E, ...] = ()
    local: tuple[E, ...] = ()
    has_any = False
    mode = TopologyMode.NONE
    if uses_cluster:
        mode = topology_mode(endpoints, node_name, zone)
        cluster = tuple(ep for ep in endpoints if ep.ready and _available(ep, mode, node_name, zone))
        if not cluster:
            cluster = tuple(ep for ep in endpoints if ep.serving and ep.terminating)
        has_any = bool(cluster)
    if not uses_local:
        return Categorized(cluster=cluster, local=(), all_reachable=cluster,
                           has_any_endpoints=has_any, topology=mode)
    local_ready = False
    local_terminating = False
    for ep in endpoints:
        if ep.ready:
            has_any = True
            local_ready = local_ready or ep.is_local
        elif ep.serving and ep.terminating:
            has_any = True
            local_terminating = local_terminating or ep.is_local
    if local_ready:
        local = tuple(ep for ep in endpoints if ep.is_local and ep.ready)
    elif local_terminating:
        local = tuple(ep for ep in endpoints if ep.is_local and ep.serving and ep.terminating)
    if not uses_cluster:
        return Categorized(cluster=(), local=local, all_reachable=local,
                           has_any_endpoints=has_any, topology=mode)
    merged = {ep.address: ep for ep in (*cluster, *local)}
    reachable = tuple(sorted(merged.values(), key=lambda ep: ep.address))
    return Categorized(cluster=cluster, local=local, all_reachable=reachable,
                       has_any_endpoints=has_any, topology=mode)
