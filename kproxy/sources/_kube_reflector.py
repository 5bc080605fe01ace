"""One reflector: list, then watch, one resource through kubernetes-asyncio, forever.

Theory of operation
-------------------
The reflector follows client-go's ``ListAndWatch`` (``tools/cache/reflector.go``) through the
state machine of :mod:`kproxy.sources._kube_protocol`:

* LISTING: list every object matching the selector (a consistent read, no resource version),
  emit the difference from what it held (:func:`~kproxy.sources.base.diff_objects`: objects that
  vanished while the watch was down are deleted), remember the list's resource version.
* WATCHING: watch from that version with ``allowWatchBookmarks`` and a server-side
  ``timeoutSeconds`` drawn from ``[watch_timeout_s, 2 * watch_timeout_s)`` as client-go does.
  Every event moves the resource version on; BOOKMARK only moves it. When the server ends the
  watch (its timeout, or a dropped connection) the reflector watches again from the last
  version. ``ERROR`` with a 410 Status, or an HTTP 410, means the version expired: list again.
* Failures (connection refused or reset, TLS errors, 5xx and other non-2xx answers, timeouts
  of a list) wait a capped, jittered exponential backoff and retry what failed. Nothing is
  emitted on a failure: the last known state stays in force.
* Stalls: kubernetes-asyncio sets no read timeout on watches (since 32.0.0), so a half-open
  connection would hang forever. A watchdog task restarts the watch (from its last version)
  when nothing, not even a bookmark, arrived for ``timeoutSeconds + stall_grace_s``; a server
  honouring its timeout never stays that quiet, so a healthy watch is never cut.
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
    """

    watch_timeout_s: float = 300.0
    stall_grace_s: float = 30.0
    list_timeout_s: float = 60.0
    backoff: Backoff = field(default_factory=Backoff)


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
        malformed: events or objects skipped.
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
        self._state = SessionState.LISTING
        self._attempt = 0
        self._last_activity = clock.now()
        self._counts = {"lists": 0, "watches": 0, "failures": 0, "expired": 0, "stalls": 0,
                        "malformed": 0}

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
            delay = self._opts.backoff.delay(self._attempt, self._rng)
            self._attempt += 1
            _log.info("retrying after backoff", kind=self.kind, delay_s=round(delay, 3),
                      attempt=self._attempt, next=("list" if self._state is SessionState.LIST_BACKOFF
                                                   else "watch"))
            await self._clock.sleep(delay)
            return SessionEvent.WAITED
        try:
            if self._state is SessionState.LISTING:
                await self._list()
                return SessionEvent.LISTED
            return await self._watch()
        except _Expired:
            self._counts["expired"] += 1
            _log.info("resource version expired; listing again", kind=self.kind, resource_version=self._rv)
            return SessionEvent.GONE
        except (_RequestFailed, *_TRANSIENT) as err:
            self._counts["failures"] += 1
            _log.warning("API request failed; last known state kept", kind=self.kind,
                         state=str(self._state), error=str(err) or type(err).__name__,
                         error_type=type(err).__name__)
            return SessionEvent.FAILED

    # -- list --------------------------------------------------------------------------------

    async def _list(self) -> None:
        self._counts["lists"] += 1
        self._last_activity = self._clock.now()
        async with asyncio.timeout(self._opts.list_timeout_s):
            resp = await self._call(label_selector=self._selector, _preload_content=False,
                                    _request_timeout=self._opts.list_timeout_s, **self._fields)
            try:
                body = await resp.read()
                status = int(resp.status)
            finally:
                resp.release()
        if status != 200:
            raise _RequestFailed(f"list answered {parse_status(body, status)}")
        data = json.loads(body)
        if not isinstance(data, Mapping) or not isinstance(data.get("items"), list):
            raise _RequestFailed(f"list answer has no items: {body[:120]!r}")
        meta = data.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
        if not isinstance(rv, str) or not rv:
            raise _RequestFailed(f"list answer has no metadata.resourceVersion, got {rv!r}")
        self._absorb_list(data["items"])
        self._rv = rv
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
        limit_s = timeout_s + self._opts.stall_grace_s
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
        _log.warning("watch silent for longer than its timeout plus grace; restarting it",
                     kind=self.kind, silent_s=round(self._clock.now() - self._last_activity, 3),
                     limit_s=limit_s, resource_version=self._rv)
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

