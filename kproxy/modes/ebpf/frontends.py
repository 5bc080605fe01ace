"""The frontends Cilium's agent makes of one service port, and their backends and flags.

Pure functions from a :class:`~kproxy.model.ServicePortInfo` to :class:`FrontendPlan` values,
as Cilium's Kubernetes reflector (``pkg/loadbalancer/reflectors``, ``convertService``) and BPF
reconciler (``pkg/loadbalancer/reconciler/bpf_reconciler.go``, ``updateFrontend`` and
``Update``) build them, with kube-proxy replacement on:

- the ClusterIP, in the external scope only;
- for NodePort and LoadBalancer Services, the NodePort surrogate ``0.0.0.0:nodePort`` (``[::]``),
  which the reconciler expands into one frontend per node address (``NodeAddressesByNodePort``);
- each LoadBalancer ingress address, and each external IP (external scope only);
- NodePort and LoadBalancer frontends come in both scopes when exactly one of the traffic
  policies is Local (``twoScopes``), the internal-scope twin carrying the internal policy's
  backends.

The ``service.cilium.io/lb-algorithm`` annotation (``random`` or ``maglev``) is always honoured,
as Cilium does with ``--bpf-lb-algorithm-annotation=true``: it goes into the master entry's
algorithm bits and decides ``useMaglev`` for every frontend but the surrogates; without it the
bits are 0 (the datapath's default) and Maglev tables are built, with ``--bpf-lb-algorithm
maglev``, for the routable frontends that are not ClusterIPs (``ExternalClusterIP`` off).

Backends follow Cilium's EndpointSlice parsing: a ready endpoint is active, a serving and
terminating one is terminating, any other is left out. A Local policy keeps the node's own
backends only; there is no fallback to the cluster's (the master then has count 0 and the
datapath drops new flows, ``DROP_NO_SERVICE``).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from enum import StrEnum

from kproxy.model import IPFamily, Protocol
from kproxy.model.service import ServiceType
from kproxy.model.snapshot import ServicePortInfo
from kproxy.modes.ebpf.config import ANNOTATION_LB_ALGORITHM, ANNOTATION_SRC_RANGES_POLICY, EbpfConfig
from kproxy.modes.ebpf.layout import (
    BackendState,
    LBAlgorithm,
    Scope,
    ServiceFlag,
    ServiceFlag2,
)

__all__ = ["BackendPlan", "FrontendPlan", "FrontendType", "plan_frontends", "service_flags"]


class FrontendType(StrEnum):
    """Cilium's ``loadbalancer.SVCType`` values kproxy produces."""

    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    EXTERNAL_IPS = "ExternalIPs"
    LOAD_BALANCER = "LoadBalancer"


@dataclass(frozen=True, slots=True)
class BackendPlan:
    """One backend of a frontend: its address, port, protocol and state (the identity Cilium's
    backend id allocator keys on is ``(address, port, protocol)``)."""

    address: str
    port: int
    protocol: Protocol
    state: BackendState


@dataclass(frozen=True, slots=True, kw_only=True)
class FrontendPlan:
    """One services-map frontend before ids are allocated.

    Attributes:
        address, port, protocol, scope: the frontend's ``L3n4Addr`` (``0.0.0.0``/``::`` for a
            NodePort surrogate).
        type: the Cilium service type of the frontend.
        surrogate: the address is the unspecified one (a NodePort surrogate, non-routable).
        flags, flags2: the master entry's flag bytes (:func:`service_flags`).
        algorithm: the master entry's per-service algorithm bits (the annotation, else 0).
        effective_algorithm: random or maglev, the algorithm the datapath applies.
        use_maglev: a Maglev table is built for this frontend (``useMaglev``).
        affinity_timeout_s: the ClientIP affinity timeout, 0 without affinity.
        backends: sorted as ``sortedBackends`` sorts them (state, then address, then port).
        source_ranges: the Service's ``loadBalancerSourceRanges`` of the frontend's family.
    """

    address: str
    port: int
    protocol: Protocol
    scope: Scope
    type: FrontendType
    surrogate: bool
    flags: ServiceFlag
    flags2: ServiceFlag2
    algorithm: LBAlgorithm
    effective_algorithm: LBAlgorithm
    use_maglev: bool
    affinity_timeout_s: int
    backends: tuple[BackendPlan, ...]
    source_ranges: tuple[str, ...]

    @property
    def key(self) -> tuple[str, int, Protocol, Scope]:
        """The frontend's identity (the service id allocator's key)."""
        return (self.address, self.port, self.protocol, self.scope)


