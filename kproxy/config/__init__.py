"""kube-proxy's configuration file: KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1)."""

from kproxy.config.kubeproxy import (
    API_VERSION,
    KIND,
    MODES,
    NODEPORT_ADDRESSES_PRIMARY,
    KubeProxyConfiguration,
    check_nodeport_addresses,
    default_configuration,
    dump_configuration,
    load_configuration,
    nodeport_addresses_flag,
    parse_configuration,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "MODES",
    "NODEPORT_ADDRESSES_PRIMARY",
    "KubeProxyConfiguration",
    "check_nodeport_addresses",
    "default_configuration",
    "dump_configuration",
    "load_configuration",
    "nodeport_addresses_flag",
    "parse_configuration",
]
