"""One reflector: list, then watch, one resource through kubernetes-asyncio, forever.

Theory of operation
-------------------
The reflector follows client-go's ``ListAndWatch`` (``tools/cache/reflector.go``) through the
state machine of :mod:`kproxy.sources._kube_protocol`:

* LISTING: list every object matching the selector, emit the difference from what it held
  (:func:`~kproxy.sources.base.diff_objects`: objects that vanished while the watch was down
  are deleted), remember the list's resource version. Which version a list asks for follows
  client-go's ``relistResourceVersion``: the first list asks for ``resourceVersion=0`` (any
  version, served from the API server's watch cache); a relist after a 410 asks for the last
  version seen with ``resourceVersionMatch=NotOlderThan`` (also served from the watch cache);
  only when that list is itself answered 410 (too old) does the next one ask for no version, a
  quorum read from etcd. A relist storm (kubernetes#86483) therefore stays off etcd.
* WATCHING: watch from that version with ``allowWatchBookmarks`` and a server-side
  ``timeoutSeconds`` drawn from ``[watch_timeout_s, 2 * watch_timeout_s)`` as client-go does.
  Every event moves the resource version on; BOOKMARK only moves it. When the server ends the
  watch (its timeout, or a dropped connection) the reflector watches again from the last
  version. ``ERROR`` with a 410 Status, or an HTTP 410, means the version expired: list again.
* Failures (connection refused or reset, TLS errors, 5xx and other non-2xx answers, timeouts
  of a list) wait a capped, jittered exponential backoff and retry what failed. Nothing is
  emitted on a failure: the last known state stays in force.
* Stalls: kubernetes-asyncio sets no read timeout on watches (since 32.0.0), so a half-open
  connection would hang forever. Two guards replace client-go's HTTP/2 health check (a ping
  after 30 s of silence, the connection closed when no answer comes within 15 s):

  - TCP keepalive on every connection the reflector reads (``keepalive_idle_s`` of silence,
    then ``keepalive_count`` probes ``keepalive_interval_s`` apart: 30 s + 3 x 5 s by
    default), so the kernel fails a read on a connection whose peer is gone;
  - a watchdog task restarts the watch (from its last version) when nothing arrived for
    ``2 * bookmark_interval_s`` (the API server sends a BOOKMARK about every minute to a watch
    that asked for them), or for ``timeoutSeconds + stall_grace_s`` if that is shorter. A
    healthy quiet watch gets its bookmarks, so it is never cut.
* A malformed event or object is logged with its name and skipped; the stream continues.

The HTTP requests are kubernetes-asyncio's generated API calls with ``_preload_content=False``,
so its client does the connection, TLS and authentication; lines are decoded here rather than
through ``kubernetes_asyncio.watch.Watch``, which turns a malformed line into an exception that
ends the stream, retries a 410 with the same expired version, and deserialises every object
into generated models (slow for thousands of objects).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import structlog

from kproxy.clock import Clock
from kproxy.errors import InvalidObject
from kproxy.model import KubeObject, parse_objects
from kproxy.sources._kube_protocol import (
    Backoff,
    LineBuffer,
    SessionEvent,
    SessionState,
    WatchLine,
    decode_watch_line,
    object_name,
    parse_status,
    transition,
)
from kproxy.sources.base import Emit, Event, EventType, ObjectKey, diff_objects, object_key

__all__ = ["ListCall", "Reflector", "ReflectorOptions", "ReflectorStatus"]

_log = structlog.get_logger("kproxy.sources.kube")

#: ``call(**params)``: a kubernetes-asyncio ``list_*_for_all_namespaces`` bound method.
ListCall = Callable[..., Awaitable[Any]]

#: What a failed request may raise: aiohttp's errors (refused, reset, TLS, payload), OS errors,
#: a list timeout, and an answer that is not the JSON it should be.
_TRANSIENT = (aiohttp.ClientError, OSError, ssl.SSLError, TimeoutError, ValueError)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReflectorOptions:
    """Timing of one reflector (seconds).

    Attributes:
        watch_timeout_s: the minimum server-side watch timeout; each watch asks for a random
            ``timeoutSeconds`` in ``[watch_timeout_s, 2 * watch_timeout_s)`` (client-go: 5 min).
        stall_grace_s: how much longer than its timeout a silent watch may last.
        list_timeout_s: the total time a list (and a watch's connection) may take.
        backoff: the retry delays after a failure.
        bookmark_interval_s: how often the API server sends a watch a BOOKMARK (about every
            minute); a watch silent for twice that is restarted.
        keepalive_idle_s, keepalive_interval_s, keepalive_count: TCP keepalive of the
            connections read (``TCP_KEEPIDLE``, ``TCP_KEEPINTVL``, ``TCP_KEEPCNT``).
    """

    watch_timeout_s: float = 300.0
    stall_grace_s: float = 30.0
    list_timeout_s: float = 60.0
    backoff: Backoff = field(default_factory=Backoff)
    bookmark_interval_s: float = 60.0
    keepalive_idle_s: float = 30.0
    keepalive_interval_s: float = 5.0
    keepalive_count: int = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class ReflectorStatus:
    """What a reflector has done so far (a copy; counters are cumulative).

    Attributes:
        kind: ``Service`` or ``EndpointSlice``.
        state: the session state.
        resource_version: the last resource version seen, or ``""``.
        objects: how many objects it holds.
        lists, watches: requests started.
        failures: failed requests; ``expired``: 410s; ``stalls``: watches cut for silence;
        malformed: events or objects skipped; ``quorum_lists``: lists that asked for no
        resource version (read from etcd rather than the watch cache).
        last_activity: clock time (seconds) of the last byte received or request started.
    """

    kind: str
    state: str
    resource_version: str
    objects: int
    lists: int
    watches: int
    failures: int
    expired: int
    stalls: int
    malformed: int
    quorum_lists: int
    last_activity: float


class _RequestFailed(Exception):
    """A request failed in a way worth retrying after a backoff."""


class _Expired(Exception):
    """The resource version expired (410)."""


class _Stalled(Exception):
    """The watch said nothing for too long."""


class Reflector:
    """List and watch one kind of object and emit its changes.

    Args:
        kind: ``Service`` or ``EndpointSlice``.
        api_version: ``v1`` or ``discovery.k8s.io/v1`` (list items omit it).
        call: the kubernetes-asyncio list method for all namespaces.
        selector: the label selector.
        emit: where events go.
        on_listed: called after each successful list has been emitted.
        options: timing.
        clock: time source; ``rng``: jitter source.
    """

    def __init__(self, *, kind: str, api_version: str, call: ListCall, selector: str, emit: Emit,
                 on_listed: Callable[[str], None], options: ReflectorOptions, clock: Clock,
                 rng: random.Random, field_selector: str = "") -> None:
        self.kind = kind
        self._fields = {"field_selector": field_selector} if field_selector else {}
        self._api_version = api_version
        self._call = call
        self._selector = selector
        self._emit = emit
        self._on_listed = on_listed
        self._opts = options
        self._clock = clock
        self._rng = rng
        self._store: dict[ObjectKey, KubeObject] = {}
        self._rv = ""
        self._rv_unavailable = False  # the last list at self._rv was 410: the next one is a quorum read
        self._retry_delay_s = 0.0
        self._state = SessionState.LISTING
        self._attempt = 0
        self._last_activity = clock.now()
        self._counts = {"lists": 0, "watches": 0, "failures": 0, "expired": 0, "stalls": 0,
                        "malformed": 0, "quorum_lists": 0}

    def status(self) -> ReflectorStatus:
        """A copy of the counters and state."""
        return ReflectorStatus(kind=self.kind, state=str(self._state), resource_version=self._rv,
                               objects=len(self._store), last_activity=self._last_activity,
                               **self._counts)

    async def run(self) -> None:
        """Run the state machine until cancelled (it never returns otherwise)."""
        while True:
            event = await self._step()
            self._state = transition(self._state, event, role=f"{self.kind} reflector")

    async def _step(self) -> SessionEvent:
        if self._state in (SessionState.LIST_BACKOFF, SessionState.WATCH_BACKOFF):
            _log.debug("backoff over; retrying", kind=self.kind, attempt=self._attempt)
            await self._clock.sleep(self._retry_delay_s)
            return SessionEvent.WAITED
        what = "list" if self._state is SessionState.LISTING else "watch"
        try:
            if self._state is SessionState.LISTING:
                await self._list()
                return SessionEvent.LISTED
            return await self._watch()
        except _Expired:
            self._counts["expired"] += 1
            if self._state is SessionState.LISTING:  # too old even for the watch cache: read etcd next
                self._rv_unavailable = True
                self._backoff()
                _log.info(f"{self.kind} relist from the watch cache answered 410 (too old); listing "
                          f"from etcd in {self._retry_delay_s:.1f} s", kind=self.kind,
                          resource_version=self._rv)
            else:
                _log.info(f"{self.kind} watch expired (410); listing again from the watch cache at "
                          "the last version seen", kind=self.kind, resource_version=self._rv)
            return SessionEvent.GONE
        except (_RequestFailed, *_TRANSIENT) as err:
            self._counts["failures"] += 1
            self._backoff()
            _log.warning(f"{self.kind} {what} failed; retrying in {self._retry_delay_s:.1f} s, "
                         "last known state kept", kind=self.kind, error=_describe(err),
                         retry_in_s=round(self._retry_delay_s, 3), attempt=self._attempt)
            _log.debug("request failure detail", kind=self.kind, exc_info=err)
            return SessionEvent.FAILED

    def _backoff(self) -> None:
        """Draw the next retry delay (client-go's jittered exponential backoff)."""
        self._retry_delay_s = self._opts.backoff.delay(self._attempt, self._rng)
        self._attempt += 1

    # -- list --------------------------------------------------------------------------------

    def _list_version(self) -> dict[str, str]:
        """The resource version a list asks for, as client-go's ``relistResourceVersion``."""
        if self._rv_unavailable:
            return {}  # a quorum read from etcd
        if not self._rv:
            return {"resource_version": "0"}  # any version: the watch cache
        return {"resource_version": self._rv, "resource_version_match": "NotOlderThan"}

    async def _list(self) -> None:
        self._counts["lists"] += 1
        version = self._list_version()
        if not version:
            self._counts["quorum_lists"] += 1
        self._last_activity = self._clock.now()
        async with asyncio.timeout(self._opts.list_timeout_s):
            resp = await self._call(label_selector=self._selector, _preload_content=False,
                                    _request_timeout=self._opts.list_timeout_s, **version, **self._fields)
            try:
                _keepalive(resp, self._opts)
                body = await resp.read()
                status = int(resp.status)
            finally:
                resp.release()
        if status != 200:
            problem = parse_status(body, status)
            if problem.expired and version:
                raise _Expired()
            raise _RequestFailed(f"list answered {problem}")
        data = json.loads(body)
        if not isinstance(data, Mapping) or not isinstance(data.get("items"), list):
            raise _RequestFailed(f"list answer has no items: {body[:120]!r}")
        meta = data.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if not isinstance(rv, str) or not rv:
            raise _RequestFailed(f"list answer has no metadata.resourceVersion, got {rv!r}")
        self._absorb_list(data["items"])
        self._rv = rv
        self._rv_unavailable = False
        self._attempt = 0
        self._on_listed(self.kind)

    def _absorb_list(self, items: list[Any]) -> None:
        """Make the store match a list's ``items`` and emit the difference (a subclass may differ)."""
        fresh: dict[ObjectKey, KubeObject] = {}
        for item in items:
            obj = self._parse(item) if isinstance(item, Mapping) else None
            if obj is not None:
                fresh[object_key(obj)] = obj
            elif isinstance(item, Mapping) and (held := self._store.get(self._key_of(item))) is not None:
                fresh[object_key(held)] = held  # unreadable now: keep the last good version
        events = diff_objects(self._store, fresh)
        self._store = fresh
        _log.info("listed", kind=self.kind, objects=len(fresh), changes=len(events))
        if events:
            self._emit(events)

    # -- watch -------------------------------------------------------------------------------

    async def _watch(self) -> SessionEvent:
        timeout_s = max(1, int(self._opts.watch_timeout_s * (1.0 + self._rng.random())))
        self._counts["watches"] += 1
        self._last_activity = self._clock.now()
        limit_s = min(timeout_s + self._opts.stall_grace_s, 2.0 * self._opts.bookmark_interval_s)
        try:
            async with asyncio.TaskGroup() as tg:
                watchdog = tg.create_task(self._watchdog(limit_s), name=f"{self.kind}-watchdog")
                try:
                    return await self._stream(timeout_s)
                finally:
                    watchdog.cancel()
        except BaseExceptionGroup as group:
            # A cancellation of this task that lands as the watchdog fires is not re-raised by
            # the TaskGroup (its children's errors win, asyncio/taskgroups.py): honour it here,
            # or the reflector would go on watching after it was told to stop.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise asyncio.CancelledError from None
            stalled, rest = group.split(_Stalled)
            if rest is not None:  # the stream's own error: re-raise it as itself
                if len(rest.exceptions) == 1:
                    raise rest.exceptions[0] from None
                raise rest from None
            assert stalled is not None
        self._counts["stalls"] += 1
        silent_s = self._clock.now() - self._last_activity
        _log.warning(f"{self.kind} watch silent for {silent_s:.1f} s (no event, no bookmark); taking it "
                     "as dead and watching again now from the last version", kind=self.kind,
                     limit_s=round(limit_s, 3), resource_version=self._rv)
        return SessionEvent.STALLED

    async def _watchdog(self, limit_s: float) -> None:
        while (left := self._last_activity + limit_s - self._clock.now()) > 0:
            await self._clock.sleep(left)
        raise _Stalled()

    async def _stream(self, timeout_s: int) -> SessionEvent:
        connect = aiohttp.ClientTimeout(total=None, connect=self._opts.list_timeout_s,
                                        sock_connect=self._opts.list_timeout_s, sock_read=None)
        resp = await self._call(watch=True, resource_version=self._rv, allow_watch_bookmarks=True,
                                timeout_seconds=timeout_s, label_selector=self._selector,
                                _preload_content=False, _request_timeout=connect, **self._fields)
        try:
            _keepalive(resp, self._opts)
            status = int(resp.status)
            if status != 200:
                problem = parse_status(await resp.read(), status)
                if problem.expired:
                    raise _Expired()
                raise _RequestFailed(f"watch answered {problem}")
            return await self._consume(resp, started=self._clock.now(), timeout_s=timeout_s)
        finally:
            resp.close()  # a watch's connection is not reused: it may be half-read or stalled

    async def _consume(self, resp: Any, *, started: float, timeout_s: int) -> SessionEvent:
        buffer = LineBuffer()
        seen = 0
        while True:
            try:
                chunk = await resp.content.readany()
            except aiohttp.ClientPayloadError as err:  # the stream was cut mid-chunk
                if not seen:
                    raise _RequestFailed(f"watch stream broken before any event: {err}") from err
                _log.info("watch stream dropped; watching again", kind=self.kind, resource_version=self._rv)
                return SessionEvent.ENDED
            if not chunk:
                # A quiet watch ending at its timeout is normal; one closed at once is not: back
                # off rather than spin against a server that accepts and hangs up.
                if not seen and self._clock.now() - started < timeout_s / 2:
                    raise _RequestFailed("watch closed before any event")
                _log.debug("watch ended by the server", kind=self.kind, resource_version=self._rv)
                return SessionEvent.ENDED
            self._last_activity = self._clock.now()
            try:
                lines = buffer.feed(chunk)
            except InvalidObject as err:
                self._malformed(err)
                raise _RequestFailed(str(err)) from err
            events: list[Event] = []
            try:
                for line in lines:
                    seen += 1
                    self._attempt = 0
                    self._handle_line(line, events)
            finally:
                if events:
                    self._emit(events)

    def _handle_line(self, line: bytes, events: list[Event]) -> None:
        try:
            wl = decode_watch_line(line)
        except InvalidObject as err:
            self._malformed(err)
            return
        if wl.type == "ERROR":
            assert wl.status is not None
            if wl.status.expired:
                raise _Expired()
            raise _RequestFailed(f"watch sent an ERROR event: {wl.status}")
        assert wl.resource_version is not None
        if wl.type != "BOOKMARK":
            event = self._apply(wl)
            if event is not None:
                events.append(event)
        self._rv = wl.resource_version

    def _apply(self, wl: WatchLine) -> Event | None:
        """Fold one watch event into the store; the event to emit, or None (a subclass may differ)."""
        key = self._key_of(wl.obj)
        if wl.type == "DELETED":
            held = self._store.pop(key, None)
            return None if held is None else Event(type=EventType.DELETED, obj=held)
        obj = self._parse(wl.obj)
        if obj is None:
            return None
        held = self._store.get(key)
        self._store[key] = obj
        if held is None:
            return Event(type=EventType.ADDED, obj=obj)
        return None if held == obj else Event(type=EventType.UPDATED, obj=obj)

    # -- objects -----------------------------------------------------------------------------

    def _key_of(self, raw: Mapping[str, Any]) -> ObjectKey:
        meta = raw.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        return ObjectKey(self.kind, str(meta.get("namespace") or "default"), str(meta.get("name") or ""))

    def _parse(self, raw: Mapping[str, Any]) -> KubeObject | None:
        """The object of ``raw``, or None (logged) when it cannot be served at all."""
        full = {"kind": self.kind, "apiVersion": self._api_version, **raw}
        if full["kind"] != self.kind:
            self._malformed(InvalidObject(source="kube", obj=object_name(raw), field="kind",
                                          problem=f"expected {self.kind}, got {full['kind']!r}"))
            return None
        result = parse_objects(full, source="kube")
        for problem in result.problems:
            self._malformed(problem)
        return result.objects[0] if len(result.objects) == 1 else None

    def _malformed(self, err: InvalidObject) -> None:
        self._counts["malformed"] += 1
        _log.warning("malformed object or event skipped", kind=self.kind, object=err.obj,
                     field=err.field, problem=err.problem)



def _describe(err: BaseException) -> str:
    """One line saying why a request failed: the error's text, else its kind in words."""
    text = " ".join(str(err).split())
    if text:
        return text
    if isinstance(err, TimeoutError):
        return "timed out"
    return type(err).__name__  # aiohttp's ServerDisconnectedError and the like say it in their name


def _keepalive(resp: Any, opts: ReflectorOptions) -> None:
    """Turn on TCP keepalive on the connection ``resp`` is read from (client-go's dialer keeps alive too).

    A connection whose peer vanished (a black-holed API server) then fails its read after
    ``keepalive_idle_s + keepalive_count * keepalive_interval_s`` seconds instead of hanging.
    """
    connection = getattr(resp, "connection", None)
    transport = getattr(connection, "transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        options = (("TCP_KEEPIDLE", opts.keepalive_idle_s), ("TCP_KEEPINTVL", opts.keepalive_interval_s),
                   ("TCP_KEEPCNT", opts.keepalive_count))
        for name, value in options:
            if hasattr(socket, name):  # Linux; macOS has only TCP_KEEPALIVE
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), max(1, int(value)))
    except OSError as err:  # keepalive is a guard, never a reason to fail
        _log.debug("cannot enable TCP keepalive", error=str(err))
