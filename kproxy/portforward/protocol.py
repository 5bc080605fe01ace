"""The ``portforward.k8s.io`` stream protocol on top of SPDY (sans-IO).

Theory of operation
-------------------
Per forwarded TCP connection the client opens two SPDY streams with the same ``port`` and
``requestID`` headers: an *error* stream (``streamType: error``; the client half-closes it at
once) and a *data* stream (``streamType: data``), as client-go's
``tools/portforward/portforward.go`` handleConnection does. The server pairs them by
``requestID`` (:class:`StreamPairer`, as the kubelet's
``pkg/kubelet/cri/streaming/portforward/httpstream.go`` does), dials the pod's port, relays the
data stream and writes a failure, if any, as text on the error stream. An empty error stream
closed with FIN means success.

Checks on a new stream (httpstream.go ``requestID``, ``portForward``): ``port`` must be an
integer 1-65535, ``streamType`` ``error`` or ``data``, and a pair has only one of each
("error stream already assigned"). A pair must complete within the stream-creation timeout
(kubelet's default 30 s), or the error stream gets "timed out waiting for streams". A client
without ``requestID`` gets one derived from the SPDY ids (error = id, data = id - 2, best effort,
as the kubelet does for old clients).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from kproxy.errors import ProtocolError
from kproxy.portforward.frames import Headers

__all__ = [
    "HEADER_PORT",
    "HEADER_REQUEST_ID",
    "HEADER_STREAM_TYPE",
    "IDLE_TIMEOUT_S",
    "PING_PERIOD_S",
    "PROTOCOL_V1",
    "STREAM_CREATION_TIMEOUT_S",
    "TUNNEL_PROTOCOL",
    "StreamPair",
    "StreamPairer",
    "StreamType",
    "dial_error_text",
    "header",
    "stream_headers",
]

# client-go/kubelet: k8s.io/apimachinery/pkg/util/portforward/constants.go.
PROTOCOL_V1 = "portforward.k8s.io"
# KEP-4006: SPDY frames inside binary WebSocket messages.
TUNNEL_PROTOCOL = "SPDY/3.1+portforward.k8s.io"
HEADER_STREAM_TYPE = "streamtype"
HEADER_PORT = "port"
HEADER_REQUEST_ID = "requestid"
# kubelet's streaming server default (pkg/kubelet/cri/streaming/server.go DefaultConfig).
STREAM_CREATION_TIMEOUT_S = 30.0
# kubelet --streaming-connection-idle-timeout default, 4 h.
IDLE_TIMEOUT_S = 4 * 3600.0
# client-go's SPDY round-tripper pings every 5 s (client-go/transport/spdy, kubernetes PR #97083).
PING_PERIOD_S = 5.0


class StreamType(enum.Enum):
    """The ``streamType`` header's values (k8s.io/api/core/v1 StreamTypeError, StreamTypeData)."""

    ERROR = "error"
    DATA = "data"


def header(headers: Headers, name: str) -> str | None:
    """The value of ``name`` in ``headers`` (case-insensitive), or ``None``."""
    wanted = name.lower()
    for key, value in headers:
        if key.lower() == wanted:
            return value
    return None


def stream_headers(kind: StreamType, port: int, request_id: int) -> Headers:
    """The SYN_STREAM headers client-go sends for one stream of a pair."""
    return ((HEADER_STREAM_TYPE, kind.value), (HEADER_PORT, str(port)), (HEADER_REQUEST_ID, str(request_id)))


def dial_error_text(*, port: int, pod: str, uid: str, reason: str) -> str:
    """The error-stream text kubelet writes when the forward fails (httpstream.go portForward)."""
    return f"error forwarding port {port} to pod {pod}, uid {uid}: {reason}"


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamPair:
    """A completed pair: the SPDY ids of its error and data streams, the port and request id."""

    request_id: str
    port: int
    error_stream: int
    data_stream: int


