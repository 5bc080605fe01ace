"""The per-node Snapshot: every service port with its endpoints already categorised.

Building it follows kube-proxy's change trackers: ``serviceToServiceMap`` (which Services are
proxied, one entry per port and IP family), ``endpointslicecache.go`` (merging a Service's
slices: endpoint ports matched to service ports by name and protocol, never by targetPort;
only ``addresses[0]``; one endpoint per ``ip:port`` with the non-terminating copy preferred;
sorted by ``ip:port``) and ``CategorizeEndpoints`` (see :mod:`kproxy.model.topology`).
Every mode reads the Snapshot; none re-derives it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from kproxy.model.destinationrule import DestinationRule
from kproxy.model.endpointslice import EndpointSlice, SliceEndpoint
from kproxy.model.ingress import Ingress
from kproxy.model.names import IPFamily, NamespacedName, Protocol, ServicePortName, join_host_port
from kproxy.model.service import LABEL_SERVICE_PROXY_NAME, Service, ServicePort, ServiceType
from kproxy.model.topology import Categorized, TopologyMode, categorize_endpoints

__all__ = [
    "Endpoint",
    "NodeConfig",
    "ServicePortInfo",
    "Snapshot",
    "build_service_ports",
    "build_snapshot",
    "skip_reason",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    """What kproxy knows of the node it proxies for.

    Attributes:
        hostname: the node name (``--hostname-override``); endpoints whose ``nodeName``
            equals it are local. ``""`` means no endpoint is local.
        zone: the node's ``topology.kubernetes.io/zone`` label, or None.
        ip_families: the families proxied, primary first (kube-proxy runs one proxier per
            family on a dual-stack node).
        service_proxy_name: Services labelled ``service.kubernetes.io/service-proxy-name``
            with this value are ours; any other value (or any value, when None, as kube-proxy)
            belongs to another proxy.
    """

    hostname: str = ""
    zone: str | None = None
    ip_families: tuple[IPFamily, ...] = (IPFamily.IPv4, IPFamily.IPv6)
    service_proxy_name: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """One endpoint of one service port on this node (kube-proxy's ``BaseEndpointInfo``).

    Attributes:
        ip: canonical IP address.
        port: the endpoint port, 1..65535.
        is_local: the endpoint runs on this node.
        ready, serving, terminating: its conditions.
        zone_hints, node_hints: topology hints.
        node_name, zone: where it runs, when known.
    """

    ip: str
    port: int
    is_local: bool = False
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    zone_hints: frozenset[str] = frozenset()
    node_hints: frozenset[str] = frozenset()
    node_name: str | None = None
    zone: str | None = None
    #: ``ip:port`` (``[ip]:port`` for IPv6): the endpoint's identity and sort key. Made once
    #: (a render of 100,000 endpoints reads it half a million times).
    address: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "address", join_host_port(self.ip, self.port))

    def __str__(self) -> str:
        return self.address


@dataclass(frozen=True, slots=True, kw_only=True)
class ServicePortInfo:
    """Everything a mode needs about one service port in one IP family.

    Attributes:
        name: the ServicePortName.
        family: the IP family of every address below.
        cluster_ip: the ClusterIP of this family.
        port: the service port; ``protocol`` its protocol; ``node_port`` 0 when none.
        target_port: the port's ``targetPort`` (informational; endpoints carry their port).
        external_ips, load_balancer_ips: addresses of this family, as kube-proxy filters them.
        load_balancer_source_ranges: CIDRs of this family.
        session_affinity_timeout_s: ClientIP affinity timeout in seconds, None without affinity.
        external_policy_local, internal_policy_local: the traffic policies.
        health_check_node_port: 0 when none.
        endpoints: every endpoint, sorted by ``ip:port``.
        cluster_endpoints, local_endpoints, all_reachable_endpoints, has_any_endpoints,
        topology: the categorisation of ``endpoints`` for this node.
        annotations: the Service's annotations some mode reads (``service.cilium.io/*``, for the
            ebpf mode), sorted ``(key, value)`` pairs; the others are left out so that an
            unrelated annotation does not mark the port changed.
    """

    name: ServicePortName
    family: IPFamily
    cluster_ip: str
    port: int
    protocol: Protocol
    target_port: int | str
    node_port: int = 0
    service_type: ServiceType = ServiceType.ClusterIP
    external_ips: tuple[str, ...] = ()
    load_balancer_ips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    session_affinity_timeout_s: int | None = None
    external_policy_local: bool = False
    internal_policy_local: bool = False
    health_check_node_port: int = 0
    endpoints: tuple[Endpoint, ...] = ()
    cluster_endpoints: tuple[Endpoint, ...] = ()
    local_endpoints: tuple[Endpoint, ...] = ()
    all_reachable_endpoints: tuple[Endpoint, ...] = ()
    has_any_endpoints: bool = False
    topology: TopologyMode = TopologyMode.NONE
    annotations: tuple[tuple[str, str], ...] = ()
    #: the port's ``appProtocol`` (``""`` when unset); the HTTP plane reads Istio's ``http`` from it.
    app_protocol: str = ""

    def annotation(self, key: str) -> str | None:
        """The value of annotation ``key`` (one of those kept), or None."""
        for name, value in self.annotations:
            if name == key:
                return value
        return None

    @property
    def externally_accessible(self) -> bool:
        """A NodePort, a load-balancer IP or an external IP reaches this port."""
        return bool(self.node_port or self.load_balancer_ips or self.external_ips)

    @property
    def uses_cluster_endpoints(self) -> bool:
        """kube-proxy's ``UsesClusterEndpoints``."""
        return not self.internal_policy_local or self.externally_accessible

    @property
    def uses_local_endpoints(self) -> bool:
        """kube-proxy's ``UsesLocalEndpoints``."""
        return self.internal_policy_local or (
            self.external_policy_local and self.externally_accessible
        )

    @property
    def internal_endpoints(self) -> tuple[Endpoint, ...]:
        """Endpoints for traffic to the ClusterIP (internalTrafficPolicy applied)."""
        return self.local_endpoints if self.internal_policy_local else self.cluster_endpoints

    @property
    def external_endpoints(self) -> tuple[Endpoint, ...]:
        """Endpoints for traffic to NodePorts, external and LB IPs (externalTrafficPolicy)."""
        return self.local_endpoints if self.external_policy_local else self.cluster_endpoints

    @property
    def session_affinity(self) -> bool:
        """ClientIP session affinity is on."""
        return self.session_affinity_timeout_s is not None


