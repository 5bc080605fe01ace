"""The ``kube`` source: Services and EndpointSlices of a live API server, through kubernetes-asyncio.

Two reflectors (:mod:`kproxy.sources._kube_reflector`) list and watch Services (``v1``) and
EndpointSlices (``discovery.k8s.io/v1``) in every namespace with kube-proxy's label selector
(:func:`~kproxy.sources._kube_protocol.label_selector`); the Services are also selected with
kube-proxy's field selector :data:`SERVICE_FIELD_SELECTOR` (``spec.clusterIP!=None``: headless
Services never cross the wire; kube-proxy builds a separate informer factory for them in
``cmd/kube-proxy/app/server.go``), while the EndpointSlices keep only the label selector. The
source calls ``synced()`` once both have emitted their first list, as kube-proxy waits for both
informers' ``HasSynced``.

Where the client comes from follows kube-proxy (``cmd/kube-proxy/app/server.go``,
``createClient``): ``--kubeconfig`` (with ``--master`` overriding its server), else ``--master``
alone, else the in-cluster configuration (the pod's service account). See
:func:`api_client_factory`.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from kproxy.clock import Clock, MonotonicClock
from kproxy.errors import ConfigError, InvalidArgument, SourceError
from kproxy.sources._kube_protocol import Backoff, WatchLine, label_selector
from kproxy.sources._kube_reflector import Reflector, ReflectorOptions, ReflectorStatus
from kproxy.sources.base import Emit, Event, Synced

__all__ = [
    "LABEL_ZONE",
    "SERVICE_FIELD_SELECTOR",
    "TO_BE_DELETED_TAINT",
    "ApiClientFactory",
    "KubeSource",
    "KubeSourceOptions",
    "NodeInfo",
    "NodeWatch",
    "ReflectorStatus",
    "api_client_factory",
    "check_client_flags",
    "default_hostname",
    "node_info_from",
    "read_node_info",
]

_log = structlog.get_logger("kproxy.sources.kube")

#: The node label carrying its zone, read for topology hints.
LABEL_ZONE = "topology.kubernetes.io/zone"
#: The taint the Cluster Autoscaler puts on a node it is about to delete; kube-proxy then
#: reports ``nodeEligible: false`` (``pkg/proxy/healthcheck/proxy_health.go``).
TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"

#: kube-proxy's field selector on Services: headless Services (``clusterIP: None``) are not proxied.
SERVICE_FIELD_SELECTOR = "spec.clusterIP!=None"

#: ``await factory()`` returns a kubernetes-asyncio ``ApiClient`` the source closes when done.
ApiClientFactory = Callable[[], Awaitable[Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeSourceOptions:
    """How the kube source talks to the API server.

    Attributes:
        service_proxy_name: select Services labelled ``service.kubernetes.io/service-proxy-name``
            with this value instead of those without the label (None, as kube-proxy).
        watch_timeout_s: minimum server-side watch timeout, seconds (client-go: 300).
        stall_grace_s: how much longer than its timeout a silent watch may last, seconds.
        list_timeout_s: how long a list or a watch's connection may take, seconds.
        backoff: retry delays after a failure (client-go's: 0.8 s doubling to 30 s, jitter 1).
        bookmark_interval_s: how often the API server sends a BOOKMARK (about 60 s); a watch
            silent for twice that is taken as dead and restarted from its last version.
        keepalive_idle_s, keepalive_interval_s: TCP keepalive of the API connections, seconds
            (30 s idle, then 3 probes 5 s apart: a dead peer is noticed in about 45 s, as
            client-go's 30 s ping plus 15 s timeout).

    Raises:
        InvalidArgument: a duration that is not > 0 seconds.
    """

    service_proxy_name: str | None = None
    watch_timeout_s: float = 300.0
    stall_grace_s: float = 30.0
    list_timeout_s: float = 60.0
    backoff: Backoff = field(default_factory=Backoff)
    bookmark_interval_s: float = 60.0
    keepalive_idle_s: float = 30.0
    keepalive_interval_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("watch_timeout_s", "stall_grace_s", "list_timeout_s", "bookmark_interval_s",
                     "keepalive_idle_s", "keepalive_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidArgument(f"KubeSourceOptions.{name} must be > 0 seconds, got {name}={value!r}")

    def reflector_options(self) -> ReflectorOptions:
        """The timing each reflector runs with."""
        return ReflectorOptions(watch_timeout_s=self.watch_timeout_s, stall_grace_s=self.stall_grace_s,
                                list_timeout_s=self.list_timeout_s, backoff=self.backoff,
                                bookmark_interval_s=self.bookmark_interval_s,
                                keepalive_idle_s=self.keepalive_idle_s,
                                keepalive_interval_s=self.keepalive_interval_s)


class KubeSource:
    """A Source following a cluster's Services and EndpointSlices (list + watch).

    Args:
        client_factory: creates the kubernetes-asyncio ``ApiClient`` when :meth:`run` starts
            (see :func:`api_client_factory`); the source closes it when it stops.
        options: selector and timing.
        clock: time source for the stall watchdog and backoff (default monotonic).
        rng: jitter source (default ``random.Random()``).
    """

    def __init__(self, client_factory: ApiClientFactory, *, options: KubeSourceOptions | None = None,
                 clock: Clock | None = None, rng: random.Random | None = None) -> None:
        if not callable(client_factory):
            raise InvalidArgument(f"client_factory must be callable, got {client_factory!r}")
        self._factory = client_factory
        self._opts = options or KubeSourceOptions()
        self._clock: Clock = clock or MonotonicClock()
        self._rng = rng or random.Random()
        self._reflectors: list[Reflector] = []

    @property
    def options(self) -> KubeSourceOptions:
        """The options given."""
        return self._opts

    def status(self) -> tuple[ReflectorStatus, ...]:
        """One :class:`ReflectorStatus` per reflector (empty before :meth:`run`)."""
        return tuple(r.status() for r in self._reflectors)

    def last_activity_age(self) -> dict[str, float]:
        """``{kind: seconds since its reflector last heard from the API}``."""
        now = self._clock.now()
        return {s.kind: now - s.last_activity for s in self.status()}

    async def run(self, emit: Emit, synced: Synced) -> None:
        """List, call ``synced()`` once both kinds are listed, then watch until cancelled.

        Raises:
            ConfigError: the client configuration cannot be loaded.
        """
        api = await self._factory()
        try:
            listed: set[str] = set()

            def on_listed(kind: str) -> None:
                if len(listed) < 2:
                    listed.add(kind)
                    if len(listed) == 2:
                        synced()

            selector = label_selector(self._opts.service_proxy_name)
            ropts = self._opts.reflector_options()
            core, discovery = k8s_client.CoreV1Api(api), k8s_client.DiscoveryV1Api(api)
            self._reflectors = [
                Reflector(kind="Service", api_version="v1", call=core.list_service_for_all_namespaces,
                          selector=selector, emit=emit, on_listed=on_listed, options=ropts,
                          clock=self._clock, rng=self._rng, field_selector=SERVICE_FIELD_SELECTOR),
                Reflector(kind="EndpointSlice", api_version="discovery.k8s.io/v1",
                          call=discovery.list_endpoint_slice_for_all_namespaces, selector=selector,
                          emit=emit, on_listed=on_listed, options=ropts, clock=self._clock, rng=self._rng),
            ]
            _log.info("watching the API server", host=getattr(api.configuration, "host", "?"),
                      label_selector=selector, service_field_selector=SERVICE_FIELD_SELECTOR)
            async with asyncio.TaskGroup() as tg:
                for reflector in self._reflectors:
                    tg.create_task(reflector.run(), name=f"kube-{reflector.kind}")
        finally:
            await api.close()


class NodeWatch:
    """Follow this node's own Node object (list + watch, ``fieldSelector=metadata.name=NAME``).

    As kube-proxy's Node informer (``pkg/proxy/config`` NodeConfig handlers): every change of the
    Node calls ``on_node`` with its :class:`NodeInfo`, so ``/healthz`` follows its eligibility
    (``proxy_health.go``: a deletion timestamp or the ``ToBeDeletedByClusterAutoscaler`` taint
    makes it ineligible) and topology hints follow its zone label. A Node deleted (or gone
    from a relist) is reported ineligible. Failures are retried by the reflector's backoff; the
    last known state stays in force.

    Args:
        client_factory: as :class:`KubeSource`'s; the watch closes the client when it stops.
        name: the node name.
        options: timing (``service_proxy_name`` is not used).
        clock, rng: as :class:`KubeSource`'s.
    """

    def __init__(self, client_factory: ApiClientFactory, name: str, *,
                 options: KubeSourceOptions | None = None, clock: Clock | None = None,
                 rng: random.Random | None = None) -> None:
        if not name:
            raise InvalidArgument("NodeWatch needs a node name")
        self._factory = client_factory
        self.name = name
        self._opts = options or KubeSourceOptions()
        self._clock: Clock = clock or MonotonicClock()
        self._rng = rng or random.Random()
        self._reflector: Reflector | None = None

    def status(self) -> ReflectorStatus | None:
        """The reflector's status (None before :meth:`run`)."""
        return None if self._reflector is None else self._reflector.status()

    async def run(self, on_node: Callable[[NodeInfo], None]) -> None:
        """List and watch the Node until cancelled, calling ``on_node`` at each change.

        Raises:
            ConfigError: the client configuration cannot be loaded.
        """
        api = await self._factory()
        try:
            ropts = self._opts.reflector_options()

            def ignore(_: Any) -> None:
                return None

            self._reflector = _NodeReflector(
                self.name, on_node, kind="Node", api_version="v1", call=k8s_client.CoreV1Api(api).list_node,
                selector="", emit=ignore, on_listed=ignore, options=ropts, clock=self._clock, rng=self._rng,
                field_selector=f"metadata.name={self.name}")
            await self._reflector.run()
        finally:
            await api.close()


class _NodeReflector(Reflector):
    """A reflector of one Node that reports :class:`NodeInfo` instead of emitting events."""

    def __init__(self, name: str, on_node: Callable[[NodeInfo], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._name = name
        self._on_node = on_node
        self._last: NodeInfo | None = None

    def _report(self, info: NodeInfo) -> None:
        if info != self._last:
            self._last = info
            _log.info("node changed", node=info.name, zone=info.zone, eligible=info.eligible)
            self._on_node(info)

    def _gone(self) -> NodeInfo:
        zone = self._last.zone if self._last is not None else None
        return NodeInfo(name=self._name, zone=zone, eligible=False)

    def _absorb_list(self, items: list[Any]) -> None:
        mine = [i for i in items if isinstance(i, Mapping) and node_info_from(i).name == self._name]
        if mine:
            self._report(node_info_from(mine[0]))
        elif self._last is not None:  # it was there and is gone
            self._report(self._gone())

    def _apply(self, wl: WatchLine) -> Event | None:
        if not isinstance(wl.obj, Mapping) or node_info_from(wl.obj).name != self._name:
            return None
        self._report(self._gone() if wl.type == "DELETED" else node_info_from(wl.obj))
        return None


# -- the client configuration ------------------------------------------------------------------


def check_client_flags(*, kubeconfig: str | os.PathLike[str] | None = None,
                       master: str | None = None) -> None:
    """Check ``--kubeconfig`` and ``--master`` before anything starts (kube-proxy fails at start too).

    Raises:
        ConfigError: the kubeconfig file is missing, unreadable or not a YAML mapping, or
            ``master`` is not an ``http(s)://HOST[:PORT]`` URL; the message names the flag.
    """
    if master is not None:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(master)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as err:
            raise ConfigError(f"--master {master!r}: not a URL: {err}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or " " in master:
            raise ConfigError(f"--master {master!r}: expected an API server URL such as "
                              "https://10.0.0.1:6443")
    if kubeconfig is not None:
        import yaml

        where = os.fspath(kubeconfig)
        try:
            with open(where, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh)
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"--kubeconfig {where!r}: cannot read: "
                              f"{getattr(err, 'strerror', None) or err}") from None
        except yaml.YAMLError as err:
            detail = " ".join(str(err).split())
            raise ConfigError(f"--kubeconfig {where!r}: not valid YAML: {detail}") from None
        if not isinstance(doc, Mapping):
            raise ConfigError(f"--kubeconfig {where!r}: expected a kubeconfig (a YAML mapping), "
                              f"got {type(doc).__name__}")



def api_client_factory(
    *, kubeconfig: str | os.PathLike[str] | None = None, master: str | None = None,
    context: str | None = None,
) -> ApiClientFactory:
    """A factory for the ``ApiClient`` kube-proxy's flags describe.

    Args:
        kubeconfig: a kubeconfig file (``--kubeconfig``).
        master: the API server URL (``--master``); overrides the kubeconfig's server.
        context: the kubeconfig context (default: its current context).

    Returns:
        ``await factory()`` -> ``ApiClient``. Without ``kubeconfig`` and ``master``, the
        in-cluster configuration (``KUBERNETES_SERVICE_HOST`` and the service account).

    The factory raises :class:`~kproxy.errors.ConfigError` when the configuration cannot be
    loaded (a missing or invalid kubeconfig, not running in a pod).
    """

    async def factory() -> Any:
        cfg = k8s_client.Configuration()
        try:
            if kubeconfig is not None:
                await k8s_config.load_kube_config(config_file=os.fspath(kubeconfig), context=context,
                                                  client_configuration=cfg, persist_config=False)
            elif master is None:
                _log.info("neither --kubeconfig nor --master given; using the in-cluster configuration")
                k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except (k8s_config.ConfigException, OSError, ValueError, KeyError, TypeError) as err:
            where = f"--kubeconfig {os.fspath(kubeconfig)!r}" if kubeconfig is not None else "in-cluster"
            raise ConfigError(f"{where}: cannot load the client configuration: {err}; pass --kubeconfig "
                              "FILE or --master URL outside a pod") from err
        if master is not None:
            cfg.host = master.rstrip("/")
        return k8s_client.ApiClient(configuration=cfg)

    return factory


def default_hostname(override: str | None = None, *, environ: Mapping[str, str] | None = None,
                     gethostname: Callable[[], str] | None = None) -> str:
    """This node's name, as kube-proxy derives it.

    kube-proxy uses ``--hostname-override`` when given, else the host name (``nodeutil.
    GetHostname``), trimmed and lower-cased; its DaemonSet passes ``--hostname-override=
    $(NODE_NAME)`` from the downward API. kproxy reads ``NODE_NAME`` itself when no override
    is given, so that the same pod spec works without the flag.

    Raises:
        ConfigError: the result is empty.
    """
    env = os.environ if environ is None else environ
    if gethostname is None:
        import socket

        gethostname = socket.gethostname
    name = (override or env.get("NODE_NAME") or gethostname()).strip().lower()
    if not name:
        raise ConfigError("--hostname-override: the node name is empty; pass the node's name")
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """What kproxy reads from its own Node object.

    Attributes:
        name: the node name.
        zone: its ``topology.kubernetes.io/zone`` label, or None.
        eligible: not being deleted and not tainted ``ToBeDeletedByClusterAutoscaler``
            (kube-proxy's ``nodeEligible``).
    """

    name: str
    zone: str | None = None
    eligible: bool = True


def node_info_from(raw: Mapping[str, Any]) -> NodeInfo:
    """Read :class:`NodeInfo` from a Node object as the API returns it (pure)."""
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    assert isinstance(labels, Mapping)
    spec = raw.get("spec") if isinstance(raw.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    taints = spec.get("taints") if isinstance(spec.get("taints"), list) else []
    assert isinstance(taints, list)
    tainted = any(isinstance(t, Mapping) and t.get("key") == TO_BE_DELETED_TAINT for t in taints)
    zone = labels.get(LABEL_ZONE)
    return NodeInfo(name=str(meta.get("name") or ""), zone=zone if isinstance(zone, str) and zone else None,
                    eligible=not meta.get("deletionTimestamp") and not tainted)


async def read_node_info(client_factory: ApiClientFactory, name: str, *, timeout_s: float = 10.0) -> NodeInfo:
    """Read this node's zone and eligibility once (a ``GET /api/v1/nodes/NAME``).

    Raises:
        SourceError: the API did not answer with the Node.
        ConfigError: the client configuration cannot be loaded.
    """
    api = await client_factory()
    try:
        resp: Any = await k8s_client.CoreV1Api(api).read_node(name, _preload_content=False,
                                                         _request_timeout=timeout_s)
        try:
            body = await resp.read()
            status = int(resp.status)
        finally:
            resp.release()
        if status != 200:
            raise SourceError(f"reading Node {name!r} answered HTTP {status}: {body[:200]!r}")
        data = json.loads(body)
        if not isinstance(data, Mapping):
            raise SourceError(f"reading Node {name!r}: expected an object, got {body[:120]!r}")
        return node_info_from(data)
    except (OSError, TimeoutError, ValueError, aiohttp.ClientError) as err:
        if isinstance(err, SourceError):
            raise
        raise SourceError(f"reading Node {name!r} failed: {err}") from err
    finally:
        await api.close()
