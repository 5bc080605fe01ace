"""v1 Service, parsed from the dict the API returns, with the API server's defaults applied.

Defaults follow ``pkg/apis/core/v1/defaults.go``: port protocol TCP, ``targetPort`` = ``port``,
type ClusterIP, session affinity None with a ClientIP timeout of 10800 s, internal traffic
policy Cluster, external traffic policy Cluster for NodePort and LoadBalancer Services, and the
IP families from the cluster IPs. Validation mirrors ``pkg/apis/core/validation`` where a proxy
depends on it; a wrong part is skipped with an :class:`~kproxy.errors.InvalidObject` naming it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kproxy.errors import InvalidObject
from kproxy.model._fields import Problems, as_int, as_list, as_map, as_str, check_ip
from kproxy.model.names import IPFamily, NamespacedName, Protocol, family_of

__all__ = [
    "DEFAULT_AFFINITY_TIMEOUT_S",
    "LABEL_HEADLESS",
    "LABEL_SERVICE_PROXY_NAME",
    "MAX_AFFINITY_TIMEOUT_S",
    "Service",
    "ServicePort",
    "ServiceType",
    "TrafficPolicy",
    "parse_service",
]

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_PORT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

#: v1.DefaultClientIPServiceAffinitySeconds: three hours.
DEFAULT_AFFINITY_TIMEOUT_S = 10800
#: v1.MaxClientIPServiceAffinitySeconds: one day.
MAX_AFFINITY_TIMEOUT_S = 86400
#: Services with this label belong to another proxy (kube-proxy's informer excludes them).
LABEL_SERVICE_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
#: Set by the EndpointSlice controller on headless Services' slices; kube-proxy excludes them.
LABEL_HEADLESS = "service.kubernetes.io/headless"


class ServiceType(StrEnum):
    """v1 ``ServiceType``."""

    ClusterIP = "ClusterIP"
    NodePort = "NodePort"
    LoadBalancer = "LoadBalancer"
    ExternalName = "ExternalName"


class TrafficPolicy(StrEnum):
    """``externalTrafficPolicy`` / ``internalTrafficPolicy`` values."""

    Cluster = "Cluster"
    Local = "Local"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServicePort:
    """One entry of ``spec.ports`` after defaulting.

    Attributes:
        name: the port name, ``""`` when unnamed.
        protocol: TCP, UDP or SCTP.
        port: the Service port, 1..65535.
        target_port: a number (1..65535) or a container port name.
        node_port: the NodePort, 0 when none.
        app_protocol: ``appProtocol``, ``""`` when unset (Istio reads ``http`` from it).
    """

    name: str
    protocol: Protocol
    port: int
    target_port: int | str
    node_port: int = 0
    app_protocol: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Service:
    """A v1 Service as kube-proxy sees it.

    Attributes:
        namespace, name: the object's identity.
        labels, annotations: sorted ``(key, value)`` pairs.
        type: the Service type.
        cluster_ips: canonical cluster IPs, primary first; empty when headless or unset.
        headless: ``clusterIP: None``.
        ports: the valid ports, in spec order.
        external_ips: canonical ``spec.externalIPs``.
        load_balancer_ips: ``status.loadBalancer.ingress[].ip`` in VIP mode (Proxy mode ones
            are left out, as kube-proxy does).
        load_balancer_source_ranges: ``spec.loadBalancerSourceRanges`` as canonical CIDRs.
        session_affinity_timeout_s: the ClientIP timeout in seconds, or ``None`` without affinity.
        external_traffic_policy, internal_traffic_policy: the traffic policies after defaulting.
        health_check_node_port: ``spec.healthCheckNodePort``, 0 when none.
        source: where the object came from (a manifest file, ``kube``, ``memory``), for
            messages only: it takes no part in comparisons, so the same Service read from
            another file is the same Service.
    """

    namespace: str
    name: str
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    type: ServiceType = ServiceType.ClusterIP
    cluster_ips: tuple[str, ...] = ()
    headless: bool = False
    ports: tuple[ServicePort, ...] = ()
    external_ips: tuple[str, ...] = ()
    load_balancer_ips: tuple[str, ...] = ()
    load_balancer_source_ranges: tuple[str, ...] = ()
    session_affinity_timeout_s: int | None = None
    external_traffic_policy: TrafficPolicy = TrafficPolicy.Cluster
    internal_traffic_policy: TrafficPolicy = TrafficPolicy.Cluster
    health_check_node_port: int = 0
    source: str = field(default="", compare=False)

    @property
    def key(self) -> NamespacedName:
        """``namespace/name``."""
        return NamespacedName(namespace=self.namespace, name=self.name)

    def label(self, key: str) -> str | None:
        """The value of label ``key``, or None."""
        return dict(self.labels).get(key)

    def cluster_ip(self, family: IPFamily) -> str | None:
        """The cluster IP of ``family``, or None (``proxyutil.GetClusterIPByFamily``)."""
        for ip in self.cluster_ips:
            if family_of(ip) is family:
                return ip
        return None

    @property
    def externally_accessible(self) -> bool:
        """``apiservice.ExternallyAccessible``: LoadBalancer, NodePort, or ClusterIP with external IPs."""
        return self.type in (ServiceType.LoadBalancer, ServiceType.NodePort) or (
            self.type is ServiceType.ClusterIP and bool(self.external_ips)
        )

    @property
    def external_policy_local(self) -> bool:
        """``apiservice.ExternalPolicyLocal``."""
        return self.externally_accessible and self.external_traffic_policy is TrafficPolicy.Local

    @property
    def internal_policy_local(self) -> bool:
        """``apiservice.InternalPolicyLocal``."""
        return self.internal_traffic_policy is TrafficPolicy.Local

    @property
    def needs_health_check(self) -> bool:
        """``apiservice.NeedsHealthCheck``: a LoadBalancer with externalTrafficPolicy Local."""
        return self.type is ServiceType.LoadBalancer and self.external_policy_local


def _pairs(value: Any, path: str, problems: Problems) -> tuple[tuple[str, str], ...]:
    mapping = as_map(value, path, problems) or {}
    out = []
    for k, v in mapping.items():
        if isinstance(v, str):
            out.append((str(k), v))
        else:
            problems.add(f"{path}.{k}", f"expected a string value, got {v!r}")
    return tuple(sorted(out))


def _port_number(value: Any, path: str, problems: Problems, *, allow_zero: bool) -> int | None:
    number = as_int(value, path, problems)
    if number is None:
        return None
    low = 0 if allow_zero else 1
    if not low <= number <= 65535:
        problems.add(path, f"port {number} is out of range {low}..65535")
        return None
    return number


def _parse_port(raw: Any, path: str, problems: Problems) -> ServicePort | None:
    before = len(problems.errors)
    spec = as_map(raw, path, problems)
    if spec is None:
        if len(problems.errors) == before:
            problems.add(path, "expected a port object, got null")
        return None
    name = as_str(spec.get("name"), f"{path}.name", problems)
    app_protocol = as_str(spec.get("appProtocol"), f"{path}.appProtocol", problems) or ""
    proto_text = as_str(spec.get("protocol"), f"{path}.protocol", problems, default="TCP")
    protocol = None
    if proto_text is not None:
        try:
            protocol = Protocol(proto_text)
        except ValueError:
            problems.add(f"{path}.protocol", f"unknown protocol {proto_text!r}; expected TCP, UDP or SCTP")
    if "port" not in spec:
        problems.add(f"{path}.port", "the port number is missing")
        return None
    port = _port_number(spec.get("port"), f"{path}.port", problems, allow_zero=False)
    raw_node_port = spec.get("nodePort")
    node_port = _port_number(0 if raw_node_port is None else raw_node_port, f"{path}.nodePort", problems,
                             allow_zero=True)
    raw_target = spec.get("targetPort")
    target: int | str | None
    # SetDefaults_Service: a targetPort of 0 or "" (or none) defaults to the port.
    if raw_target is None or raw_target == "" or (type(raw_target) is int and raw_target == 0):
        target = port
    elif isinstance(raw_target, str) and not (raw_target.isascii() and raw_target.isdigit()):
        target = raw_target
    else:
        # An ASCII decimal string ("8080", as YAML may quote it) is read as a number.
        target = _port_number(
            int(raw_target) if isinstance(raw_target, str) else raw_target,
            f"{path}.targetPort",
            problems,
            allow_zero=False,
        )
    if len(problems.errors) != before or None in (name, protocol, port, node_port, target):
        return None
    assert name is not None and protocol is not None and port is not None
    assert node_port is not None and target is not None
    return ServicePort(name=name, protocol=protocol, port=port, target_port=target, node_port=node_port,
                       app_protocol=app_protocol)


def _enum(value: Any, path: str, problems: Problems, enum: type[StrEnum], default: str) -> Any:
    text = as_str(value, path, problems, default=default)
    if text is None or text == "":
        return enum(default)
    try:
        return enum(text)
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        problems.add(path, f"unknown value {text!r}; expected one of {allowed}")
        return None


def _cidr(value: Any, path: str, problems: Problems) -> str | None:
    if not isinstance(value, str):
        problems.add(path, f"expected a CIDR, got {value!r}")
        return None
    text = value.strip()
    if "/" not in text or "%" in text:
        # Go's ParseCIDR needs a prefix length and refuses zones; Python would read "10.0.0.1"
        # as a /32 and keep "fe80::%eth0/64".
        problems.add(path, f"{value!r} is not a valid CIDR (expected address/prefix-length)")
        return None
    try:
        # Go's ParseCIDRSloppy keeps the network and drops host bits, as strict=False does.
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        problems.add(path, f"{value!r} is not a valid CIDR")
        return None


def parse_service(raw: Mapping[str, Any], *, source: str = "") -> tuple[Service, list[InvalidObject]]:
    """Parse a v1 Service dict, applying the API server's defaults.

    Args:
        raw: the object as the API returns it (``apiVersion``, ``kind``, ``metadata``, ``spec``,
            ``status``).
        source: where it came from, for error messages (a file path, ``memory``).

    Returns:
        ``(service, problems)``: the Service with every invalid part left out, and one
        :class:`InvalidObject` per part left out (ports, external IPs, source ranges ...).

    Raises:
        InvalidObject: the object cannot be served at all (not a v1 Service, no name, a bad
            cluster IP or type, or no valid port although ports were given).
    """
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name_v = meta.get("name")
    ns_v = meta.get("namespace") or "default"
    label = f"Service {ns_v}/{name_v or '?'}"
    p = Problems(obj=label, source=source)
    if raw.get("kind") != "Service":
        raise p.fail("kind", f"expected kind Service, got {raw.get('kind')!r}")
    if raw.get("apiVersion", "v1") != "v1":
        raise p.fail("apiVersion", f"expected apiVersion v1 for a Service, got {raw.get('apiVersion')!r}")
    if not isinstance(name_v, str) or not name_v:
        raise p.fail("metadata.name", f"a Service needs a name, got {name_v!r}")
    if not _DNS1035.fullmatch(name_v):
        # ValidateServiceName: a DNS-1035 label (lower case, starts with a letter, <= 63).
        raise p.fail("metadata.name", f"{name_v!r} is not a valid Service name (a DNS-1035 label: "
                     "lower-case letters, digits and '-', starting with a letter, at most 63)")
    if not isinstance(ns_v, str):
        raise p.fail("metadata.namespace", f"expected a string, got {ns_v!r}")
    if raw.get("spec") is None:
        # The API server refuses it (spec.ports is required but for headless Services).
        raise p.fail("spec", "a Service needs a spec (at least spec.ports); none was given, so it is "
                     "not served")
    spec = as_map(raw.get("spec"), "spec", p) or {}
    status = as_map(raw.get("status"), "status", p) or {}
    labels = _pairs(meta.get("labels"), "metadata.labels", p)
    annotations = _pairs(meta.get("annotations"), "metadata.annotations", p)

    svc_type = _enum(spec.get("type"), "spec.type", p, ServiceType, "ClusterIP")
    if svc_type is None:
        raise p.errors.pop()

    headless, cluster_ips = _parse_cluster_ips(spec, p)
    ports = _parse_ports(spec, p, svc_type)
    external_ips = tuple(
        ip for i, v in enumerate(as_list(spec.get("externalIPs"), "spec.externalIPs", p))
        if (ip := check_ip(v, f"spec.externalIPs[{i}]", p)) is not None
    )
    ranges = tuple(
        c for i, v in enumerate(
            as_list(spec.get("loadBalancerSourceRanges"), "spec.loadBalancerSourceRanges", p))
        if (c := _cidr(v, f"spec.loadBalancerSourceRanges[{i}]", p)) is not None
    )
    lb_ips = _parse_ingress(status, p)
    timeout = _parse_affinity(spec, p)
    etp_default = "Cluster"
    etp = _enum(spec.get("externalTrafficPolicy"), "spec.externalTrafficPolicy", p,
                TrafficPolicy, etp_default) or TrafficPolicy.Cluster
    itp = _enum(spec.get("internalTrafficPolicy"), "spec.internalTrafficPolicy", p,
                TrafficPolicy, "Cluster") or TrafficPolicy.Cluster
    hc = spec.get("healthCheckNodePort")
    hc = 0 if hc is None else hc
    health = _port_number(hc, "spec.healthCheckNodePort", p, allow_zero=True) or 0
    svc = Service(
        namespace=ns_v, name=name_v, labels=labels, annotations=annotations, type=svc_type,
        cluster_ips=cluster_ips, headless=headless, ports=ports, external_ips=external_ips,
        load_balancer_ips=lb_ips, load_balancer_source_ranges=ranges,
        session_affinity_timeout_s=timeout, external_traffic_policy=etp,
        internal_traffic_policy=itp, health_check_node_port=health, source=source,
    )
    return svc, p.errors


def _parse_cluster_ips(spec: Mapping[str, Any], p: Problems) -> tuple[bool, tuple[str, ...]]:
    raw_ips = spec.get("clusterIPs")
    if raw_ips is None:
        single = spec.get("clusterIP")
        raw_ips = [] if single in (None, "") else [single]
        path = "spec.clusterIP"
    else:
        path = "spec.clusterIPs"
        if not isinstance(raw_ips, list):
            raise p.fail(path, f"expected a list of IPs, got {raw_ips!r}")
    if raw_ips and raw_ips[0] == "None":
        return True, ()
    ips = []
    for i, value in enumerate(raw_ips):
        where = path if path == "spec.clusterIP" else f"{path}[{i}]"
        ip = check_ip(value, where, p)
        if ip is None:
            raise p.errors.pop()
        ips.append(ip)
    families = [family_of(ip) for ip in ips]
    if len(set(families)) != len(families):
        raise p.fail(path, f"at most one cluster IP per family, got {ips}")
    for i, ip in enumerate(ips):
        addr = ipaddress.ip_address(ip)
        mapped = isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None
        if addr.is_unspecified or mapped:
            where = path if path == "spec.clusterIP" else f"{path}[{i}]"
            raise p.fail(where, f"{ip} cannot be a cluster IP (unspecified or IPv4-mapped)")
    single = spec.get("clusterIP")
    mismatch = isinstance(single, str) and single.strip() not in ("", raw_ips[0]) if ips else False
    if path == "spec.clusterIPs" and mismatch:
        # ValidateService: clusterIPs[0] must equal clusterIP when both are set.
        raise p.fail("spec.clusterIP", f"clusterIP {single!r} differs from clusterIPs[0] {raw_ips[0]!r}")
    return False, tuple(ips)


def _parse_ports(spec: Mapping[str, Any], p: Problems, svc_type: ServiceType) -> tuple[ServicePort, ...]:
    raw_ports = as_list(spec.get("ports"), "spec.ports", p)
    ports: list[ServicePort] = []
    # validateServicePort: a port name is unique within the Service, whatever the protocol.
    seen: set[str] = set()
    numbers: set[tuple[int, Protocol]] = set()
    for i, raw_port in enumerate(raw_ports):
        port = _parse_port(raw_port, f"spec.ports[{i}]", p)
        if port is None:
            continue
        if port.name and not _PORT_NAME.fullmatch(port.name):
            p.add(f"spec.ports[{i}].name", f"{port.name!r} is not a valid port name (a DNS-1123 label: "
                  "lower-case letters, digits and '-', at most 63)")
            continue
        if (port.port, port.protocol) in numbers:
            # ValidateService: the same port and protocol may appear only once.
            p.add(f"spec.ports[{i}].port", f"port {port.port}/{port.protocol} is already used by "
                  "another port of this Service")
            continue
        if len(raw_ports) > 1 and not port.name:
            p.add(f"spec.ports[{i}].name", "a name is required when a Service has several ports")
            continue
        if port.name and port.name in seen:
            p.add(f"spec.ports[{i}].name", f"duplicate port name {port.name!r}; port names must be unique "
                  "within a Service, even across protocols")
            continue
        if port.node_port and svc_type not in (ServiceType.NodePort, ServiceType.LoadBalancer):
            p.add(f"spec.ports[{i}].nodePort", f"nodePort {port.node_port} needs type NodePort "
                  f"or LoadBalancer, not {svc_type}")
            continue
        seen.add(port.name)
        numbers.add((port.port, port.protocol))
        ports.append(port)
    if raw_ports and not ports:
        raise p.fail("spec.ports", "no valid port: " + "; ".join(f"{e.field}: {e.problem}" for e in p.errors))
    return tuple(ports)


def _parse_ingress(status: Mapping[str, Any], p: Problems) -> tuple[str, ...]:
    lb = as_map(status.get("loadBalancer"), "status.loadBalancer", p) or {}
    out = []
    for i, ing in enumerate(as_list(lb.get("ingress"), "status.loadBalancer.ingress", p)):
        entry = as_map(ing, f"status.loadBalancer.ingress[{i}]", p) or {}
        if not entry.get("ip"):
            continue  # hostname-only ingress: nothing for a proxy to do.
        if entry.get("ipMode", "VIP") == "Proxy":
            continue  # proxyutil.IsVIPMode: the load balancer proxies, kube-proxy stays out.
        ip = check_ip(entry.get("ip"), f"status.loadBalancer.ingress[{i}].ip", p)
        if ip is not None:
            out.append(ip)
    return tuple(out)


def _parse_affinity(spec: Mapping[str, Any], p: Problems) -> int | None:
    kind = as_str(spec.get("sessionAffinity"), "spec.sessionAffinity", p, default="None")
    if kind in ("None", "", None):
        return None
    if kind != "ClientIP":
        p.add("spec.sessionAffinity", f"unknown value {kind!r}; expected None or ClientIP")
        return None
    cfg = as_map(spec.get("sessionAffinityConfig"), "spec.sessionAffinityConfig", p) or {}
    client = as_map(cfg.get("clientIP"), "spec.sessionAffinityConfig.clientIP", p) or {}
    raw = client.get("timeoutSeconds")
    if raw is None:
        return DEFAULT_AFFINITY_TIMEOUT_S
    path = "spec.sessionAffinityConfig.clientIP.timeoutSeconds"
    value = as_int(raw, path, p)
    if value is None:
        return DEFAULT_AFFINITY_TIMEOUT_S
    if not 0 < value <= MAX_AFFINITY_TIMEOUT_S:
        p.add(path, f"timeoutSeconds {value} is out of range 1..{MAX_AFFINITY_TIMEOUT_S}")
        return DEFAULT_AFFINITY_TIMEOUT_S
    return value
