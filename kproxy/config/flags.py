"""``kproxy run`` flags shared with kube-proxy, merged with ``--config``: flags, then the file, then defaults.

kube-proxy reads ``--config`` first and lets flags given on the command line override it;
these helpers do the same for the flags whose parser default is ``None`` ("not given").
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import structlog

from kproxy.config.kubeproxy import KubeProxyConfiguration, default_configuration, load_configuration
from kproxy.errors import ConfigError, SourceError
from kproxy.observability.server import ObservabilityOptions
from kproxy.sources.base import Source

__all__ = ["add_kube_flags", "build_source", "merge_config", "node_facts", "observability_options"]

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


def merge_config(args: argparse.Namespace) -> KubeProxyConfiguration:
    """Fill the flags left unset from ``--config`` (or kube-proxy's defaults); return the configuration.

    kproxy's health address default is 127.0.0.1:10256 rather than kube-proxy's 0.0.0.0 unless the
    file sets ``healthzBindAddress`` (see :mod:`kproxy.observability.server`).

    Raises:
        ConfigError: the file is invalid.
    """
    cfg = load_configuration(args.config) if args.config else default_configuration()
    given = cfg.document
    if args.min_sync_period is None:
        args.min_sync_period = f"{cfg.min_sync_period_s}s" if args.config else "1s"
    if args.sync_period is None:
        args.sync_period = f"{cfg.sync_period_s}s" if args.config else "30s"
    if args.hostname_override is None and cfg.hostname_override:
        args.hostname_override = cfg.hostname_override
    if args.kubeconfig is None and cfg.kubeconfig:
        args.kubeconfig = cfg.kubeconfig
    if args.healthz_bind_address is None:
        explicit = args.config and _raw_field(args.config, "healthzBindAddress")
        args.healthz_bind_address = given["healthzBindAddress"] if explicit else "127.0.0.1:10256"
    if args.metrics_bind_address is None:
        args.metrics_bind_address = given["metricsBindAddress"]
    # iptables-mode settings (flags absent on subcommands that do not take them are left alone).
    if getattr(args, "cluster_cidr", "") is None and cfg.cluster_cidr:
        args.cluster_cidr = cfg.cluster_cidr
    if args.config and hasattr(args, "masquerade_all") and not args.masquerade_all:
        args.masquerade_all = bool(given["iptables"]["masqueradeAll"])
    if getattr(args, "nodeport_addresses", "") is None and given.get("nodePortAddresses"):
        args.nodeport_addresses = ",".join(given["nodePortAddresses"])
    return cfg


def _raw_field(path: str, name: str) -> bool:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and bool(raw.get(name))


def build_source(args: argparse.Namespace) -> Source:
    """The source the flags name: ``--manifests`` or the cluster (``--kubeconfig``/``--master``/in-cluster).

    Raises:
        ConfigError: both or neither were given outside a pod.
        SourceError: a manifest path does not exist.
    """
    kube = args.kubeconfig is not None or args.master is not None
    if args.manifests and kube:
        raise ConfigError("--manifests cannot be combined with --kubeconfig or --master; choose one source")
    if args.manifests:
        from kproxy.sources.manifests import ManifestSource

        own_files = [args.address_map] if getattr(args, "address_map", None) else []
        return ManifestSource(args.manifests, ignore=own_files)
    if not kube and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise ConfigError("no source: give --manifests PATH... or --kubeconfig FILE (or --master URL), "
                          "or run in a pod for the in-cluster configuration")
    from kproxy.sources.kube import KubeSource, KubeSourceOptions, api_client_factory

    return KubeSource(api_client_factory(kubeconfig=args.kubeconfig, master=args.master),
                      options=KubeSourceOptions(service_proxy_name=args.service_proxy_name))


def node_facts(args: argparse.Namespace, hostname: str) -> tuple[str | None, bool]:
    """``(zone, eligible)`` of this node: ``--node-zone`` or, for a cluster source, its Node's label.

    A Node that cannot be read is logged and treated as eligible without a zone.
    """
    if args.manifests or args.node_zone is not None:
        return args.node_zone, True
    from kproxy.sources.kube import api_client_factory, read_node_info

    try:
        info = asyncio.run(read_node_info(api_client_factory(kubeconfig=args.kubeconfig, master=args.master),
                                          hostname))
    except (SourceError, ConfigError) as err:
        _log.warning("cannot read this node's zone; topology hints need --node-zone", node=hostname,
                     error=str(err))
        return None, True
    return info.zone, info.eligible


def observability_options(args: argparse.Namespace, *, eligible: bool = True) -> ObservabilityOptions:
    """The health and metrics addresses after :func:`merge_config`."""
    return ObservabilityOptions(healthz_bind_address=args.healthz_bind_address,
                                metrics_bind_address=args.metrics_bind_address, node_eligible=eligible,
                                proxy_mode=args.proxy_mode)