def service_flags(kind: FrontendType, info: ServicePortInfo, *, routable: bool,
                  check_source_range: bool, deny: bool) -> tuple[ServiceFlag, ServiceFlag2]:
    """The master entry's ``flags`` and ``flags2``, as ``loadbalancer.NewSvcFlag``.

    The service type bit; ``EXT_LOCAL_SCOPE``/``INT_LOCAL_SCOPE`` from the Service's traffic
    policies (on every frontend, the ClusterIP's too); ``TWO_SCOPES`` when they differ and the
    frontend is not a ClusterIP; ``AFFINITY``; ``ROUTABLE``; ``SOURCE_RANGE`` (and
    ``SOURCE_RANGE_DENY`` in ``flags2``).
    """
    flags = {FrontendType.CLUSTER_IP: ServiceFlag.NONE, FrontendType.NODE_PORT: ServiceFlag.NODEPORT,
             FrontendType.EXTERNAL_IPS: ServiceFlag.EXTERNAL_IP,
             FrontendType.LOAD_BALANCER: ServiceFlag.LOADBALANCER}[kind]
    flags2 = ServiceFlag2.NONE
    if info.external_policy_local:
        flags |= ServiceFlag.EXT_LOCAL_SCOPE
    if info.internal_policy_local:
        flags2 |= ServiceFlag2.INT_LOCAL_SCOPE
    if info.session_affinity_timeout_s is not None:
        flags |= ServiceFlag.AFFINITY
    if routable:
        flags |= ServiceFlag.ROUTABLE
    if check_source_range:
        flags |= ServiceFlag.SOURCE_RANGE
        if deny:
            flags2 |= ServiceFlag2.QUARANTINED  # SVC_FLAG_SOURCE_RANGE_DENY on the master
    if info.external_policy_local != info.internal_policy_local and kind is not FrontendType.CLUSTER_IP:
        flags2 |= ServiceFlag2.TWO_SCOPES
    return flags, flags2


def _backends(info: ServicePortInfo, local_only: bool) -> tuple[BackendPlan, ...]:
    out: list[BackendPlan] = []
    for ep in info.endpoints:
        if local_only and not ep.is_local:
            continue
        if ep.ready and not ep.terminating:
            state = BackendState.ACTIVE
        elif ep.serving and ep.terminating:
            state = BackendState.TERMINATING
        else:
            continue
        out.append(BackendPlan(ep.ip, ep.port, info.protocol, state))
    out.sort(key=lambda b: (int(b.state), _packed(b.address), b.port))
    return tuple(out)


def _packed(address: str) -> bytes:
    """The address's bytes: Cilium sorts backends by ``AddrCluster.Compare`` (netip order)."""
    return socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET, address)


def _annotated_algorithm(info: ServicePortInfo) -> LBAlgorithm:
    value = (info.annotation(ANNOTATION_LB_ALGORITHM) or "").strip().lower()
    return {"random": LBAlgorithm.RANDOM, "maglev": LBAlgorithm.MAGLEV}.get(value, LBAlgorithm.DEFAULT)


def plan_frontends(info: ServicePortInfo, config: EbpfConfig) -> tuple[FrontendPlan, ...]:
    """Every frontend of one service port in its family, NodePorts expanded per node address.

    Returns:
        The ClusterIP, then the NodePort surrogate(s) and their expansions, the LoadBalancer
        addresses, the external IPs; each in the external then the internal scope.
    """
    two_scopes = info.external_policy_local != info.internal_policy_local
    scopes = (Scope.EXTERNAL, Scope.INTERNAL) if two_scopes else (Scope.EXTERNAL,)
    annotated = _annotated_algorithm(info)
    effective = annotated if annotated is not LBAlgorithm.DEFAULT else config.default_algorithm
    deny = (info.annotation(ANNOTATION_SRC_RANGES_POLICY) or "").strip().lower() == "deny"
    ranges = tuple(info.load_balancer_source_ranges)
    timeout = info.session_affinity_timeout_s or 0
    unspecified = "::" if info.family is IPFamily.IPv6 else "0.0.0.0"
    out: list[FrontendPlan] = []
    backend_sets: dict[bool, tuple[BackendPlan, ...]] = {}

    def add(kind: FrontendType, address: str, port: int, scope: Scope) -> None:
        surrogate = address == unspecified
        routable = not surrogate and kind is not FrontendType.CLUSTER_IP
        check = bool(ranges) and kind is FrontendType.LOAD_BALANCER
        flags, flags2 = service_flags(kind, info, routable=routable, check_source_range=check,
                                      deny=check and deny)
        if kind is FrontendType.CLUSTER_IP or scope is Scope.INTERNAL:
            local_only = info.internal_policy_local
        else:
            local_only = info.external_policy_local
        if surrogate:
            maglev = False
        elif annotated is not LBAlgorithm.DEFAULT:
            maglev = annotated is LBAlgorithm.MAGLEV
        else:
            maglev = config.algorithm == "maglev" and kind is not FrontendType.CLUSTER_IP
        out.append(FrontendPlan(
            address=address, port=port, protocol=info.protocol, scope=scope, type=kind,
            surrogate=surrogate, flags=flags, flags2=flags2, algorithm=annotated,
            effective_algorithm=effective, use_maglev=maglev, affinity_timeout_s=timeout,
            backends=backends_of(local_only), source_ranges=ranges))

    def backends_of(local_only: bool) -> tuple[BackendPlan, ...]:
        found = backend_sets.get(local_only)
        if found is None:
            found = backend_sets[local_only] = _backends(info, local_only)
        return found

    add(FrontendType.CLUSTER_IP, info.cluster_ip, info.port, Scope.EXTERNAL)
    if info.node_port and info.service_type in (ServiceType.NodePort, ServiceType.LoadBalancer):
        for scope in scopes:
            add(FrontendType.NODE_PORT, unspecified, info.node_port, scope)
            for ip in config.nodeport_ips(info.family):
                add(FrontendType.NODE_PORT, ip, info.node_port, scope)
    if info.service_type is ServiceType.LoadBalancer:
        for ip in info.load_balancer_ips:
            for scope in scopes:
                add(FrontendType.LOAD_BALANCER, ip, info.port, scope)
    for ip in info.external_ips:
        add(FrontendType.EXTERNAL_IPS, ip, info.port, Scope.EXTERNAL)
    return tuple(out)
