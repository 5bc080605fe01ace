"""From ``kproxy run``'s merged flags to the running parts: the source, the Node, health and metrics.

:func:`build_source` picks ``--manifests`` or the cluster (``--kubeconfig``/``--master``/in-cluster);
:func:`node_facts` and :func:`node_watch` read and follow this node's Node for a cluster source;
:func:`observability_options` gives the health and metrics addresses. The kube client is
imported only when a cluster source is asked for (it is heavy, and manifests need none of it).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
from typing import Any

import structlog

from kproxy.errors import ConfigError, SourceError
from kproxy.observability.server import ObservabilityOptions
from kproxy.sources.base import Source

__all__ = ["build_source", "node_facts", "node_watch", "observability_options"]

_log = structlog.get_logger("kproxy")


def _health_check_addresses(text: str) -> tuple[str, ...]:
    out = []
    for item in text.split(","):
        host = item.strip().strip("[]")
        try:
            out.append(str(ipaddress.ip_address(host)))
        except ValueError:
            raise ConfigError(f"--healthcheck-bind-addresses: {item.strip()!r} is not an IP address; "
                              "expected IP[,IP] (0.0.0.0 or :: for every address)") from None
    return tuple(out)


def build_source(args: argparse.Namespace) -> Source:
    """The source the flags name: ``--manifests`` or the cluster (``--kubeconfig``/``--master``/in-cluster).

    Raises:
        ConfigError: both or neither were given outside a pod; the kubeconfig file is missing or
            not YAML; ``--master`` is not a URL.
        SourceError: a manifest path does not exist.
    """
    kube = args.kubeconfig is not None or args.master is not None
    if args.manifests and kube:
        raise ConfigError("--manifests cannot be combined with --kubeconfig or --master; choose one source")
    if kube:
        from kproxy.sources.kube import check_client_flags

        check_client_flags(kubeconfig=args.kubeconfig, master=args.master)
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

    Raises:
        ConfigError: the client configuration (kubeconfig) cannot be loaded.
    """
    if args.manifests or args.node_zone is not None:
        return args.node_zone, True
    from kproxy.sources.kube import api_client_factory, read_node_info

    try:
        info = asyncio.run(read_node_info(api_client_factory(kubeconfig=args.kubeconfig, master=args.master),
                                          hostname))
    except SourceError as err:  # a ConfigError (the client configuration) stops the start-up instead
        _log.warning("cannot read this node's zone; topology hints need --node-zone", node=hostname,
                     error=str(err))
        return None, True
    return info.zone, info.eligible


def node_watch(args: argparse.Namespace, hostname: str) -> Any:
    """A :class:`~kproxy.sources.kube.NodeWatch` of this node for a cluster source, else None."""
    if args.manifests:
        return None
    from kproxy.sources.kube import NodeWatch, api_client_factory

    return NodeWatch(api_client_factory(kubeconfig=args.kubeconfig, master=args.master), hostname)


def observability_options(args: argparse.Namespace, *, eligible: bool = True) -> ObservabilityOptions:
    """The health and metrics addresses after :func:`merge_config`.

    Raises:
        ConfigError: ``--healthcheck-bind-addresses`` is not a list of IPs.
    """
    addresses = _health_check_addresses(getattr(args, "healthcheck_bind_addresses", "127.0.0.1"))
    return ObservabilityOptions(
        healthz_bind_address=args.healthz_bind_address, metrics_bind_address=args.metrics_bind_address,
        node_eligible=eligible, proxy_mode=args.proxy_mode, health_check_addresses=addresses,
        healthz_name=getattr(args, "healthz_bind_address_from", "--healthz-bind-address"),
        metrics_name=getattr(args, "metrics_bind_address_from", "--metrics-bind-address"))