#: The annotation prefixes :attr:`ServicePortInfo.annotations` keeps (Cilium's, for the ebpf mode).
MODE_ANNOTATION_PREFIXES = ("service.cilium.io/",)


def skip_reason(service: Service, node: NodeConfig) -> str | None:
    """Why kube-proxy would ignore ``service`` entirely, or None if it proxies it.

    Mirrors ``proxyutil.ShouldSkipService`` plus the informer's label selector
    (``service.kubernetes.io/service-proxy-name`` and ``service.kubernetes.io/headless``).
    """
    owner = service.label(LABEL_SERVICE_PROXY_NAME)
    if owner is not None and owner != node.service_proxy_name:
        return f"owned by service proxy {owner!r}"
    if service.type is ServiceType.ExternalName:
        return "type ExternalName"
    if service.headless:
        return "headless (clusterIP: None)"
    if not service.cluster_ips:
        return "no ClusterIP"
    if not service.ports:
        return "no ports"
    return None


def _merge_endpoints(
    port: ServicePort, slices: Iterable[EndpointSlice], family: IPFamily, node: NodeConfig
) -> tuple[Endpoint, ...]:
    chosen: dict[str, tuple[tuple[bool, bool, bool], Endpoint]] = {}
    for eps in sorted(slices, key=lambda s: s.name):
        if eps.address_type is not family:
            continue
        for slice_port in eps.ports:
            if slice_port.name != port.name or slice_port.protocol is not port.protocol:
                continue
            for raw in eps.endpoints:
                ep = _endpoint(raw, slice_port.port, node)
                # The usable copy wins: not terminating, then ready, then serving; on a tie
                # the first slice by name keeps it (kube-proxy leaves the tie undefined).
                rank = (not ep.terminating, ep.ready, ep.serving)
                held = chosen.get(ep.address)
                if held is None or rank > held[0]:
                    chosen[ep.address] = (rank, ep)
    return tuple(ep for _, (_, ep) in sorted(chosen.items()))


