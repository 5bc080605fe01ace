"""A fake Kubernetes API server on loopback that speaks the real list and watch protocol.

Theory of operation
-------------------
It serves Services (``/api/v1/services``), EndpointSlices
(``/apis/discovery.k8s.io/v1/endpointslices``) and Nodes (``/api/v1/nodes``, list and watch with
``fieldSelector=metadata.name=NAME``, and ``/api/v1/nodes/NAME``) over
HTTP on 127.0.0.1, so kubernetes-asyncio talks to it over TCP as to a cluster:

* Every change takes the next value of one resource-version counter (etcd's revision).
* A list answers ``{"kind": "ServiceList", "metadata": {"resourceVersion": "N"}, "items": [...]}``
  (items without ``kind``/``apiVersion``, as the real server writes them), filtered by
  ``labelSelector`` and ``fieldSelector`` (lists and watches alike). A list without
  ``resourceVersion`` is a quorum read (etcd; counted in :attr:`FakeApiServer.quorum_lists`);
  ``resourceVersion=0`` or ``resourceVersionMatch=NotOlderThan`` is served from the watch cache,
  which answers 410 for a version older than its window (see :meth:`expire` ``lists=True``).
  :attr:`FakeApiServer.served` records every object written to a client.
* A watch (``?watch=true``) answers a chunked stream of one JSON event per line. From
  ``resourceVersion`` R it first replays the changes after R, then streams live ones; changes that
  move an object into or out of the selector become ADDED or DELETED, as the watch cache does.
  With ``allowWatchBookmarks`` it sends a BOOKMARK every ``bookmark_interval_s``. It ends cleanly
  after ``timeoutSeconds``.
* R older than the compaction point (see :meth:`FakeApiServer.expire`) is answered with an ERROR
  event carrying a 410 ``Expired`` Status (or an HTTP 410, with ``expired_as_http``).

Controls for tests: :meth:`drop_watches` (cut open streams mid-chunk), :meth:`stall` (open and
new watches fall silent without closing, until :meth:`unstall`), :meth:`blackhole` (open
connections fall silent for good, new requests are reset, until :meth:`restore`), :meth:`fail`
(answer every request with a 5xx Status), :meth:`expire` (compact history; open watches get the
410 ERROR), :meth:`inject` (write a raw line into open watches). :attr:`requests` records every
request.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakeapi.selector import FieldMatcher, Matcher, parse_field_selector, parse_selector

__all__ = ["FakeApiServer", "RequestRecord"]

_RESOURCES = {
    "services": ("Service", "v1"),
    "endpointslices": ("EndpointSlice", "discovery.k8s.io/v1"),
    "nodes": ("Node", "v1"),
}
_KIND_TO_RESOURCE = {kind: res for res, (kind, _) in _RESOURCES.items()}


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request: its resource (``services``, ``endpointslices``, ``nodes``), watch or not, query."""

    resource: str
    watch: bool
    query: Mapping[str, str]


@dataclass(slots=True)
class _Change:
    rv: int
    old: dict[str, Any] | None
    new: dict[str, Any] | None


@dataclass(slots=True, eq=False)
class _Watch:
    resource: str
    matches: Matcher
    fields: FieldMatcher
    queue: asyncio.Queue[bytes | str] = field(default_factory=asyncio.Queue)
    dead: bool = False  # black-holed: never writes nor ends again


