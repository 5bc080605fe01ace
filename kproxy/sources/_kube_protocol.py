"""The pure half of the ``kube`` source: watch lines, Status objects, selectors, backoff, states.

Theory of operation
-------------------
A reflector (client-go's name) lists a resource, then watches it from the list's resource
version. The API server answers a watch with a chunked stream of newline-separated JSON
events ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {...}}``. ``BOOKMARK``
carries only ``metadata.resourceVersion``; ``ERROR`` carries a ``Status`` whose ``code`` 410
means the resource version has expired and the reflector must list again.

Everything here is a function of values: :class:`LineBuffer` cuts a byte stream into lines,
:func:`decode_watch_line` turns one line into a :class:`WatchLine` (or raises
:class:`~kproxy.errors.InvalidObject` naming what is wrong), :func:`parse_status` reads a
``Status`` body, :func:`label_selector` builds kube-proxy's selector, :class:`Backoff` computes
client-go's jittered exponential delays, and :data:`TRANSITIONS` is the session state machine
(:func:`diagram` draws it). The I/O shell is :mod:`kproxy.sources.kube`.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from kproxy.errors import InvalidArgument, InvalidObject, InvalidTransition
from kproxy.model import LABEL_SERVICE_PROXY_NAME

__all__ = [
    "LABEL_HEADLESS",
    "MAX_LINE_BYTES",
    "TRANSITIONS",
    "ApiStatus",
    "Backoff",
    "LineBuffer",
    "SessionEvent",
    "SessionState",
    "WatchLine",
    "decode_watch_line",
    "diagram",
    "label_selector",
    "parse_status",
    "transition",
]

#: The label the EndpointSlice controller puts on the slices of headless Services
#: (``v1.IsHeadlessService``); kube-proxy's informers exclude it with ``DoesNotExist``.
LABEL_HEADLESS = "service.kubernetes.io/headless"

#: The longest watch line accepted, in bytes. etcd refuses objects over 1.5 MiB by default
#: (``--max-request-bytes``) and JSON is at most a few times larger; 16 MiB leaves a wide
#: margin while keeping a broken server from growing the buffer without bound.
MAX_LINE_BYTES = 16 * 1024 * 1024

_WATCH_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


def label_selector(service_proxy_name: str | None = None) -> str:
    """The label selector kube-proxy's informers list and watch with.

    kube-proxy (``cmd/kube-proxy/app/server.go``) selects
    ``!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`` for both
    Services and EndpointSlices, so that Services owned by another proxy and the slices of
    headless Services never reach it. With ``service_proxy_name`` (a kproxy extension, off by
    default as in kube-proxy) the Services labelled with that name are selected instead.
    """
    owner = (f"{LABEL_SERVICE_PROXY_NAME}={service_proxy_name}" if service_proxy_name
             else f"!{LABEL_SERVICE_PROXY_NAME}")
    return f"{owner},!{LABEL_HEADLESS}"


class LineBuffer:
    """Cut a byte stream into lines (without their ``\\n``), as watch events are delimited.

    Args:
        max_line_bytes: the longest line accepted.
    """

    __slots__ = ("_max", "_parts", "_size")

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return every line it completes (empty lines dropped).

        Raises:
            InvalidObject: a line grew beyond ``max_line_bytes`` (the buffer is then reset).
        """
        lines: list[bytes] = []
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            piece = data[start:end]
            if self._parts:
                piece = b"".join([*self._parts, piece])
                self._parts.clear()
                self._size = 0
            if piece.strip():
                lines.append(piece)
            start = end + 1
        rest = data[start:]
        if rest:
            self._parts.append(rest)
            self._size += len(rest)
            if self._size > self._max:
                self._parts.clear()
                self._size = 0
                raise InvalidObject(source="kube", problem=(
                    f"watch line longer than {self._max} bytes; expected one JSON event per line"))
        return lines

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete last line."""
        return self._size


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiStatus:
    """A ``Status`` object (or what an HTTP error said instead).

    Attributes:
        code: the HTTP status code it reports (410 for an expired resource version).
        reason: ``Expired``, ``Gone``, ``InternalError`` ... or ``""``.
        message: the server's message.
    """

    code: int
    reason: str = ""
    message: str = ""

    @property
    def expired(self) -> bool:
        """The resource version is too old: the client must list again (HTTP 410 Gone)."""
        return self.code == 410

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}".strip()


def parse_status(body: bytes | Mapping[str, Any], http_status: int = 0) -> ApiStatus:
    """Read a ``Status`` object; fall back to ``http_status`` and the raw text when it is not one.

    Args:
        body: the response body, or an ERROR event's decoded object.
        http_status: the response's status code (used when the body has no ``code``).
    """
    data: Any = body
    if isinstance(body, bytes):
        try:
            data = json.loads(body)
        except ValueError:
            return ApiStatus(code=http_status, message=body[:200].decode("utf-8", "replace"))
    if not isinstance(data, Mapping):
        return ApiStatus(code=http_status, message=str(data)[:200])
    code = data.get("code")
    return ApiStatus(code=code if isinstance(code, int) and not isinstance(code, bool) else http_status,
                     reason=str(data.get("reason") or ""), message=str(data.get("message") or ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchLine:
    """One decoded watch event.

    Attributes:
        type: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR.
        obj: the event's object as a dict (the Status for ERROR).
        resource_version: the object's ``metadata.resourceVersion``, or None (ERROR).
        status: the decoded Status of an ERROR event, else None.
    """

    type: str
    obj: Mapping[str, Any]
    resource_version: str | None = None
    status: ApiStatus | None = None

    @property
    def name(self) -> str:
        """``namespace/name`` of the object, as far as it can be read."""
        return object_name(self.obj)


def object_name(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a raw object (``?`` for what is missing)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "?/?"
    return f"{meta.get('namespace') or '?'}/{meta.get('name') or '?'}"


def decode_watch_line(line: bytes) -> WatchLine:
    """Decode one line of a watch stream.

    Returns:
        The :class:`WatchLine`; for ERROR its ``status`` is set.

    Raises:
        InvalidObject: the line is not JSON, has no ``type`` or ``object``, has an unknown
            type, or (except ERROR) an object without ``metadata.resourceVersion``; the message
            names the object when it can.
    """
    try:
        data = json.loads(line)
    except ValueError as err:
        raise InvalidObject(source="kube", problem=(
            f"watch event is not JSON ({err}): {line[:120]!r}")) from None
    if not isinstance(data, Mapping):
        raise InvalidObject(source="kube", problem=f"watch event is not an object: {line[:120]!r}")
    kind, obj = data.get("type"), data.get("object")
    if not isinstance(obj, Mapping):
        raise InvalidObject(source="kube", obj=f"event {kind!r}", field="object",
                            problem=f"expected an object, got {type(obj).__name__}")
    if kind not in _WATCH_TYPES:
        raise InvalidObject(source="kube", obj=object_name(obj), field="type",
                            problem=f"unknown watch event type {kind!r}; expected one of "
                                    f"{sorted(_WATCH_TYPES)}")
    assert isinstance(kind, str)
    if kind == "ERROR":
        return WatchLine(type=kind, obj=obj, status=parse_status(obj))
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    if not isinstance(rv, str) or not rv:
        raise InvalidObject(source="kube", obj=object_name(obj), field="metadata.resourceVersion",
                            problem=f"{kind} event without a resource version, got {rv!r}")
    return WatchLine(type=kind, obj=obj, resource_version=rv)


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """client-go's reflector backoff: exponential, capped, with jitter.

    client-go (``tools/cache/reflector.go``) backs off from 800 ms, doubling up to 30 s, with
    jitter 1.0 (each delay is stretched by up to 100 %), and resets after a success.

    Attributes:
        initial_s: the first delay in seconds (> 0).
        cap_s: the largest delay before jitter, in seconds (>= initial_s).
        factor: the growth per failure (>= 1).
        jitter: the delay is multiplied by ``1 + jitter * U[0, 1)`` (>= 0).

    Raises:
        InvalidArgument: a bound out of range.
    """

    initial_s: float = 0.8
    cap_s: float = 30.0
    factor: float = 2.0
    jitter: float = 1.0

    def __post_init__(self) -> None:
        for name in ("initial_s", "cap_s", "factor", "jitter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InvalidArgument(f"Backoff.{name} must be a finite number, got {name}={value!r}")
        if self.initial_s <= 0 or self.cap_s < self.initial_s or self.factor < 1 or self.jitter < 0:
            raise InvalidArgument(
                f"Backoff needs initial_s > 0, cap_s >= initial_s, factor >= 1, jitter >= 0; got "
                f"{self.initial_s=}, {self.cap_s=}, {self.factor=}, {self.jitter=}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt`` (0 for the first retry).

        Raises:
            InvalidArgument: ``attempt`` < 0.
        """
        if attempt < 0:
            raise InvalidArgument(f"attempt must be >= 0, got {attempt=}")
        base = self.initial_s * self.factor ** min(attempt, 64)
        return min(base, self.cap_s) * (1.0 + self.jitter * rng.random())


