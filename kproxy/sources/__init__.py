"""Sources of Service and EndpointSlice events: the Source interface, manifests and memory.

The ``kube`` source (list + watch through kubernetes-asyncio, :mod:`kproxy.sources.kube`)
implements the same :class:`Source` protocol; its reflector uses :func:`diff_objects` after a
relist. It is imported from its module, not here, so that this package loads without
kubernetes-asyncio.
"""

from kproxy.sources.base import (
    Emit,
    Event,
    EventType,
    ObjectKey,
    Source,
    Synced,
    diff_objects,
    object_key,
)
from kproxy.sources.manifests import MANIFEST_SUFFIXES, ManifestSource, load_manifests
from kproxy.sources.memory import MemorySource

__all__ = [
    "MANIFEST_SUFFIXES",
    "Emit",
    "Event",
    "EventType",
    "ManifestSource",
    "MemorySource",
    "ObjectKey",
    "Source",
    "Synced",
    "diff_objects",
    "load_manifests",
    "object_key",
]
