"""An API server for harnesses (``kproxy cluster serve``): manifests served with list and watch,
discovery as far as kubectl needs it, and the ``pods/portforward`` subresource."""

from kproxy.cluster.server import NETNS_ANNOTATION, ClusterServer, dialer_for
from kproxy.cluster.store import RESOURCES, Change, ChangeType, Store

__all__ = ["NETNS_ANNOTATION", "RESOURCES", "Change", "ChangeType", "ClusterServer", "Store", "dialer_for"]