class SessionState(StrEnum):
    """Where a reflector is."""

    LISTING = "LISTING"
    WATCHING = "WATCHING"
    LIST_BACKOFF = "LIST_BACKOFF"
    WATCH_BACKOFF = "WATCH_BACKOFF"
    ERROR = "ERROR"


class SessionEvent(StrEnum):
    """What can happen to a reflector."""

    LISTED = "LISTED"        # a list succeeded: its objects are the new state
    FAILED = "FAILED"        # connection refused/reset, TLS error, 5xx, unreadable answer
    ENDED = "ENDED"          # the server closed the watch (its timeout, or a dropped stream)
    STALLED = "STALLED"      # nothing, not even a bookmark, for longer than timeout + grace
    GONE = "GONE"            # 410: the resource version expired
    WAITED = "WAITED"        # a backoff delay passed


_S, _E = SessionState, SessionEvent

#: The reflector's state machine: ``(state, event) -> next state``; other pairs are illegal.
TRANSITIONS: Mapping[tuple[SessionState, SessionEvent], SessionState] = MappingProxyType({
    (_S.LISTING, _E.LISTED): _S.WATCHING,
    (_S.LISTING, _E.FAILED): _S.LIST_BACKOFF,
    (_S.LISTING, _E.GONE): _S.LIST_BACKOFF,
    (_S.LIST_BACKOFF, _E.WAITED): _S.LISTING,
    (_S.WATCHING, _E.ENDED): _S.WATCHING,
    (_S.WATCHING, _E.STALLED): _S.WATCHING,
    (_S.WATCHING, _E.FAILED): _S.WATCH_BACKOFF,
    (_S.WATCHING, _E.GONE): _S.LISTING,
    (_S.WATCH_BACKOFF, _E.WAITED): _S.WATCHING,
})


def transition(state: SessionState, event: SessionEvent, role: str = "reflector") -> SessionState:
    """The state after ``event`` in ``state``.

    Raises:
        InvalidTransition: the pair is not in :data:`TRANSITIONS` (the machine is then in ERROR).
    """
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(
            f"{role}: event {event} is illegal in state {state}; the session moves to ERROR") from None


def diagram() -> str:
    """The state machine as Graphviz ``dot`` text, generated from :data:`TRANSITIONS`."""
    lines = ["digraph reflector {"]
    lines.extend(f'  {a} -> {b} [label="{e}"];' for (a, e), b in TRANSITIONS.items())
    lines.append("}")
    return "\n".join(lines)