def _endpoint(raw: SliceEndpoint, port: int, node: NodeConfig) -> Endpoint:
    cond = raw.conditions
    return Endpoint(
        ip=raw.address, port=port,
        is_local=bool(node.hostname) and raw.node_name == node.hostname,
        ready=cond.ready, serving=cond.serving, terminating=cond.terminating,
        zone_hints=raw.zone_hints, node_hints=raw.node_hints,
        node_name=raw.node_name, zone=raw.zone,
    )


def _family_filter(ips: Iterable[str], family: IPFamily) -> tuple[str, ...]:
    want_v6 = family is IPFamily.IPv6
    return tuple(ip for ip in ips if (":" in ip) == want_v6)


def build_service_ports(
    service: Service, slices: Iterable[EndpointSlice], node: NodeConfig
) -> dict[tuple[IPFamily, ServicePortName], ServicePortInfo]:
    """Build every ServicePortInfo of one Service on one node.

    Args:
        service: the Service.
        slices: the Service's EndpointSlices (others are ignored).
        node: this node.

    Returns:
        ``{(family, ServicePortName): ServicePortInfo}``; empty when kube-proxy would skip
        the Service (see :func:`skip_reason`).
    """
    if skip_reason(service, node) is not None:
        return {}
    mine = [s for s in slices if s.service == service.key]
    if any(not s.converted_from_endpoints for s in mine):
        # kube-proxy reads only EndpointSlices: slices converted from v1 Endpoints are a
        # fallback for old dumps, never merged with real ones (their conditions are poorer).
        mine = [s for s in mine if not s.converted_from_endpoints]
    out: dict[tuple[IPFamily, ServicePortName], ServicePortInfo] = {}
    mode_annotations = tuple((k, v) for k, v in service.annotations
                             if k.startswith(MODE_ANNOTATION_PREFIXES))
    for family in node.ip_families:
        cluster_ip = service.cluster_ip(family)
        if cluster_ip is None:
            continue
        for port in service.ports:
            spn = ServicePortName(namespace=service.namespace, name=service.name,
                                  port=port.name, protocol=port.protocol)
            base = ServicePortInfo(
                name=spn, family=family, cluster_ip=cluster_ip, port=port.port,
                protocol=port.protocol, target_port=port.target_port, node_port=port.node_port,
                service_type=service.type,
                external_ips=_family_filter(service.external_ips, family),
                load_balancer_ips=_family_filter(service.load_balancer_ips, family),
                load_balancer_source_ranges=_family_filter(
                    service.load_balancer_source_ranges, family),
                session_affinity_timeout_s=service.session_affinity_timeout_s,
                external_policy_local=service.external_policy_local,
                internal_policy_local=service.internal_policy_local,
                health_check_node_port=(service.health_check_node_port
                                        if service.needs_health_check else 0),
                annotations=mode_annotations,
                app_protocol=port.app_protocol,
            )
            endpoints = _merge_endpoints(port, mine, family, node)
            cat = categorize_endpoints(
                endpoints, uses_cluster=base.uses_cluster_endpoints,
                uses_local=base.uses_local_endpoints, node_name=node.hostname, zone=node.zone,
            )
            out[(family, spn)] = _with_endpoints(base, endpoints, cat)
    return out


