"""From the run configuration to the running parts: the source, the Node, health and metrics.

:func:`build_source` picks ``--manifests`` (standard input for ``-``) or the cluster
(``--kubeconfig``/``--master``/in-cluster); :func:`node_facts` and :func:`node_watch` read and
follow this node's Node for a cluster source; :func:`observability_options` gives the health and
metrics addresses; :func:`log_config_warnings` says what the configuration leaves unused. The
kube client is imported only when a cluster source is asked for (it is heavy, and manifests need
none of it).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any, TextIO

import structlog

from kproxy.config.defaults import STDIN_PATH
from kproxy.config.run import RunConfig
from kproxy.errors import ConfigError, SourceError
from kproxy.model import KubeObject
from kproxy.observability.server import ObservabilityOptions
from kproxy.sources.base import Source
from kproxy.sources.memory import MemorySource
from kproxy.trace.build import parse_manifest_text

__all__ = ["build_source", "log_config_warnings", "node_facts", "node_watch", "observability_options",
           "read_node_facts", "read_stdin_manifests"]

_log = structlog.get_logger("kproxy")


def read_stdin_manifests(stdin: TextIO | None = None) -> tuple[KubeObject, ...]:
    """The objects of the YAML/JSON stream on standard input (``--manifests -``), read to the end once.

    Each problem is logged with its document; the valid objects are returned.
    """
    objects, problems = parse_manifest_text((stdin or sys.stdin).read())
    for problem in problems:
        _log.error("invalid manifest content skipped", error=str(problem))
    return tuple(objects)


def build_source(run: RunConfig, *, stdin: TextIO | None = None,
                 stdin_objects: tuple[KubeObject, ...] | None = None) -> Source:
    """The source the configuration names: ``--manifests``, or the cluster (``--kubeconfig``, ``--master``).

    ``--manifests -`` reads standard input once, at start (a stream cannot be re-read; the
    objects are served as they were): pass what :func:`read_stdin_manifests` read as
    ``stdin_objects`` to build the source again on a reload.

    Raises:
        ConfigError: no source outside a pod; ``-`` among other paths; a manifest path does not
            exist; the kubeconfig file is missing or not YAML; ``--master`` is not a URL.
    """
    source = run.source
    if source.cluster:
        from kproxy.sources.kube import check_client_flags

        check_client_flags(kubeconfig=source.kubeconfig, master=source.master)
    if source.reads_stdin:
        if len(source.manifests) > 1:
            raise ConfigError("--manifests: `kproxy run` reads standard input (-) alone, not with files or "
                              "folders (they are watched; a stream is read once)")
        return MemorySource(stdin_objects if stdin_objects is not None else read_stdin_manifests(stdin))
    if source.manifests:
        from kproxy.sources.manifests import ManifestSource

        for path in source.manifests:
            if not os.path.exists(path):
                raise ConfigError(f"--manifests: {path!r} does not exist; expected a file or a folder")
        own_files = [run.userspace.address_map] if run.userspace.address_map else []
        return ManifestSource(source.manifests, ignore=own_files)
    if not source.cluster and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise ConfigError("no source: give --manifests PATH... or --kubeconfig FILE (or --master URL), "
                          "or run in a pod for the in-cluster configuration")
    from kproxy.sources.kube import KubeSource, KubeSourceOptions, api_client_factory

    return KubeSource(api_client_factory(kubeconfig=source.kubeconfig, master=source.master),
                      options=KubeSourceOptions(service_proxy_name=source.service_proxy_name))


def node_facts(run: RunConfig) -> tuple[str | None, bool]:
    """``(zone, eligible)`` of this node, outside an event loop (see :func:`read_node_facts`).

    Raises:
        ConfigError: the client configuration (kubeconfig) cannot be loaded.
    """
    return asyncio.run(read_node_facts(run))


async def read_node_facts(run: RunConfig) -> tuple[str | None, bool]:
    """``(zone, eligible)`` of this node: ``--node-zone`` or, for a cluster source, its Node's label.

    A Node that cannot be read is logged and treated as eligible without a zone.

    Raises:
        ConfigError: the client configuration (kubeconfig) cannot be loaded.
    """
    if run.source.manifests or run.node.zone is not None:
        return run.node.zone, True
    from kproxy.sources.kube import api_client_factory, read_node_info

    factory = api_client_factory(kubeconfig=run.source.kubeconfig, master=run.source.master)
    try:
        info = await read_node_info(factory, run.node.hostname)
    except SourceError as err:  # a ConfigError (the client configuration) stops the start-up instead
        _log.warning("cannot read this node's zone; topology hints need --node-zone", node=run.node.hostname,
                     error=str(err))
        return None, True
    return info.zone, info.eligible


def node_watch(run: RunConfig) -> Any:
    """A :class:`~kproxy.sources.kube.NodeWatch` of this node for a cluster source, else None."""
    if run.source.manifests:
        return None
    from kproxy.sources.kube import NodeWatch, api_client_factory

    return NodeWatch(api_client_factory(kubeconfig=run.source.kubeconfig, master=run.source.master),
                     run.node.hostname)


def observability_options(run: RunConfig, *, eligible: bool = True) -> ObservabilityOptions:
    """The health and metrics addresses of the configuration (errors name their flag or file field)."""
    obs = run.observability
    return ObservabilityOptions(
        healthz_bind_address=obs.healthz_bind_address, metrics_bind_address=obs.metrics_bind_address,
        node_eligible=eligible, proxy_mode=run.proxy_mode,
        health_check_addresses=obs.healthcheck_bind_addresses, healthz_name=obs.healthz_from,
        metrics_name=obs.metrics_from)


def log_config_warnings(run: RunConfig) -> None:
    """Log each flag the mode does not use, each ``--config`` field kproxy cannot honour, and each note."""
    for flag in run.ignored_flags:
        _log.warning("flag ignored: the proxy mode does not use it", flag=flag, proxy_mode=run.proxy_mode)
    for name in run.unhonoured_fields:
        _log.warning("--config field ignored: kproxy does not honour it in this mode", file=run.config_file,
                     field=name, proxy_mode=run.proxy_mode)
    for note in run.notes:
        _log.info(note)
    if STDIN_PATH in run.source.manifests:
        _log.info("reading the manifests from standard input once; they are served as read")
