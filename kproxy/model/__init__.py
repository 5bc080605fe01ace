"""Frozen values: API objects parsed and validated, ServicePortName, and the per-node Snapshot."""

from kproxy.model.endpointslice import (
    LABEL_CONVERTED_FROM_ENDPOINTS,
    LABEL_SERVICE_NAME,
    EndpointConditions,
    EndpointPort,
    EndpointSlice,
    SliceEndpoint,
    endpoints_to_slices,
    parse_endpoint_slice,
)
from kproxy.model.names import (
    IPFamily,
    NamespacedName,
    Protocol,
    ServicePortName,
    family_of,
    join_host_port,
)
from kproxy.model.objects import KubeObject, ParseResult, parse_objects
from kproxy.model.service import (
    DEFAULT_AFFINITY_TIMEOUT_S,
    LABEL_SERVICE_PROXY_NAME,
    Service,
    ServicePort,
    ServiceType,
    TrafficPolicy,
    parse_service,
)
from kproxy.model.snapshot import (
    Endpoint,
    NodeConfig,
    ServicePortInfo,
    Snapshot,
    build_service_ports,
    build_snapshot,
    skip_reason,
)
from kproxy.model.topology import TopologyMode, categorize_endpoints

__all__ = [
    "DEFAULT_AFFINITY_TIMEOUT_S",
    "LABEL_CONVERTED_FROM_ENDPOINTS",
    "LABEL_SERVICE_NAME",
    "LABEL_SERVICE_PROXY_NAME",
    "Endpoint",
    "EndpointConditions",
    "EndpointPort",
    "EndpointSlice",
    "IPFamily",
    "KubeObject",
    "NamespacedName",
    "NodeConfig",
    "ParseResult",
    "Protocol",
    "Service",
    "ServicePort",
    "ServicePortInfo",
    "ServicePortName",
    "ServiceType",
    "SliceEndpoint",
    "Snapshot",
    "TopologyMode",
    "TrafficPolicy",
    "build_service_ports",
    "build_snapshot",
    "categorize_endpoints",
    "endpoints_to_slices",
    "family_of",
    "join_host_port",
    "parse_endpoint_slice",
    "parse_objects",
    "parse_service",
    "skip_reason",
]
