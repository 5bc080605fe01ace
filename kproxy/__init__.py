"""kproxy: Kubernetes Service proxying, as kube-proxy does it, in Python.

The public surface: the model (parse API objects, build the per-node Snapshot), the sources
(manifests, memory), the sync engine, the userspace data plane, and a helper to run the
userspace proxy inside your own event loop.
"""

from kproxy.daemon import RunningProxy, UserspaceOptions, running_userspace_proxy
from kproxy.errors import (
    ConfigError,
    InvalidArgument,
    InvalidObject,
    InvalidTransition,
    KernelError,
    KproxyError,
    NoEndpointsError,
    SourceError,
)
from kproxy.model import (
    Endpoint,
    EndpointSlice,
    IPFamily,
    NodeConfig,
    Protocol,
    Service,
    ServicePortInfo,
    ServicePortName,
    Snapshot,
    build_snapshot,
    parse_objects,
)
from kproxy.sources import Event, EventType, ManifestSource, MemorySource, Source, load_manifests
from kproxy.sync import ChangeTracker, FakeClock, SyncEngine
from kproxy.userspace import AddressEntry, RoundRobinBalancer, UserspaceProxy

__version__ = "0.1.0"

__all__ = [
    "AddressEntry",
    "ChangeTracker",
    "ConfigError",
    "Endpoint",
    "EndpointSlice",
    "Event",
    "EventType",
    "FakeClock",
    "IPFamily",
    "InvalidArgument",
    "InvalidObject",
    "InvalidTransition",
    "KernelError",
    "KproxyError",
    "ManifestSource",
    "MemorySource",
    "NoEndpointsError",
    "NodeConfig",
    "Protocol",
    "RoundRobinBalancer",
    "RunningProxy",
    "Service",
    "ServicePortInfo",
    "ServicePortName",
    "Snapshot",
    "Source",
    "SourceError",
    "SyncEngine",
    "UserspaceOptions",
    "UserspaceProxy",
    "__version__",
    "build_snapshot",
    "load_manifests",
    "parse_objects",
    "running_userspace_proxy",
]
