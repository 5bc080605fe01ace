"""The flags a run configuration is built from, which modes use them, and the file fields kproxy honours.

Flags are named as kube-proxy names them (``--proxy-mode``, ``--hostname-override``); the CLI
parses them and hands :func:`kproxy.config.build.build_run_config` only the ones given on the
command line, so "given" is never confused with "left at its default" (a flag given wins over
``--config``, as in kube-proxy).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kproxy.config.kubeproxy import KubeProxyConfiguration, default_configuration
from kproxy.errors import ConfigError

__all__ = [
    "CAP_FLAGS",
    "EBPF_ONLY_FLAGS",
    "INGRESS_FLAGS",
    "IPVS_ONLY_FLAGS",
    "KERNEL_ONLY_FLAGS",
    "NFTABLES_ONLY_FLAGS",
    "NODE_FLAGS",
    "RULE_FLAGS",
    "RUN_FLAGS",
    "USERSPACE_ONLY_FLAGS",
    "honoured_fields",
    "unhonoured_fields",
]

#: The node flags every command takes, with the same meaning everywhere.
NODE_FLAGS = ("--hostname-override", "--node-ip", "--node-zone", "--ip-families", "--ip-family")
#: kube-proxy's flags that shape the rules (``render``, ``trace``, ``verify`` and ``run``).
RULE_FLAGS = ("--proxy-mode", "--cluster-cidr", "--masquerade-all", "--nodeport-addresses",
              "--iptables-masquerade-bit", "--iptables-localhost-nodeports", "--ipvs-scheduler",
              "--service-cidr")
#: The userspace connection caps (``UserspaceSettings.max_*``).
CAP_FLAGS = ("--max-connections", "--max-connections-per-service", "--max-udp-sessions",
             "--max-udp-sessions-per-service")
#: Flags only the userspace mode uses.
USERSPACE_ONLY_FLAGS = ("--bind-address", "--loopback-block", "--address-map", "--udp-timeout",
                        "--drain-timeout", *CAP_FLAGS)
#: Flags only the kernel modes (iptables, nftables, ipvs) use.
KERNEL_ONLY_FLAGS = ("--node-ip", "--cluster-cidr", "--masquerade-all", "--nodeport-addresses",
                     "--iptables-masquerade-bit", "--iptables-localhost-nodeports", "--kernel",
                     "--ipvs-scheduler", "--service-cidr")
#: Flags only the ipvs mode uses.
IPVS_ONLY_FLAGS = ("--ipvs-scheduler",)
#: Flags only the ebpf mode uses (Cilium's names).
EBPF_ONLY_FLAGS = ("--bpf-lb-algorithm", "--bpf-lb-maglev-table-size", "--bpf-lb-maglev-hash-seed")
#: The HTTP (layer 7) plane's flags, honoured in every mode.
INGRESS_FLAGS = ("--ingress-bind-address", "--ingress-class")
#: Flags only the nftables mode uses.
NFTABLES_ONLY_FLAGS = ("--service-cidr",)
#: Every flag :func:`~kproxy.config.build.build_run_config` reads.
RUN_FLAGS = frozenset({
    "--manifests", "--kubeconfig", "--master", "--config", "--service-proxy-name", *NODE_FLAGS,
    *RULE_FLAGS, *EBPF_ONLY_FLAGS, "--kernel", "--min-sync-period", "--sync-period", *USERSPACE_ONLY_FLAGS,
    "--healthz-bind-address", "--metrics-bind-address", "--healthcheck-bind-addresses", "--log-format",
    "--log-level", *INGRESS_FLAGS})

#: ``--config`` fields ``kproxy run`` honours in every mode ...
_HONOURED = frozenset({
    "apiVersion", "kind", "hostnameOverride", "clientConnection.kubeconfig", "bindAddress",
    "healthzBindAddress", "metricsBindAddress", "mode", "iptables.syncPeriod", "iptables.minSyncPeriod"})
#: ... and those it honours in the kernel modes only.
_HONOURED_KERNEL = frozenset({
    "iptables.masqueradeBit", "iptables.masqueradeAll", "iptables.localhostNodePorts", "clusterCIDR",
    "nodePortAddresses", "ipvs.scheduler", "ipvs.syncPeriod", "ipvs.minSyncPeriod", "nftables.syncPeriod",
    "nftables.minSyncPeriod"})
#: The groups whose fields are reported one by one.
_GROUPS = ("clientConnection", "iptables", "ipvs", "nftables", "winkernel", "detectLocal", "conntrack")
#: component-base's logging defaults (``logs/api/v1``: ``SetRecommendedLoggingConfiguration``),
#: with the zero values kubeadm writes (``flushFrequency: 0`` is defaulted to 5s).
_LOGGING_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "format": ("", "text"), "flushFrequency": (0, "0", "0s", "5s", 5_000_000_000), "verbosity": (0,),
    "vmodule": (None, [], ""), "options.json.infoBufferSize": ("0", 0), "options.json.splitStream": (False,),
    "options.text.infoBufferSize": ("0", 0), "options.text.splitStream": (False,)}


def honoured_fields(kernel_mode: bool) -> frozenset[str]:
    """The dotted ``--config`` fields ``kproxy run`` honours (every mode, plus the kernel modes' own)."""
    return _HONOURED | _HONOURED_KERNEL if kernel_mode else _HONOURED


def unhonoured_fields(cfg: KubeProxyConfiguration, honoured: frozenset[str]) -> list[str]:
    """The dotted fields ``cfg``'s file sets to a non-default value that are not in ``honoured`` (pure).

    ``logging`` counts field by field against component-base's defaults, so the all-default
    block kubeadm writes is not reported.
    """
    defaults = default_configuration()
    out = []
    for name in _leaf_paths(cfg.written):
        if name in honoured:
            continue
        if name.startswith("logging"):
            out.append(name)
            continue
        try:
            if cfg.get(name) == defaults.get(name):
                continue
        except ConfigError:
            pass
        out.append(name)
    return out


def _leaf_paths(raw: Mapping[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if not prefix and key == "logging":
            out.extend(_logging_changes(value))
        elif not prefix and key in _GROUPS and isinstance(value, Mapping):
            out.extend(_leaf_paths(value, f"{path}."))
        elif value is not None:
            out.append(path)
    return out


def _logging_changes(value: Any, prefix: str = "") -> list[str]:
    """The ``logging.*`` leaves set to something other than component-base's default."""
    if value is None or (isinstance(value, Mapping) and not value and not prefix):
        return []
    if not isinstance(value, Mapping):
        if value in _LOGGING_DEFAULTS.get(prefix, ()):
            return []
        return [f"logging.{prefix}" if prefix else "logging"]
    out: list[str] = []
    for key, inner in value.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(inner, Mapping):
            out.extend(_logging_changes(inner, path))
        elif inner not in _LOGGING_DEFAULTS.get(path, ()):
            out.append(f"logging.{path}")
    return out
