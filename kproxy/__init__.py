"""kproxy: Kubernetes Service proxying, as kube-proxy does it, in Python.

The public surface: the model (parse API objects, build the per-node Snapshot), the sources
(manifests, memory), the sync engine, the userspace data plane, and a helper to run the
userspace proxy inside your own event loop. Names are exported lazily.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kproxy.clock import FakeClock
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
    from kproxy.modes.userspace import AddressEntry, RoundRobinBalancer, UserspaceProxy
    from kproxy.sources import Event, EventType, ManifestSource, MemorySource, Source, load_manifests
    from kproxy.sync import ChangeTracker, SyncEngine

#: Where each public name lives; imported on first use, so ``import kproxy.model`` (or
#: ``import kproxy``) loads no data plane, asyncio relay or kube client.
_EXPORTS: dict[str, str] = {
    "AddressEntry": "kproxy.modes.userspace",
    "ChangeTracker": "kproxy.sync",
    "ConfigError": "kproxy.errors",
    "Endpoint": "kproxy.model",
    "EndpointSlice": "kproxy.model",
    "Event": "kproxy.sources",
    "EventType": "kproxy.sources",
    "FakeClock": "kproxy.clock",
    "IPFamily": "kproxy.model",
    "InvalidArgument": "kproxy.errors",
    "InvalidObject": "kproxy.errors",
    "InvalidTransition": "kproxy.errors",
    "KernelError": "kproxy.errors",
    "KproxyError": "kproxy.errors",
    "ManifestSource": "kproxy.sources",
    "MemorySource": "kproxy.sources",
    "NoEndpointsError": "kproxy.errors",
    "NodeConfig": "kproxy.model",
    "Protocol": "kproxy.model",
    "RoundRobinBalancer": "kproxy.modes.userspace",
    "RunningProxy": "kproxy.daemon",
    "Service": "kproxy.model",
    "ServicePortInfo": "kproxy.model",
    "ServicePortName": "kproxy.model",
    "Snapshot": "kproxy.model",
    "Source": "kproxy.sources",
    "SourceError": "kproxy.errors",
    "SyncEngine": "kproxy.sync",
    "UserspaceOptions": "kproxy.daemon",
    "UserspaceProxy": "kproxy.modes.userspace",
    "build_snapshot": "kproxy.model",
    "load_manifests": "kproxy.sources",
    "parse_objects": "kproxy.model",
    "running_userspace_proxy": "kproxy.daemon",
}


def __getattr__(name: str) -> Any:
    """The public name ``name``, imported from its module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kproxy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


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