def _selected(obj: Mapping[str, Any] | None, matches: Matcher, fields: FieldMatcher) -> bool:
    """``obj`` exists and matches both the label and the field selector."""
    return obj is not None and matches(_labels(obj)) and fields(obj)


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, str]:
    if obj is None:
        return {}
    labels = obj.get("metadata", {}).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _line(event_type: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


class FakeApiServer:
    """The fake API server; use ``async with FakeApiServer() as api`` and connect to ``api.url``.

    Args:
        bookmark_interval_s: seconds between BOOKMARK events on watches that allow them (0: never).
        default_watch_timeout_s: how long a watch without ``timeoutSeconds`` lasts.
        expired_as_http: answer a watch from an expired version with HTTP 410 instead of an
            ERROR event in a 200 stream (the real server does either, depending on the path).
    """

    def __init__(
        self,
        *,
        bookmark_interval_s: float = 0.0,
        default_watch_timeout_s: float = 1800.0,
        expired_as_http: bool = False,
    ) -> None:
        self.bookmark_interval_s = bookmark_interval_s
        self.default_watch_timeout_s = default_watch_timeout_s
        self.expired_as_http = expired_as_http
        self.rv = 1
        self.compacted_rv = 0
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {r: {} for r in _RESOURCES}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.history: dict[str, list[_Change]] = {r: [] for r in _RESOURCES}
        self.requests: list[RequestRecord] = []
        self.served: list[tuple[str, str]] = []
        """``(resource, "namespace/name")`` of every object written in a list or a watch event."""
        self.quorum_lists = 0
        """Lists served without a resource version (consistent reads from etcd)."""
        self.cache_floor_rv = 0
        """The oldest version the watch cache can serve a list at (older: 410)."""
        self._blackholed = False
        self._closed = asyncio.Event()
        self._watches: set[_Watch] = set()
        self._failing: tuple[int, int | None] | None = None
        self._stalled = False
        self._unstalled = asyncio.Event()
        self._unstalled.set()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, port: int = 0) -> None:
        """Listen on 127.0.0.1 (``port`` 0 picks a free one); :attr:`url` says where."""
        app = web.Application(middlewares=[self._failures])
        app.router.add_get("/api/v1/services", self._handle_services)
        app.router.add_get("/apis/discovery.k8s.io/v1/endpointslices", self._handle_slices)
        app.router.add_get("/api/v1/nodes", self._handle_nodes)
        app.router.add_get("/api/v1/nodes/{name}", self._handle_node)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        """End every watch and stop listening."""
        self._unstalled.set()
        self._closed.set()
        for watch in list(self._watches):
            watch.queue.put_nowait("close")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- state -------------------------------------------------------------------------------

    def apply(self, obj: Mapping[str, Any]) -> int:
        """Create or replace an object (ADDED or MODIFIED); returns its new resource version."""
        resource = _KIND_TO_RESOURCE[obj["kind"]]
        new = copy.deepcopy(dict(obj))
        meta = new.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        key = (meta["namespace"], meta["name"])
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        meta.setdefault("uid", f"uid-{resource}-{key[0]}-{key[1]}")
        old = self.objects[resource].get(key)
        self.objects[resource][key] = new
        self._record(resource, _Change(self.rv, old, new))
        return self.rv

    def delete(self, kind: str, name: str, namespace: str = "default") -> int:
        """Delete an object (DELETED); returns the deletion's resource version.

        Raises:
            KeyError: no such object.
        """
        resource = _KIND_TO_RESOURCE[kind]
        old = self.objects[resource].pop((namespace, name))
        self.rv += 1
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self._record(resource, _Change(self.rv, old, None))
        return self.rv

    def _record(self, resource: str, change: _Change) -> None:
        self.history[resource].append(change)
        for watch in self._watches:
            if watch.resource == resource and (line := self._event_line(watch, change)) is not None:
                watch.queue.put_nowait(line)

    def _event_line(self, watch: _Watch, change: _Change) -> bytes | None:
        before = _selected(change.old, watch.matches, watch.fields)
        after = _selected(change.new, watch.matches, watch.fields)
        if change.new is None:
            if not before:
                return None
            assert change.old is not None
            gone = copy.deepcopy(change.old)
            gone["metadata"]["resourceVersion"] = str(change.rv)
            return _line("DELETED", gone)
        if before and after:
            return _line("MODIFIED", change.new)
        if after:
            return _line("ADDED", change.new)
        if before:
            return _line("DELETED", change.new)
        return None

    # -- controls ----------------------------------------------------------------------------

    def watch_count(self, resource: str | None = None) -> int:
        """How many live watches are open (of ``resource``, or in all); black-holed ones do not count."""
        return sum(1 for w in self._watches if not w.dead and (resource is None or w.resource == resource))

    async def wait_watching(self, count: int = 2, timeout_s: float = 5.0) -> None:
        """Wait until at least ``count`` watches are open.

        Raises:
            TimeoutError: they were not within ``timeout_s`` seconds.
        """
        async with asyncio.timeout(timeout_s):
            while self.watch_count() < count:
                await asyncio.sleep(0.005)

    def drop_watches(self) -> int:
        """Cut every open watch mid-stream (the TCP connection is aborted); returns how many."""
        watches = list(self._watches)
        for watch in watches:
            watch.queue.put_nowait("drop")
        return len(watches)

    def stall(self) -> None:
        """Open and new watches fall silent: no event, no bookmark, no end, connection kept open."""
        self._stalled = True
        self._unstalled.clear()

    def unstall(self) -> None:
        """End the stall: silent connections are then aborted, new watches work again."""
        self._stalled = False
        self._unstalled.set()

    def blackhole(self) -> None:
        """An API server gone silent: open connections get nothing ever again, new requests are reset.

        The connections open now stay open and silent even after :meth:`restore` (a half-open
        connection whose peer vanished); only new requests work again.
        """
        self._blackholed = True
        for watch in self._watches:
            watch.dead = True

    def restore(self) -> None:
        """End :meth:`blackhole`: new requests are served again."""
        self._blackholed = False

    def fail(self, status: int = 500, count: int | None = None) -> None:
        """Answer the next ``count`` requests (every request when None) with a ``status`` Status."""
        self._failing = (status, count)

    def recover(self) -> None:
        """Stop failing requests."""
        self._failing = None

    def expire(self, *, notify: bool = True, lists: bool = False) -> None:
        """Compact history: a watch from any version before now gets 410 Expired.

        Args:
            notify: also send the 410 ERROR event to open watches and end them.
            lists: the watch cache was re-initialised too: a list at a version before now
                (``NotOlderThan``) gets 410 as well, and only a quorum list works.
        """
        self.compacted_rv = self.rv
        if lists:
            self.cache_floor_rv = self.rv
        for history in self.history.values():
            history.clear()
        if notify:
            for watch in list(self._watches):
                watch.queue.put_nowait(self._expired_line())
                watch.queue.put_nowait("close")

    def inject(self, resource: str, line: bytes) -> None:
        """Write ``line`` (a newline is added) into every open watch of ``resource`` as is."""
        for watch in self._watches:
            if watch.resource == resource:
                watch.queue.put_nowait(line.rstrip(b"\n") + b"\n")

    def _record_served(self, resource: str, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:  # an injected malformed line
            return
        obj = event.get("object") if isinstance(event, dict) else None
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if isinstance(meta, dict) and meta.get("name"):
            self.served.append((resource, f"{meta.get('namespace', 'default')}/{meta['name']}"))

    def _expired_line(self) -> bytes:
        return _line("ERROR", _status(410, "Expired", "too old resource version"))

    # -- HTTP --------------------------------------------------------------------------------

    @web.middleware
    async def _failures(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self._blackholed:
            self.requests.append(RequestRecord("failed", "watch" in request.query, dict(request.query)))
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=503)
        if self._failing is not None:
            status, count = self._failing
            if count is not None:
                self._failing = (status, count - 1) if count > 1 else None
            self.requests.append(RequestRecord("failed", "watch" in request.query, dict(request.query)))
            return web.json_response(_status(status, "InternalError", "injected failure"), status=status)
        result: web.StreamResponse = await handler(request)
        return result

    async def _handle_services(self, request: web.Request) -> web.StreamResponse:
        return await self._handle("services", request)

    async def _handle_slices(self, request: web.Request) -> web.StreamResponse:
        return await self._handle("endpointslices", request)

    async def _handle_nodes(self, request: web.Request) -> web.StreamResponse:
        return await self._handle("nodes", request)

    async def _handle_node(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        self.requests.append(RequestRecord("nodes", False, dict(request.query)))
        found = self.nodes.get(name) or self.objects["nodes"].get(("default", name))
        if found is None:
            return web.json_response(_status(404, "NotFound", f'nodes "{name}" not found'), status=404)
        return web.json_response(found)

    async def _handle(self, resource: str, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        watching = query.get("watch", "").lower() in ("true", "1")
        self.requests.append(RequestRecord(resource, watching, query))
        matches = parse_selector(query.get("labelSelector"))
        fields = parse_field_selector(query.get("fieldSelector"))
        if watching:
            return await self._watch(resource, request, query, matches, fields)
        kind, api_version = _RESOURCES[resource]
        version = query.get("resourceVersion", "")
        if not version:
            self.quorum_lists += 1
        elif version != "0" and (not version.isdigit() or int(version) < self.cache_floor_rv):
            return web.json_response(_status(410, "Expired", f"too old resource version: {version}"),
                                     status=410)
        items = []
        for key in sorted(self.objects[resource]):
            obj = self.objects[resource][key]
            if _selected(obj, matches, fields):
                items.append({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})
                self.served.append((resource, f"{key[0]}/{key[1]}"))
        body = {
            "kind": f"{kind}List",
            "apiVersion": api_version,
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")

    async def _watch(
        self, resource: str, request: web.Request, query: Mapping[str, str], matches: Matcher,
        fields: FieldMatcher,
    ) -> web.StreamResponse:
        if self._stalled:  # not even the headers: a half-open connection
            await self._unstalled.wait()
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=503)
        start = query.get("resourceVersion", "")
        from_rv = int(start) if start.isdigit() else 0
        expired = 0 < from_rv < self.compacted_rv
        if expired and self.expired_as_http:
            return web.json_response(_status(410, "Expired", "too old resource version"), status=410)
        watch = _Watch(resource, matches, fields)
        if expired:
            watch.queue.put_nowait(self._expired_line())
            watch.queue.put_nowait("close")
        elif from_rv == 0:
            kind, api_version = _RESOURCES[resource]
            for obj in self.objects[resource].values():
                if _selected(obj, matches, fields):
                    watch.queue.put_nowait(_line("ADDED", obj))
        else:
            for change in self.history[resource]:
                if change.rv > from_rv and (line := self._event_line(watch, change)) is not None:
                    watch.queue.put_nowait(line)
        timeout_s = float(query.get("timeoutSeconds") or self.default_watch_timeout_s)
        bookmarks = (
            query.get("allowWatchBookmarks", "").lower() in ("true", "1") and self.bookmark_interval_s > 0
        )
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        self._watches.add(watch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while (left := deadline - loop.time()) > 0 or self._stalled or watch.dead:
                if watch.dead:  # a half-open connection: silent until the server stops
                    await self._closed.wait()
                    return resp
                if self._stalled:
                    await self._unstalled.wait()
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                wait = min(left, self.bookmark_interval_s) if bookmarks else left
                try:
                    item = await asyncio.wait_for(watch.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and not self._stalled and not watch.dead and loop.time() < deadline:
                        kind, api_version = _RESOURCES[resource]
                        await resp.write(
                            _line(
                                "BOOKMARK",
                                {
                                    "kind": kind,
                                    "apiVersion": api_version,
                                    "metadata": {"resourceVersion": str(self.rv)},
                                },
                            )
                        )
                    continue
                if self._stalled or watch.dead:
                    continue
                if item == "drop":
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if item == "close":
                    break
                assert isinstance(item, bytes)
                self._record_served(resource, item)
                await resp.write(item)
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass  # the client went away
        finally:
            self._watches.discard(watch)
        return resp