def _with_endpoints(
    base: ServicePortInfo, endpoints: tuple[Endpoint, ...], cat: Categorized[Endpoint]
) -> ServicePortInfo:
    return replace(
        base, endpoints=endpoints, cluster_endpoints=cat.cluster, local_endpoints=cat.local,
        all_reachable_endpoints=cat.all_reachable, has_any_endpoints=cat.has_any_endpoints,
        topology=cat.topology,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The immutable state of one node at one revision.

    Attributes:
        revision: increases by one with every snapshot a tracker hands out.
        node: the node it was built for.
        ports: ``{(family, ServicePortName): ServicePortInfo}``, read-only.
        changed: the ServicePortNames added, removed or changed since the previous revision
            (every name for a first snapshot); modes use it for partial syncs.
        ingresses: every Ingress known (any class), sorted by namespace/name; only the HTTP
            plane reads them.
        destination_rules: every Istio DestinationRule known, sorted by namespace/name.
    """

    revision: int
    node: NodeConfig
    ports: Mapping[tuple[IPFamily, ServicePortName], ServicePortInfo] = field(
        default_factory=lambda: MappingProxyType({}))
    changed: frozenset[ServicePortName] = frozenset()
    ingresses: tuple[Ingress, ...] = ()
    destination_rules: tuple[DestinationRule, ...] = ()

    def __iter__(self) -> Iterator[ServicePortInfo]:
        """Every ServicePortInfo, sorted by family then name."""
        for key in sorted(self.ports):
            yield self.ports[key]

    def __len__(self) -> int:
        return len(self.ports)

    def get(self, name: ServicePortName | str, family: IPFamily = IPFamily.IPv4) -> ServicePortInfo | None:
        """The port called ``name`` (a ServicePortName or its text, TCP assumed) in ``family``."""
        if isinstance(name, str):
            for (fam, spn), info in self.ports.items():
                if fam is family and str(spn) == name:
                    return info
            return None
        return self.ports.get((family, name))

    def family(self, family: IPFamily) -> dict[ServicePortName, ServicePortInfo]:
        """``{ServicePortName: ServicePortInfo}`` for one IP family."""
        return {spn: info for (fam, spn), info in self.ports.items() if fam is family}

    def services(self) -> frozenset[NamespacedName]:
        """Every Service with at least one proxied port."""
        return frozenset(spn.service for _, spn in self.ports)

    def same_state(self, other: Snapshot) -> bool:
        """True when both snapshots program the same thing (revision and ``changed`` ignored)."""
        return (self.node == other.node and dict(self.ports) == dict(other.ports)
                and self.ingresses == other.ingresses and self.destination_rules == other.destination_rules)


def build_snapshot(
    services: Iterable[Service],
    slices: Iterable[EndpointSlice],
    node: NodeConfig,
    *,
    revision: int = 1,
    ingresses: Iterable[Ingress] = (),
    destination_rules: Iterable[DestinationRule] = (),
) -> Snapshot:
    """Build a whole Snapshot from objects, with every port marked changed.

    Args:
        services: the Services (duplicates by namespace/name: the last one wins).
        slices: the EndpointSlices.
        node: this node.
        revision: the snapshot's revision.
        ingresses, destination_rules: the HTTP plane's objects (duplicates: the last one wins).
    """
    by_service: dict[NamespacedName, list[EndpointSlice]] = {}
    for s in slices:
        by_service.setdefault(s.service, []).append(s)
    latest = {svc.key: svc for svc in services}
    ports: dict[tuple[IPFamily, ServicePortName], ServicePortInfo] = {}
    for key, svc in latest.items():
        ports.update(build_service_ports(svc, by_service.get(key, ()), node))
    ing = {(i.namespace, i.name): i for i in ingresses}
    drs = {(d.namespace, d.name): d for d in destination_rules}
    return Snapshot(revision=revision, node=node, ports=MappingProxyType(ports),
                    changed=frozenset(spn for _, spn in ports),
                    ingresses=tuple(ing[k] for k in sorted(ing)),
                    destination_rules=tuple(drs[k] for k in sorted(drs)))