@dataclass(slots=True)
class _Pending:
    created_s: float
    port: int
    error_stream: int | None = None
    data_stream: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """A stream refused on arrival; the shell resets it (and writes ``text`` when it is an error stream)."""

    stream_id: int
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TimedOut:
    """A pair that did not complete in time; ``error_stream`` (when present) gets ``text``."""

    request_id: str
    error_stream: int | None
    data_stream: int | None
    text: str = "timed out waiting for streams"


class StreamPairer:
    """Pairs a server's incoming streams by ``requestID`` (sans-IO; times are passed in).

    Args:
        creation_timeout_s: how long a pair may stay incomplete, in seconds (30 s, kubelet's).
    """

    def __init__(self, *, creation_timeout_s: float = STREAM_CREATION_TIMEOUT_S) -> None:
        self.creation_timeout_s = creation_timeout_s
        self._pending: dict[str, _Pending] = {}

    @property
    def pending(self) -> Mapping[str, tuple[int | None, int | None]]:
        """Incomplete pairs: request id -> (error stream id, data stream id)."""
        return {rid: (p.error_stream, p.data_stream) for rid, p in self._pending.items()}

    def add(self, stream_id: int, headers: Headers, now_s: float) -> StreamPair | Rejected | None:
        """Register a new stream; returns the completed pair, a rejection, or ``None`` (waiting).

        Raises:
            ProtocolError: never; a bad stream is returned as :class:`Rejected`.
        """
        try:
            kind, port, rid = self._parse(stream_id, headers)
        except ProtocolError as err:
            return Rejected(stream_id=stream_id, text=str(err))
        pending = self._pending.get(rid)
        if pending is None:
            pending = self._pending[rid] = _Pending(created_s=now_s, port=port)
        if kind is StreamType.ERROR:
            if pending.error_stream is not None:
                return Rejected(stream_id=stream_id, text="error stream already assigned")
            pending.error_stream = stream_id
        else:
            if pending.data_stream is not None:
                return Rejected(stream_id=stream_id, text="data stream already assigned")
            pending.data_stream = stream_id
        if pending.error_stream is not None and pending.data_stream is not None:
            del self._pending[rid]
            return StreamPair(request_id=rid, port=pending.port, error_stream=pending.error_stream,
                              data_stream=pending.data_stream)
        return None

    def expire(self, now_s: float) -> list[TimedOut]:
        """Drop and return the pairs older than the creation timeout at ``now_s``."""
        late = [rid for rid, p in self._pending.items() if now_s - p.created_s >= self.creation_timeout_s]
        out = []
        for rid in late:
            p = self._pending.pop(rid)
            out.append(TimedOut(request_id=rid, error_stream=p.error_stream, data_stream=p.data_stream))
        return out

    def next_deadline(self) -> float | None:
        """When the oldest incomplete pair times out (seconds, the clock of ``now_s``), or ``None``."""
        if not self._pending:
            return None
        return min(p.created_s for p in self._pending.values()) + self.creation_timeout_s

    def forget(self, stream_id: int) -> None:
        """A stream was reset before its pair completed: drop the pair it belonged to."""
        for rid, p in list(self._pending.items()):
            if stream_id in (p.error_stream, p.data_stream):
                del self._pending[rid]

    @staticmethod
    def _parse(stream_id: int, headers: Headers) -> tuple[StreamType, int, str]:
        raw_type = header(headers, HEADER_STREAM_TYPE)
        try:
            kind = StreamType(raw_type)
        except ValueError:
            raise ProtocolError(f"invalid stream type {raw_type!r}") from None
        raw_port = header(headers, HEADER_PORT)
        if raw_port is None:
            raise ProtocolError("port header is required")
        try:
            port = int(raw_port)
        except ValueError:
            raise ProtocolError(f"unable to parse {raw_port!r} as a port") from None
        if not 1 <= port <= 65535:
            raise ProtocolError(f"port {port} must be between 1 and 65535, inclusive")
        rid = header(headers, HEADER_REQUEST_ID)
        if rid is None:
            # kubelet's fallback for clients before requestID: error = id, data = id - 2.
            rid = str(stream_id if kind is StreamType.ERROR else stream_id - 2)
        return kind, port, rid
