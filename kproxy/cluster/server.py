"""The harness API server: HTTP/1.1 on asyncio (h11), list and watch, discovery, port-forward.

Theory of operation
-------------------
:class:`ClusterServer` serves a :class:`~kproxy.cluster.store.Store` over plain HTTP on loopback,
so real clients (kubectl, kubernetes-asyncio, kproxy's own) talk to it as to a cluster:

* ``/version`` names the Kubernetes version given (``/usr/bin/kubectl`` picks its binary by it);
  ``/api``, ``/apis`` and each group version answer legacy discovery, or aggregated discovery
  when the client's ``Accept`` asks for ``as=APIGroupDiscoveryList`` (v2, v2beta1).
* Lists honour ``labelSelector`` and ``fieldSelector`` and answer a Table when asked
  (``kubectl get``); ``resourceVersion`` older than the history is 410 ``Expired``.
* ``?watch=true`` streams one JSON event per line (chunked): the changes after
  ``resourceVersion``, then live ones, with objects entering or leaving the selector as ADDED or
  DELETED; BOOKMARKs every ``bookmark_interval_s`` with ``allowWatchBookmarks``; the stream
  ends after ``timeoutSeconds``; a version too old is an ERROR event with the 410 Status.
* ``pods/NAME/portforward`` upgrades to SPDY/3.1 (``Upgrade: SPDY/3.1``,
  ``X-Stream-Protocol-Version: portforward.k8s.io``) or to the WebSocket tunnel
  (``Sec-WebSocket-Protocol: SPDY/3.1+portforward.k8s.io``), and serves the forward through
  :func:`kproxy.portforward.server.serve_portforward` with the Pod's dialer
  (:func:`dialer_for`). A WebSocket asking for ``v4.channel.k8s.io`` (or no subprotocol) with
  ``?ports=`` gets the older channel protocol (:mod:`kproxy.portforward.channel_v4`). Deleting a
  Pod ends its forwards.
* The manifests are polled and a change is applied as the minimal set of changes.

Fault injection for tests: :meth:`ClusterServer.fail_next`, :meth:`ClusterServer.drop_watches`,
:meth:`ClusterServer.compact`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11
import structlog

from kproxy.clock import Clock, MonotonicClock
from kproxy.cluster import api
from kproxy.cluster.manifests import ManifestFiles
from kproxy.cluster.store import RESOURCES, Change, ChangeType, Expired, Resource, Store
from kproxy.errors import InvalidArgument, InvalidObject, ProtocolError
from kproxy.portforward.bridge import Dialer, dial_in_netns, dial_loopback
from kproxy.portforward.channel_v4 import parse_ports as parse_v4_ports
from kproxy.portforward.channel_v4 import serve_v4
from kproxy.portforward.connection import ByteChannel, SpdyConnection, StreamChannel
from kproxy.portforward.protocol import PROTOCOL_V1, TUNNEL_PROTOCOL
from kproxy.portforward.server import PodTarget, serve_portforward
from kproxy.portforward.session import Role
from kproxy.portforward.websocket import WebSocketChannel, accept_token

__all__ = ["NETNS_ANNOTATION", "ClusterServer", "dialer_for"]

NETNS_ANNOTATION = "kproxy.dev/netns"
_JSON = "application/json"
_log = structlog.get_logger("kproxy.cluster")


def dialer_for(pod: Mapping[str, Any]) -> Dialer:
    """How to reach ``pod``'s ports: inside ``/run/netns/NAME`` for the annotation
    ``kproxy.dev/netns: NAME`` (root), else its ``status.podIP`` directly (loopback pods).

    Raises:
        InvalidObject: the Pod has neither.
    """
    meta = pod.get("metadata", {})
    netns = (meta.get("annotations") or {}).get(NETNS_ANNOTATION)
    if netns:
        return dial_in_netns(netns if netns.startswith("/") else f"/run/netns/{netns}")
    ip = pod.get("status", {}).get("podIP")
    if not ip:
        raise InvalidObject(obj=f"Pod {meta.get('namespace')}/{meta.get('name')}", field="status.podIP",
                            problem=f"no podIP and no {NETNS_ANNOTATION} annotation: nothing to dial")
    return dial_loopback(str(ip))


@dataclass(slots=True, eq=False)
class _Watch:
    resource: str
    queue: asyncio.Queue[Change | None] = field(default_factory=asyncio.Queue)


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]

    def q(self, name: str, default: str = "") -> str:
        values = self.query.get(name)
        return values[0] if values else default


class ClusterServer:
    """An API server for harnesses on ``host:port`` (``port`` 0: a free one).

    Args:
        manifests: files or folders to serve and watch (empty: start empty; use :meth:`apply`).
        kube_minor: the Kubernetes minor version ``/version`` reports (1.``kube_minor``).
        bookmark_interval_s: seconds between watch bookmarks (the API server's is about 60).
        reload_interval_s: how often the manifests are polled for changes, seconds.
        tunnel: accept the WebSocket tunnel; False makes a server that speaks SPDY only (as
            before Kubernetes 1.31), so clients must fall back.
    """

    def __init__(self, manifests: Sequence[str | Path] = (), *, kube_minor: int = 33,
                 bookmark_interval_s: float = 60.0, reload_interval_s: float = 0.25,
                 clock: Clock | None = None, tunnel: bool = True) -> None:
        self.store = Store()
        self.tunnel = tunnel
        self.kube_minor = kube_minor
        self.bookmark_interval_s = bookmark_interval_s
        self.reload_interval_s = reload_interval_s
        self.clock = clock or MonotonicClock()
        self._files = ManifestFiles([Path(p) for p in manifests]) if manifests else None
        self._watches: set[_Watch] = set()
        self._forwards: dict[tuple[str, str], set[asyncio.Event]] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._failures: list[int] = []
        self.requests: list[tuple[str, str]] = []
        #: One entry per port-forward upgrade: ``(namespace/pod, "websocket" | "spdy")``.
        self.upgrades: list[tuple[str, str]] = []
        self.host, self.port = "127.0.0.1", 0
        if self._files is not None:
            self._apply_changes(self.store.replace_all(self._files.load()))

    # ------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        """``http://HOST:PORT`` once started."""
        return f"http://{self.host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen and start polling the manifests; returns :attr:`url`.

        Raises:
            OSError: the address cannot be bound.
        """
        self._server = await asyncio.start_server(self._connection, host, port, limit=1 << 20)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]
        if self._files is not None:
            self._spawn(self._reload_loop())
        return self.url

    def _spawn(self, coro: Any) -> None:
        # The server owns its tasks and cancels them all in aclose() (its scope).
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Stop listening, end every watch and forward, and wait for the connections' tasks."""
        if self._server is not None:
            self._server.close()
        for events in self._forwards.values():
            for ev in events:
                ev.set()
        self.drop_watches()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def __aenter__(self) -> ClusterServer:
        if self._server is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig for :attr:`url` (context ``kproxy``) to ``path``; returns it."""
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "kproxy",
               "clusters": [{"name": "kproxy", "cluster": {"server": self.url}}],
               "users": [{"name": "kproxy", "user": {"token": "harness"}}],
               "contexts": [{"name": "kproxy", "context": {"cluster": "kproxy", "user": "kproxy",
                                                           "namespace": namespace}}]}
        out = Path(path)
        out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        return out

    # ------------------------------------------------------------ harness API
    def apply(self, *objects: Mapping[str, Any]) -> list[Change]:
        """Create or update objects (manifest dicts) as a client's writes would.

        Raises:
            InvalidObject: an object of a kind not served, or without a name.
        """
        changes = [c for o in objects if (c := self.store.put(o)) is not None]
        self._apply_changes(changes)
        return changes

    def delete(self, kind: str, namespace: str, name: str) -> Change | None:
        """Delete an object by kind (``Pod``), namespace (``""`` when cluster-scoped) and name."""
        res = next((r for r in RESOURCES.values() if r.kind == kind), None)
        if res is None:
            raise InvalidArgument(f"kind {kind!r} is not served")
        change = self.store.delete(res.name, namespace if res.namespaced else "", name)
        if change is not None:
            self._apply_changes([change])
        return change

    def fail_next(self, count: int, code: int = 500) -> None:
        """Answer the next ``count`` API requests with a ``code`` Status (fault injection)."""
        self._failures += [code] * count

    def drop_watches(self) -> None:
        """End every open watch stream (clients re-watch from their last version)."""
        for watch in list(self._watches):
            watch.queue.put_nowait(None)

    def compact(self) -> None:
        """Forget history: watches from any older version get 410 Expired."""
        self.store.compact()

    def _apply_changes(self, changes: list[Change]) -> None:
        for change in changes:
            for watch in list(self._watches):
                if watch.resource == change.resource:
                    watch.queue.put_nowait(change)
            if change.resource == "pods" and change.type is ChangeType.DELETED:
                meta = change.obj.get("metadata", {})
                for ev in self._forwards.get((meta.get("namespace", ""), meta.get("name", "")), set()):
                    ev.set()

    async def _reload_loop(self) -> None:
        assert self._files is not None
        while True:
            await self.clock.sleep(self.reload_interval_s)
            if self._files.changed():
                try:
                    changes = self.store.replace_all(self._files.load())
                except InvalidObject as err:
                    _log.warning("manifest object skipped", error=str(err))
                    continue
                if changes:
                    _log.info("manifests reloaded", changes=len(changes))
                self._apply_changes(changes)

    # ------------------------------------------------------------ HTTP
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)  # cancelled by aclose(); asyncio's server owns it otherwise
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
        try:
            while True:
                event = await self._next(conn, reader)
                if not isinstance(event, h11.Request):
                    return
                req = _parse_request(event)
                while not isinstance(await self._next(conn, reader), h11.EndOfMessage | h11.PAUSED):
                    pass
                self.requests.append((req.method, req.path))
                keep = await self._route(conn, req, reader, writer)
                if not keep or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (h11.ProtocolError, ConnectionError, OSError):
            return
        except asyncio.CancelledError:
            # aclose() ends connections; finishing normally keeps asyncio's stream callback
            # from logging the cancellation as an unhandled error.
            return
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    @staticmethod
    async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await reader.read(65536))

    @staticmethod
    async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, code: int, body: Any,
                    content_type: str = _JSON) -> None:
        raw = json.dumps(body, separators=(",", ":")).encode()
        headers = [("Content-Type", content_type), ("Content-Length", str(len(raw)))]
        writer.write(conn.send(h11.Response(status_code=code, headers=headers)) or b"")
        writer.write(conn.send(h11.Data(data=raw)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()

    async def _route(self, conn: h11.Connection, req: _Request, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        parts = [p for p in req.path.split("/") if p]
        if self._failures and parts[:1] in (["api"], ["apis"]):
            code = self._failures.pop(0)
            await self._send(conn, writer, code, api.status_document(code, "InternalError", "injected"))
            return True
        if parts == ["version"]:
            await self._send(conn, writer, 200, api.version_document(self.kube_minor))
            return True
        accept = req.headers.get("accept", "")
        if parts in (["api"], ["apis"]) and "as=APIGroupDiscoveryList" in accept:
            version = "v2" if "v=v2;" in accept.replace(" ", "") + ";" else "v2beta1"
            ctype = api.AGGREGATED_V2 if version == "v2" else api.AGGREGATED_V2BETA1
            await self._send(conn, writer, 200, api.aggregated_discovery(parts == ["api"], version), ctype)
            return True
        if parts == ["api"]:
            await self._send(conn, writer, 200, api.api_versions())
            return True
        if parts == ["apis"]:
            await self._send(conn, writer, 200, api.api_group_list())
            return True
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            await self._send(conn, writer, 404, api.status_document(404, "NotFound", "the server could not "
                                                                    "find the requested resource"))
            return True
        if not rest:
            doc = api.api_resource_list(group, version)
            await self._send(conn, writer, 200 if doc else 404,
                             doc or api.status_document(404, "NotFound", f"{group}/{version} not served"))
            return True
        return await self._resource(conn, req, group, version, rest, reader, writer)

    async def _resource(self, conn: h11.Connection, req: _Request, group: str, version: str,
                        rest: list[str], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        res = RESOURCES.get(rest[0])
        wrong_scope = ns is not None and res is not None and not res.namespaced
        if res is None or res.group != group or res.version != version or wrong_scope:
            await self._send(conn, writer, 404, api.status_document(
                404, "NotFound", f"the server could not find the requested resource ({rest[0]})"))
            return True
        if len(rest) == 3 and res.name == "pods" and rest[2] == "portforward" and ns is not None:
            return await self._portforward(conn, req, ns, rest[1], reader, writer)
        if len(rest) == 2:
            obj = self.store.get(res.name, ns or "", rest[1])
            if obj is None:
                await self._send(conn, writer, 404, api.status_document(
                    404, "NotFound", f'{res.name} "{rest[1]}" not found',
                    details={"name": rest[1], "kind": res.name}))
            else:
                obj["kind"] = res.kind
                await self._send(conn, writer, 200, obj)
            return True
        if len(rest) != 1:
            await self._send(conn, writer, 404, api.status_document(404, "NotFound", "no such subresource"))
            return True
        try:
            labels = api.label_matcher(req.q("labelSelector"))
            fields = api.field_matcher(req.q("fieldSelector"))
        except InvalidArgument as err:
            await self._send(conn, writer, 400, api.status_document(400, "BadRequest", str(err)))
            return True
        if req.q("watch").lower() in ("true", "1"):
            await self._watch(conn, req, res, ns, labels, fields, reader, writer)
            return False
        rv, items = self.store.items(res.name, ns)
        items = [o for o in items if labels(o) and fields(o)]
        if "as=Table" in req.headers.get("accept", ""):
            await self._send(conn, writer, 200, api.table_document(res, rv, items),
                             "application/json;as=Table;v=v1;g=meta.k8s.io")
        else:
            await self._send(conn, writer, 200, api.list_document(res, rv, items))
        return True

    async def _watch(self, conn: h11.Connection, req: _Request, res: Resource, ns: str | None,
                     labels: Any, fields: Any, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        def matches(obj: Mapping[str, Any] | None) -> bool:
            if obj is None:
                return False
            in_ns = ns is None or obj.get("metadata", {}).get("namespace") == ns
            return bool(in_ns and labels(obj) and fields(obj))

        headers = [("Content-Type", _JSON), ("Transfer-Encoding", "chunked")]
        writer.write(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        watch = _Watch(resource=res.name)
        self._watches.add(watch)
        raw_rv = req.q("resourceVersion")
        start = int(raw_rv) if raw_rv.isdigit() and raw_rv != "0" else None
        try:
            try:
                replay = self.store.since(res.name, start) if start is not None else []
            except Expired as err:
                status = api.status_document(410, "Expired", str(err))
                replay = []
                writer.write(conn.send(h11.Data(data=_line("ERROR", status))) or b"")
                return
            if start is None:  # a watch without a version starts with every object, as ADDED
                rv, items = self.store.items(res.name, ns)
                for obj in items:
                    if matches(obj):
                        writer.write(conn.send(h11.Data(data=_line("ADDED", _with_kind(obj, res)))) or b"")
                start = rv
            for old in replay:
                watch.queue.put_nowait(old)
            timeout_s = float(req.q("timeoutSeconds") or 1800)
            bookmarks = req.q("allowWatchBookmarks").lower() == "true"
            last_rv = start
            eof = asyncio.ensure_future(reader.read(1))
            deadline = self.clock.now() + timeout_s
            try:
                while (left := deadline - self.clock.now()) > 0:
                    wait = min(left, self.bookmark_interval_s) if bookmarks else left
                    getter = asyncio.ensure_future(watch.queue.get())
                    done, _ = await asyncio.wait({getter, eof}, timeout=wait,
                                                 return_when=asyncio.FIRST_COMPLETED)
                    if eof in done:
                        getter.cancel()
                        return
                    if getter not in done:
                        getter.cancel()
                        if bookmarks:
                            mark = {"kind": res.kind, "apiVersion": res.api_version,
                                    "metadata": {"resourceVersion": str(max(last_rv, self.store.rv))}}
                            writer.write(conn.send(h11.Data(data=_line("BOOKMARK", mark))) or b"")
                            await writer.drain()
                        continue
                    change = getter.result()
                    if change is None:
                        writer.transport.abort()  # dropped mid-stream, as a broken connection
                        return
                    if change.rv <= last_rv:
                        continue
                    last_rv = change.rv
                    kind = _event_type(change, matches)
                    if kind is not None:
                        line = _line(kind, _with_kind(change.obj, res))
                        writer.write(conn.send(h11.Data(data=line)) or b"")
                        await writer.drain()
            finally:
                eof.cancel()
        finally:
            self._watches.discard(watch)
            if not writer.is_closing():
                with contextlib.suppress(h11.LocalProtocolError):
                    writer.write(conn.send(h11.EndOfMessage()) or b"")
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.drain()

    async def _portforward_v4(self, conn: h11.Connection, req: _Request, pod: dict[str, Any], ns: str,
                              name: str, protocols: list[str], reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> bool:
        return await _v4_upgrade(self, conn, req, pod, ns, name, protocols, reader, writer)

    async def _portforward(self, conn: h11.Connection, req: _Request, ns: str, name: str,
                           reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        pod = self.store.get("pods", ns, name)
        if pod is None:
            await self._send(conn, writer, 404,
                             api.status_document(404, "NotFound", f'pods "{name}" not found'))
            return True
        upgrade = req.headers.get("upgrade", "").lower()
        protocols = [p.strip() for p in req.headers.get("sec-websocket-protocol", "").split(",")]
        stream_protos = [p.strip() for p in req.headers.get("x-stream-protocol-version", "").split(",")]
        channel: ByteChannel
        if upgrade == "websocket" and not (TUNNEL_PROTOCOL in protocols and self.tunnel) and (
                "v4.channel.k8s.io" in protocols or protocols == [""]):
            return await self._portforward_v4(conn, req, pod, ns, name, protocols, reader, writer)
        if upgrade == "websocket" and TUNNEL_PROTOCOL in protocols and self.tunnel:
            headers = [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                       ("Sec-WebSocket-Accept", accept_token(req.headers.get("sec-websocket-key", ""))),
                       ("Sec-WebSocket-Protocol", TUNNEL_PROTOCOL)]
            writer.write(conn.send(h11.InformationalResponse(status_code=101, headers=headers)) or b"")
            channel = WebSocketChannel(reader, writer, client=False, initial=conn.trailing_data[0])
        elif upgrade.startswith("spdy/3.1") and PROTOCOL_V1 in stream_protos:
            headers = [("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
                       ("X-Stream-Protocol-Version", PROTOCOL_V1)]
            writer.write(conn.send(h11.InformationalResponse(status_code=101, headers=headers)) or b"")
            channel = StreamChannel(reader, writer, initial=conn.trailing_data[0])
        else:
            # client-go's fallback dialer falls back to SPDY on this upgrade failure.
            await self._send(conn, writer, 400, api.status_document(
                400, "BadRequest", f"unable to upgrade: no supported protocol in {upgrade!r} "
                f"{protocols or stream_protos}"))
            return False
        await writer.drain()
        try:
            dial = dialer_for(pod)
        except InvalidObject as err:
            _log.warning("port-forward to a pod without address", error=str(err))
            await channel.aclose()
            return False
        stop = asyncio.Event()
        self._forwards.setdefault((ns, name), set()).add(stop)
        target = PodTarget(name=name, uid=pod["metadata"]["uid"], dial=dial)
        spdy = SpdyConnection(channel, Role.SERVER, clock=self.clock)
        transport = "websocket" if upgrade == "websocket" else "spdy"
        self.upgrades.append((f"{ns}/{name}", transport))
        _log.debug("port-forward upgraded", pod=f"{ns}/{name}", transport=transport)
        try:
            await serve_portforward(spdy, target, stop=stop)
        finally:
            self._forwards.get((ns, name), set()).discard(stop)
        return False


async def _v4_upgrade(server: ClusterServer, conn: h11.Connection, req: _Request, pod: dict[str, Any],
                      ns: str, name: str, protocols: list[str], reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
    try:
        ports = parse_v4_ports(req.query.get("ports", []))
        dial = dialer_for(pod)
    except (ProtocolError, InvalidObject) as err:
        await server._send(conn, writer, 400, api.status_document(400, "BadRequest", str(err)))
        return False
    headers = [("Upgrade", "websocket"), ("Connection", "Upgrade"),
               ("Sec-WebSocket-Accept", accept_token(req.headers.get("sec-websocket-key", "")))]
    if "v4.channel.k8s.io" in protocols:
        headers.append(("Sec-WebSocket-Protocol", "v4.channel.k8s.io"))
    writer.write(conn.send(h11.InformationalResponse(status_code=101, headers=headers)) or b"")
    await writer.drain()
    stop = asyncio.Event()
    server._forwards.setdefault((ns, name), set()).add(stop)
    server.upgrades.append((f"{ns}/{name}", "v4.channel.k8s.io"))
    try:
        await serve_v4(reader, writer, conn.trailing_data[0], ports, dial, pod=name,
                       uid=pod["metadata"]["uid"], stop=stop)
    finally:
        server._forwards.get((ns, name), set()).discard(stop)
    return False


def _event_type(change: Change, matches: Any) -> str | None:
    new_in = change.type is not ChangeType.DELETED and matches(change.obj)
    old_in = matches(change.old)
    if new_in:
        return "MODIFIED" if old_in else "ADDED"
    return "DELETED" if old_in else None


def _with_kind(obj: Mapping[str, Any], res: Resource) -> dict[str, Any]:
    return {**obj, "kind": res.kind, "apiVersion": res.api_version}


def _line(kind: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _parse_request(event: h11.Request) -> _Request:
    target = event.target.decode("latin-1")
    split = urlsplit(target)
    headers: dict[str, str] = {}
    for name, value in event.headers:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return _Request(method=event.method.decode(), path=split.path, query=parse_qs(split.query),
                    headers=headers)
