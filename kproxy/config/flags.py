"""``kproxy run`` flags shared with kube-proxy, merged with ``--config``: flags, then the file, then defaults.

kube-proxy reads ``--config`` first and lets flags given on the command line override it;
these helpers do the same for the flags whose parser default is ``None`` ("not given").
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import structlog

from kproxy.config.kubeproxy import KubeProxyConfiguration, default_configuration, load_configuration
from kproxy.errors import ConfigError

__all__ = ["add_kube_flags", "merge_config", "unhonoured_fields"]

_log = structlog.get_logger("kproxy")


def add_kube_flags(run: argparse.ArgumentParser, source_group: Any) -> None:
    """Add ``--kubeconfig``, ``--master``, ``--config`` and the health and metrics addresses."""
    source_group.add_argument("--kubeconfig", default=None, metavar="FILE",
                              help="follow a cluster: the kubeconfig file (exclusive with --manifests)")
    source_group.add_argument("--master", default=None, metavar="URL",
                              help="the API server URL (overrides the kubeconfig's server)")
    run.add_argument("--config", default=None, metavar="FILE",
                     help="a KubeProxyConfiguration file; flags given on the command line override it")
    obs = run.add_argument_group("health and metrics")
    obs.add_argument("--healthz-bind-address", default=None, metavar="IP:PORT",
                     help="/healthz and /livez (default 127.0.0.1:10256; kube-proxy's is 0.0.0.0:10256; "
                          "'' disables)")
    obs.add_argument("--metrics-bind-address", default=None, metavar="IP:PORT",
                     help="/metrics (default 127.0.0.1:10249; '' disables)")
    obs.add_argument("--healthcheck-bind-addresses", default="127.0.0.1", metavar="IP[,IP]",
                     help="the addresses health check node ports listen on (default 127.0.0.1; "
                          "kube-proxy uses every node address within --nodeport-addresses: pass 0.0.0.0 "
                          "or the node IPs)")


#: ``--config`` fields ``kproxy run`` honours in every mode ...
_HONOURED = frozenset({
    "apiVersion", "kind", "hostnameOverride", "clientConnection.kubeconfig", "bindAddress",
    "healthzBindAddress", "metricsBindAddress", "mode", "iptables.syncPeriod", "iptables.minSyncPeriod"})
#: ... and those it honours in iptables mode only.
_HONOURED_IPTABLES = frozenset({
    "iptables.masqueradeBit", "iptables.masqueradeAll", "iptables.localhostNodePorts", "clusterCIDR",
    "nodePortAddresses", "ipvs.scheduler"})
#: ``kproxy run``'s modes; the file's ``mode: ""`` (kube-proxy's platform default) means userspace.
_RUN_MODES = ("userspace", "iptables", "ipvs")


def merge_config(args: argparse.Namespace) -> KubeProxyConfiguration:
    """Fill the flags left unset from ``--config`` (or kube-proxy's defaults); return the configuration.

    Flags given on the command line win over the file. The file's ``mode`` settles
    ``--proxy-mode`` when the flag is absent (``""``, kube-proxy's platform default, is
    kproxy's default, userspace). A field the file sets to a non-default value that kproxy
    cannot honour in the chosen mode is logged as a warning naming it, never silently dropped.
    Sets ``args.<flag>_from`` (``min_sync_period``, ``sync_period``, ``healthz_bind_address``,
    ``metrics_bind_address``) to what an error about the value should name: the flag or the
    file's field.

    kproxy's health address default is 127.0.0.1:10256 rather than kube-proxy's 0.0.0.0 unless the
    file sets ``healthzBindAddress`` (see :mod:`kproxy.observability.server`).

    Raises:
        ConfigError: the file is invalid, or its ``mode`` is one ``kproxy run`` does not run.
    """
    cfg = load_configuration(args.config) if args.config else default_configuration()
    given = cfg.document
    raw = _raw_document(args.config) if args.config else {}

    def field(name: str) -> str:
        return f"{cfg.source}: {name}"

    if getattr(args, "proxy_mode", "") is None:
        if cfg.mode and cfg.mode not in _RUN_MODES:
            raise ConfigError(f"{field('mode')}: `kproxy run` runs {' and '.join(_RUN_MODES)} only, "
                              f"got {cfg.mode!r} (override with --proxy-mode)")
        args.proxy_mode = cfg.mode or "userspace"
    args.min_sync_period_from = "--min-sync-period"
    args.sync_period_from = "--sync-period"
    if args.min_sync_period is None:
        args.min_sync_period = f"{cfg.min_sync_period_s}s" if args.config else "1s"
        if args.config:
            args.min_sync_period_from = field("iptables.minSyncPeriod")
    if args.sync_period is None:
        args.sync_period = f"{cfg.sync_period_s}s" if args.config else "30s"
        if args.config:
            args.sync_period_from = field("iptables.syncPeriod")
    if args.hostname_override is None and cfg.hostname_override:
        args.hostname_override = cfg.hostname_override
    if args.kubeconfig is None and cfg.kubeconfig:
        args.kubeconfig = cfg.kubeconfig
    args.healthz_bind_address_from = "--healthz-bind-address"
    if args.healthz_bind_address is None:
        explicit = bool(raw.get("healthzBindAddress"))
        args.healthz_bind_address = given["healthzBindAddress"] if explicit else "127.0.0.1:10256"
        if explicit:
            args.healthz_bind_address_from = field("healthzBindAddress")
    args.metrics_bind_address_from = "--metrics-bind-address"
    if args.metrics_bind_address is None:
        args.metrics_bind_address = given["metricsBindAddress"]
        if raw.get("metricsBindAddress"):
            args.metrics_bind_address_from = field("metricsBindAddress")
    # iptables-mode settings (flags absent on subcommands that do not take them are left alone).
    if getattr(args, "cluster_cidr", "") is None and cfg.cluster_cidr:
        args.cluster_cidr = cfg.cluster_cidr
    if getattr(args, "masquerade_all", "") is None:
        args.masquerade_all = bool(given["iptables"]["masqueradeAll"])
    if getattr(args, "iptables_masquerade_bit", "") is None:
        args.iptables_masquerade_bit = int(given["iptables"]["masqueradeBit"])
    if getattr(args, "iptables_localhost_nodeports", "") is None:
        args.iptables_localhost_nodeports = bool(given["iptables"]["localhostNodePorts"])
    if getattr(args, "ipvs_scheduler", "") is None and given["ipvs"].get("scheduler"):
        args.ipvs_scheduler = given["ipvs"]["scheduler"]
    if getattr(args, "nodeport_addresses", "") is None and given.get("nodePortAddresses"):
        args.nodeport_addresses = ",".join(given["nodePortAddresses"])
    if args.config:
        iptables = getattr(args, "proxy_mode", "") in ("iptables", "ipvs")
        honoured = _HONOURED | _HONOURED_IPTABLES if iptables else _HONOURED
        for name in unhonoured_fields(cfg, raw, honoured):
            _log.warning("--config field ignored: kproxy does not honour it in this mode", file=args.config,
                         field=name, proxy_mode=getattr(args, "proxy_mode", None))
    return cfg


def unhonoured_fields(cfg: KubeProxyConfiguration, raw: Mapping[str, Any],
                      honoured: frozenset[str]) -> list[str]:
    """The dotted fields ``raw`` sets to a non-default value that are not in ``honoured`` (pure)."""
    defaults = default_configuration()
    out = []
    for name in _leaf_paths(raw):
        if name in honoured:
            continue
        try:
            if cfg.get(name) == defaults.get(name):
                continue
        except ConfigError:
            pass
        out.append(name)
    return out


def _leaf_paths(raw: Mapping[str, Any], prefix: str = "") -> list[str]:
    groups = ("clientConnection", "iptables", "ipvs", "nftables", "winkernel", "detectLocal", "conntrack")
    out: list[str] = []
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if not prefix and key in groups and isinstance(value, Mapping):
            out.extend(_leaf_paths(value, f"{path}."))
        elif value is not None:
            out.append(path)
    return out


def _raw_document(path: str) -> Mapping[str, Any]:
    """The file as written, before defaults (it already loaded once, so it parses)."""
    import json

    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        raw = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return raw if isinstance(raw, Mapping) else {}
