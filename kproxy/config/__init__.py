"""kproxy's configuration: the run configuration every command shares, and kube-proxy's configuration file.

- :mod:`kproxy.config.run`: :class:`RunConfig` and its sections, frozen and typed;
- :mod:`kproxy.config.build`: :func:`build_run_config`, from flags, ``--config`` and the environment;
- :mod:`kproxy.config.defaults`: every default, once;
- :mod:`kproxy.config.kubeproxy`: KubeProxyConfiguration (``kubeproxy.config.k8s.io/v1alpha1``);
- :mod:`kproxy.config.flags`: the flag table, and the file fields kproxy honours;
- :mod:`kproxy.config.values`, :mod:`kproxy.config.durations`, :mod:`kproxy.config.goparse`: values
  read as kube-proxy reads them.
"""

from kproxy.config.build import build_run_config
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
from kproxy.config.run import (
    Command,
    IngressSettings,
    Kernel,
    LogFormat,
    LogLevel,
    NodeSettings,
    ObservabilitySettings,
    RuleSettings,
    RunConfig,
    SourceSettings,
    SyncSettings,
    UserspaceSettings,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "MODES",
    "NODEPORT_ADDRESSES_PRIMARY",
    "Command",
    "IngressSettings",
    "Kernel",
    "KubeProxyConfiguration",
    "LogFormat",
    "LogLevel",
    "NodeSettings",
    "ObservabilitySettings",
    "RuleSettings",
    "RunConfig",
    "SourceSettings",
    "SyncSettings",
    "UserspaceSettings",
    "build_run_config",
    "check_nodeport_addresses",
    "default_configuration",
    "dump_configuration",
    "load_configuration",
    "nodeport_addresses_flag",
    "parse_configuration",
]
