"""Ingress host and path routing as ingress-nginx lays it out, and its backends, from one Snapshot.

Theory of operation (ingress-nginx ``internal/ingress/controller/controller.go``
``getBackendServers`` and ``rootfs/etc/nginx/template/nginx.tmpl``):

* Only Ingresses of our class are served: the class is the ``kubernetes.io/ingress.class``
  annotation, else ``spec.ingressClassName``; an Ingress with neither is served too (admission
  gives it the default class; the default ``--ingress-class`` is ``nginx``). Ingresses are taken
  in creation order (then namespace/name), and for any conflict the first one wins.
* One *server* per rule host, plus the default server ``_`` (rules without a host and
  ``spec.defaultBackend``). A request's Host (lower case, port removed) picks the exact server,
  else the longest matching wildcard (``*.example.com`` matches any name ending in
  ``.example.com``, as nginx's ``server_name``), else the default server.
* Locations: ``Exact`` matches the path only; ``Prefix`` matches the path and anything below it,
  element-wise (``/foo`` matches ``/foo`` and ``/foo/bar``, not ``/foobar``);
  ``ImplementationSpecific`` is nginx's plain prefix (``/foo`` matches ``/foobar``). An exact
  match wins, else the longest prefix. A server with no ``/`` location gets one for the
  Ingress's ``defaultBackend``; with none, nothing matches and the default server answers 404.
* A backend (upstream) is one Service port, named ``namespace-service-port``. Its endpoints are
  the Snapshot's ready endpoints of that port (the same ones every mode uses); a port is found by
  number (``spec.ports[].port``) or by name. The first Ingress with ``affinity: cookie`` for a
  backend defines its affinity, and ``locations`` lists the ``(host, path)`` pairs of the
  Ingresses that enabled it; ``upstream-hash-by`` is taken the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kproxy.model import Endpoint, Ingress, IngressBackend, IPFamily, PathType, ServicePortInfo, Snapshot
from kproxy.modes.userspace.http.annotations import AnnotationReading, CookieAffinity, read_annotations
from kproxy.modes.userspace.http.sticky import node_id, upstream_name

__all__ = ["DEFAULT_SERVER", "Backend", "Location", "RouteMatch", "RouteTable", "path_matches"]

#: ingress-nginx's catch-all server name.
DEFAULT_SERVER = "_"


@dataclass(frozen=True, slots=True, kw_only=True)
class Backend:
    """One upstream: a Service port and its endpoints.

    Attributes:
        name: ``namespace-service-port``.
        namespace, service, port: the Ingress backend it came from (port: number or name).
        nodes: the endpoints as ``address:port``, sorted; empty means 503.
        affinity: the cookie affinity, or None.
        locations: ``{host: paths}`` where the affinity cookie may be set.
        hash_by: the ``upstream-hash-by`` template, or None.
    """

    name: str
    namespace: str
    service: str
    port: int | str
    nodes: tuple[str, ...] = ()
    affinity: CookieAffinity | None = None
    locations: Mapping[str, frozenset[str]] = field(default_factory=dict)
    hash_by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Location:
    """One ``location`` block: a path, its type, and the backend name it proxies to."""

    path: str
    path_type: PathType
    backend: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteMatch:
    """Where a request goes.

    Attributes:
        server: the server name matched (a host, a wildcard, or ``_``).
        location: the location matched, or None (the default server's 404).
        backend: the backend, or None with no location.
    """

    server: str
    location: Location | None
    backend: Backend | None


def path_matches(location: Location, path: str) -> bool:
    """Whether request ``path`` (without query) falls in ``location``."""
    if location.path_type is PathType.Exact:
        return path == location.path
    if location.path_type is PathType.ImplementationSpecific:
        return path.startswith(location.path)
    base = location.path.rstrip("/")
    return base == "" or path == base or path.startswith(base + "/")


def _servicing_endpoints(info: ServicePortInfo) -> tuple[Endpoint, ...]:
    """The endpoints ingress-nginx balances over: the ready ones of the Service port's slices,
    whatever its traffic policies (the controller reads EndpointSlices itself and never applies
    ``internalTrafficPolicy``); else kube-proxy's serving-terminating fallback."""
    ready = tuple(ep for ep in info.endpoints if ep.ready)
    return ready or info.cluster_endpoints or info.all_reachable_endpoints


class RouteTable:
    """The routing state built from one Snapshot; immutable.

    Args:
        servers: ``{server name: locations}``, locations in match order is not required.
        backends: ``{backend name: Backend}``.
        problems: what could not be routed (a Service or port that does not exist), for logs.
    """

    __slots__ = ("_wildcards", "backends", "problems", "servers")

    def __init__(self, servers: Mapping[str, tuple[Location, ...]], backends: Mapping[str, Backend],
                 problems: tuple[str, ...] = ()) -> None:
        self.servers = dict(servers)
        self.backends = dict(backends)
        self.problems = problems
        self._wildcards = sorted((s for s in self.servers if s.startswith("*.")), key=len, reverse=True)

    @classmethod
    def build(cls, snapshot: Snapshot, *, ingress_class: str = "nginx",
              family: IPFamily | None = None) -> RouteTable:
        """Lay out the servers, locations and backends of ``snapshot``'s Ingresses of ``ingress_class``.

        Args:
            snapshot: the per-node Snapshot (its ``ingresses`` and ports).
            ingress_class: the class served (``--ingress-class``).
            family: the family whose endpoints are used (default: the node's primary family).
        """
        fam = family or (snapshot.node.ip_families[0] if snapshot.node.ip_families else IPFamily.IPv4)
        ours = sorted((i for i in snapshot.ingresses if i.ingress_class in (None, ingress_class)),
                      key=lambda i: (i.creation_timestamp, i.namespace, i.name))
        ports = snapshot.family(fam)
        servers: dict[str, dict[str, Location]] = {}
        backends: dict[str, Backend] = {}
        readings: dict[str, list[tuple[Ingress, AnnotationReading]]] = {}
        problems: list[str] = []

        def backend_of(ing: Ingress, b: IngressBackend) -> str:
            name = upstream_name(ing.namespace, b.service, b.port)
            if name not in backends:
                backends[name] = Backend(name=name, namespace=ing.namespace, service=b.service, port=b.port,
                                         nodes=_nodes_of(ports.values(), ing.namespace, b, problems))
            readings.setdefault(name, [])
            return name

        def add(server: str, path: str, ptype: PathType, name: str) -> None:
            locs = servers.setdefault(server, {})
            locs.setdefault(f"{ptype}:{path}", Location(path=path, path_type=ptype, backend=name))

        for ing in ours:
            reading = read_annotations(ing.annotation_map())
            for rule in ing.rules:
                server = rule.host or DEFAULT_SERVER
                for hp in rule.paths:
                    name = backend_of(ing, hp.backend)
                    add(server, hp.path, hp.path_type, name)
                    readings[name].append((ing, reading))
                    if reading.affinity is not None:
                        _add_location(backends, name, server, hp.path)
                if ing.default_backend is not None and not any(
                        loc.path == "/" for loc in servers.get(server, {}).values()):
                    add(server, "/", PathType.Prefix, backend_of(ing, ing.default_backend))
            if ing.default_backend is not None:
                name = backend_of(ing, ing.default_backend)
                if not any(loc.path == "/" for loc in servers.get(DEFAULT_SERVER, {}).values()):
                    add(DEFAULT_SERVER, "/", PathType.Prefix, name)
                readings[name].append((ing, reading))
        for name, entries in readings.items():
            affinity = next((r.affinity for _, r in entries if r.affinity is not None), None)
            hash_by = next((r.upstream_hash_by for _, r in entries if r.upstream_hash_by), None)
            b = backends[name]
            backends[name] = Backend(name=b.name, namespace=b.namespace, service=b.service, port=b.port,
                                     nodes=b.nodes, affinity=affinity, locations=b.locations, hash_by=hash_by)
        return cls({s: tuple(locs.values()) for s, locs in servers.items()}, backends, tuple(problems))

    def server_for(self, host: str) -> str:
        """The server name for a Host header value (case-insensitive, port removed)."""
        h = host.strip().lower()
        if h.startswith("["):
            h = h.split("]", 1)[0] + "]"
        elif h.count(":") == 1:
            h = h.split(":", 1)[0]
        if h in self.servers:
            return h
        for w in self._wildcards:
            if h.endswith(w[1:]):
                return w
        return DEFAULT_SERVER

    def route(self, host: str, path: str) -> RouteMatch:
        """Where a request for ``host`` and ``path`` (no query) goes."""
        server = self.server_for(host)
        best: Location | None = None
        for loc in self.servers.get(server, ()):
            if not path_matches(loc, path):
                continue
            if loc.path_type is PathType.Exact:
                best = loc
                break
            if best is None or len(loc.path) > len(best.path):
                best = loc
        if best is None:
            return RouteMatch(server=server, location=None, backend=None)
        return RouteMatch(server=server, location=best, backend=self.backends.get(best.backend))


def _add_location(backends: dict[str, Backend], name: str, server: str, path: str) -> None:
    b = backends[name]
    locs = {k: set(v) for k, v in b.locations.items()}
    locs.setdefault(server, set()).add(path)
    backends[name] = Backend(name=b.name, namespace=b.namespace, service=b.service, port=b.port,
                             nodes=b.nodes, locations={k: frozenset(v) for k, v in locs.items()})


def _nodes_of(ports: Iterable[ServicePortInfo], namespace: str, b: IngressBackend,
              problems: list[str]) -> tuple[str, ...]:
    for info in ports:
        if info.name.namespace != namespace or info.name.name != b.service:
            continue
        if (b.port_number is not None and info.port == b.port_number) or \
                (b.port_name is not None and info.name.port == b.port_name):
            return tuple(sorted({node_id(e.ip, e.port) for e in _servicing_endpoints(info)}))
    problems.append(f"Service {namespace}/{b.service} port {b.port} is not in the snapshot")
    return ()
