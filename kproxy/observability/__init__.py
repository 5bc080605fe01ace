"""Logging (structlog), Prometheus metrics, kube-proxy's health endpoints and health check node ports."""

from kproxy.observability.health import HealthAnswer, ProxyHealth, go_time
from kproxy.observability.instrument import Instruments, parse_trigger_time
from kproxy.observability.logging import configure_logging
from kproxy.observability.metrics import (
    NETWORK_PROGRAMMING_BUCKETS,
    SYNC_DURATION_BUCKETS,
    LiveCollector,
    ProxyMetrics,
)
from kproxy.observability.server import (
    DEFAULT_HEALTHZ_BIND_ADDRESS,
    DEFAULT_METRICS_BIND_ADDRESS,
    Observability,
    ObservabilityOptions,
    healthz_app,
    metrics_app,
)
from kproxy.observability.service_health import (
    ServiceHealthServer,
    health_check_ports,
    local_ready_endpoints,
)

__all__ = [
    "DEFAULT_HEALTHZ_BIND_ADDRESS",
    "DEFAULT_METRICS_BIND_ADDRESS",
    "NETWORK_PROGRAMMING_BUCKETS",
    "SYNC_DURATION_BUCKETS",
    "HealthAnswer",
    "Instruments",
    "LiveCollector",
    "Observability",
    "ObservabilityOptions",
    "ProxyHealth",
    "ProxyMetrics",
    "ServiceHealthServer",
    "configure_logging",
    "go_time",
    "health_check_ports",
    "healthz_app",
    "local_ready_endpoints",
    "metrics_app",
    "parse_trigger_time",
]
