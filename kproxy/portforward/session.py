"""A SPDY/3.1 session, client or server, without I/O: bytes in, events out, bytes to send.

Theory of operation
-------------------
:class:`SpdySession` owns the stream table, both header compression contexts and the flow-control
windows. ``receive_data(bytes)`` returns the events the bytes complete; calls such as
:meth:`SpdySession.open_stream` or :meth:`SpdySession.send_data` queue frames, and
:meth:`SpdySession.data_to_send` hands the queued bytes to the I/O shell.

Streams: a client opens odd ids, a server even ones (§2.3.2); each stream is a small state
machine over its two halves (table :data:`STREAM_TRANSITIONS`): FIN on a frame closes the
sender's half, RST_STREAM closes both, and a stream with both halves closed is forgotten.

Flow control (§2.6.8, SPDY/3.1 §2.6.8 session window). Every stream has a send window and a
receive window of ``initial_window`` bytes (64 KiB by default, the draft's); the session has
one more pair, on stream id 0. Received DATA is charged to both; the session's receive window
is credited back as soon as the bytes are *received* (they are buffered per stream), and a
stream's only when the application says it *consumed* them (:meth:`SpdySession.consumed`). So
a slow reader exhausts its own stream's window and stalls only that stream.

Peers that ignore flow control. moby/spdystream, which kubectl and the kubelet use, never
sends WINDOW_UPDATE or SETTINGS and ignores both (``connection.go`` frameHandler). A session
therefore enforces its *send* windows only once the peer has shown it does flow control, by a
SETTINGS INITIAL_WINDOW_SIZE or a WINDOW_UPDATE; until then :meth:`SpdySession.sendable` is
unbounded and received DATA beyond a window is accepted (the shell then applies TCP
backpressure instead). This session announces its own INITIAL_WINDOW_SIZE in the first frame it
sends, so two kproxy peers always flow-control each other.

Pings: ids of our parity are ours (odd for a client); a PING of the other parity is echoed at
once (§2.6.5) and reported as :class:`PingReceived`, an echo of ours as :class:`PingAcked`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from kproxy.errors import InvalidTransition, ProtocolError
from kproxy.portforward.frames import (
    DataFrame,
    Frame,
    FrameParser,
    GoAwayFrame,
    GoAwayStatus,
    HeaderCodec,
    Headers,
    HeadersFrame,
    PingFrame,
    RstStatus,
    RstStreamFrame,
    SettingId,
    SettingsFrame,
    SynReplyFrame,
    SynStreamFrame,
    WindowUpdateFrame,
    data_header,
    encode,
)

__all__ = [
    "DEFAULT_WINDOW",
    "STREAM_TRANSITIONS",
    "DataReceived",
    "Event",
    "GoAwayReceived",
    "HeadersReceived",
    "PingAcked",
    "PingReceived",
    "Role",
    "SpdySession",
    "StreamOpened",
    "StreamReplied",
    "StreamReset",
    "StreamState",
    "WindowOpened",
]

# The draft's initial window, per stream and for the session (§2.6.8; 3.1 §2.6.8).
DEFAULT_WINDOW = 64 * 1024
# A stream's consumed bytes are credited back once they reach a quarter of its window, so the
# sender never drains the window while an update is in flight and WINDOW_UPDATEs stay few.
_MAX_WINDOW = 0x7FFFFFFF
# DATA frames carry at most 1 MiB: fewer headers than the 64 KiB frames browsers used, and well
# under the 24-bit limit; spdystream reads frames of any length.
MAX_DATA_FRAME = 1 << 20


class Role(enum.Enum):
    """Which end of the upgraded connection this session is."""

    CLIENT = "client"
    SERVER = "server"


class StreamState(enum.Enum):
    """A stream's halves: which sides may still send DATA."""

    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed-local"    # we sent FIN
    HALF_CLOSED_REMOTE = "half-closed-remote"  # the peer sent FIN
    CLOSED = "closed"


class _StreamEvent(enum.Enum):
    SEND_FIN = "send-fin"
    RECV_FIN = "recv-fin"
    RESET = "reset"


STREAM_TRANSITIONS: Mapping[tuple[StreamState, _StreamEvent], StreamState] = {
    (StreamState.OPEN, _StreamEvent.SEND_FIN): StreamState.HALF_CLOSED_LOCAL,
    (StreamState.OPEN, _StreamEvent.RECV_FIN): StreamState.HALF_CLOSED_REMOTE,
    (StreamState.HALF_CLOSED_LOCAL, _StreamEvent.RECV_FIN): StreamState.CLOSED,
    (StreamState.HALF_CLOSED_REMOTE, _StreamEvent.SEND_FIN): StreamState.CLOSED,
    (StreamState.OPEN, _StreamEvent.RESET): StreamState.CLOSED,
    (StreamState.HALF_CLOSED_LOCAL, _StreamEvent.RESET): StreamState.CLOSED,
    (StreamState.HALF_CLOSED_REMOTE, _StreamEvent.RESET): StreamState.CLOSED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamOpened:
    """The peer opened ``stream_id`` (SYN_STREAM); ``fin``: it will send no DATA."""

    stream_id: int
    headers: Headers
    fin: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamReplied:
    """The peer accepted a stream we opened (SYN_REPLY)."""

    stream_id: int
    headers: Headers
    fin: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadersReceived:
    """More headers on ``stream_id`` (HEADERS)."""

    stream_id: int
    headers: Headers
    fin: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class DataReceived:
    """``data`` on ``stream_id``; ``fin``: the peer's half is closed (empty ``data`` possible)."""

    stream_id: int
    data: bytes
    fin: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamReset:
    """``stream_id`` ended abnormally (RST_STREAM from the peer, ``remote``, or from us)."""

    stream_id: int
    status: int
    remote: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowOpened:
    """More may be sent on ``stream_id`` (0: the session window grew)."""

    stream_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PingReceived:
    """The peer pinged us (already echoed)."""

    ping_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PingAcked:
    """The peer echoed our ping ``ping_id``."""

    ping_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GoAwayReceived:
    """The peer goes away: streams above ``last_good_stream_id`` of ours were not processed."""

    last_good_stream_id: int
    status: int


Event = (StreamOpened | StreamReplied | HeadersReceived | DataReceived | StreamReset | WindowOpened
         | PingReceived | PingAcked | GoAwayReceived)


@dataclass(slots=True)
class _Stream:
    sid: int
    state: StreamState
    send_window: int
    recv_window: int
    unacked: int = 0          # bytes consumed but not yet credited with a WINDOW_UPDATE
    replied: bool = False
    local: bool = True


@dataclass(slots=True)
class _Windows:
    initial_send: int = DEFAULT_WINDOW
    session_send: int = DEFAULT_WINDOW
    session_recv: int = DEFAULT_WINDOW
    session_size: int = DEFAULT_WINDOW
    session_unacked: int = 0
    peer_flow_control: bool = False


class SpdySession:
    """One end of a SPDY/3.1 connection (sans-IO).

    Args:
        role: :attr:`Role.CLIENT` opens odd stream ids and pings with odd ids.
        initial_window: the receive window each stream gets, in bytes (announced in SETTINGS).
        session_window: the session receive window, in bytes (at least 64 KiB, the 3.1 default;
            the growth is announced with a WINDOW_UPDATE on stream 0).

    Raises:
        InvalidArgument: never; windows are clamped to 1 .. 2**31-1 bytes.
    """

    def __init__(self, role: Role, *, initial_window: int = DEFAULT_WINDOW,
                 session_window: int = 16 * 1024 * 1024) -> None:
        self.role = role
        self._codec = HeaderCodec()
        self._parser = FrameParser(self._codec)
        self._out: list[bytes | memoryview] = []
        self._streams: dict[int, _Stream] = {}
        self._next_sid = 1 if role is Role.CLIENT else 2
        self._next_ping = 1 if role is Role.CLIENT else 2
        self._last_remote_sid = 0
        self._recv_initial = max(1, min(initial_window, _MAX_WINDOW))
        self._w = _Windows()
        self.goaway_sent = False
        self.goaway_received = False
        self.pings_outstanding: set[int] = set()
        self._queue(SettingsFrame(values=((SettingId.INITIAL_WINDOW_SIZE, self._recv_initial),)))
        grow = max(DEFAULT_WINDOW, min(session_window, _MAX_WINDOW)) - DEFAULT_WINDOW
        self._w.session_recv += grow
        self._w.session_size = self._w.session_recv
        if grow:
            self._queue(WindowUpdateFrame(stream_id=0, delta=grow))

    # ---------------------------------------------------------------- output
    def _queue(self, frame: Frame) -> None:
        self._out.append(encode(frame, self._codec))

    def data_to_send(self) -> bytes:
        """Every byte queued since the last call (empty when there is nothing)."""
        out = b"".join(self._out)
        self._out.clear()
        return out

    # --------------------------------------------------------------- queries
    @property
    def peer_flow_control(self) -> bool:
        """Whether the peer has shown it does flow control (so our send windows are enforced)."""
        return self._w.peer_flow_control

    def state(self, stream_id: int) -> StreamState:
        """The state of ``stream_id``; a stream never seen or forgotten is CLOSED."""
        stream = self._streams.get(stream_id)
        return stream.state if stream else StreamState.CLOSED

    def open_streams(self) -> tuple[int, ...]:
        """The ids of every stream not yet closed both ways, ascending."""
        return tuple(sorted(self._streams))

    def sendable(self, stream_id: int) -> int:
        """How many DATA bytes :meth:`send_data` accepts on ``stream_id`` now (0: wait for
        :class:`WindowOpened`, or the stream cannot send)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.state in (StreamState.HALF_CLOSED_LOCAL, StreamState.CLOSED):
            return 0
        if not self._w.peer_flow_control:
            return _MAX_WINDOW
        return max(0, min(stream.send_window, self._w.session_send))

    # ---------------------------------------------------------------- streams
    def open_stream(self, headers: Headers, *, fin: bool = False) -> int:
        """Queue a SYN_STREAM with ``headers``; returns the new stream id.

        Raises:
            ProtocolError: after a GOAWAY either way, or when stream ids are exhausted.
        """
        if self.goaway_sent or self.goaway_received:
            raise ProtocolError("no new stream after GOAWAY")
        sid = self._next_sid
        if sid > _MAX_WINDOW:
            raise ProtocolError("stream ids exhausted; open a new connection")
        self._next_sid += 2
        state = StreamState.HALF_CLOSED_LOCAL if fin else StreamState.OPEN
        self._streams[sid] = _Stream(sid=sid, state=state, send_window=self._w.initial_send,
                                     recv_window=self._recv_initial)
        self._queue(SynStreamFrame(stream_id=sid, headers=headers, fin=fin))
        return sid

    def reply(self, stream_id: int, headers: Headers = (), *, fin: bool = False) -> None:
        """Queue the SYN_REPLY accepting the peer's ``stream_id``.

        Raises:
            ProtocolError: ``stream_id`` is not a stream the peer opened, or was replied already.
        """
        stream = self._streams.get(stream_id)
        if stream is None or stream.local or stream.replied:
            raise ProtocolError(f"stream {stream_id} cannot be replied to")
        stream.replied = True
        self._queue(SynReplyFrame(stream_id=stream_id, headers=headers, fin=fin))
        if fin:
            self._transition(stream, _StreamEvent.SEND_FIN)

    def send_data(self, stream_id: int, data: bytes | memoryview, *, fin: bool = False) -> None:
        """Queue ``data`` (and FIN with ``fin``) on ``stream_id``, in frames of 1 MiB at most.

        ``data`` must not change until :meth:`data_to_send` (it is queued by reference).

        Raises:
            ProtocolError: more than :meth:`sendable` bytes, or the stream's half is closed.
        """
        stream = self._streams.get(stream_id)
        if stream is None or stream.state in (StreamState.HALF_CLOSED_LOCAL, StreamState.CLOSED):
            raise ProtocolError(f"stream {stream_id} is closed for sending")
        if len(data) > self.sendable(stream_id):
            raise ProtocolError(f"{len(data)} bytes exceed stream {stream_id}'s window "
                                f"of {self.sendable(stream_id)}", status=RstStatus.FLOW_CONTROL_ERROR)
        if self._w.peer_flow_control:
            stream.send_window -= len(data)
            self._w.session_send -= len(data)
        view = memoryview(data)
        for start in range(0, len(data), MAX_DATA_FRAME):
            part = view[start:start + MAX_DATA_FRAME]
            last = start + MAX_DATA_FRAME >= len(data)
            # Header and payload are queued apart: the payload is never copied here.
            self._out.append(data_header(stream_id, len(part), fin=fin and last))
            self._out.append(part)
        if not data and fin:
            self._queue(DataFrame(stream_id=stream_id, data=b"", fin=True))
        if fin:
            self._transition(stream, _StreamEvent.SEND_FIN)

    def close_stream(self, stream_id: int) -> None:
        """Half-close our side of ``stream_id`` (an empty DATA with FIN); a no-op when closed."""
        if self.state(stream_id) in (StreamState.OPEN, StreamState.HALF_CLOSED_REMOTE):
            self.send_data(stream_id, b"", fin=True)

    def reset_stream(self, stream_id: int, status: int = RstStatus.CANCEL) -> None:
        """Queue RST_STREAM for ``stream_id`` and forget it (a no-op for a closed stream)."""
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        self._queue(RstStreamFrame(stream_id=stream_id, status=status))
        self._transition(stream, _StreamEvent.RESET)

    def consumed(self, stream_id: int, n: int) -> None:
        """The application consumed ``n`` bytes of ``stream_id``: credit them back to the peer
        once they reach a quarter of the stream's window (a WINDOW_UPDATE)."""
        stream = self._streams.get(stream_id)
        if stream is None or n <= 0:
            return
        stream.unacked += n
        if stream.unacked >= self._recv_initial // 4 and stream.state in (
                StreamState.OPEN, StreamState.HALF_CLOSED_LOCAL):
            stream.recv_window += stream.unacked
            self._queue(WindowUpdateFrame(stream_id=stream_id, delta=stream.unacked))
            stream.unacked = 0

    def ping(self) -> int:
        """Queue a PING; returns its id (answered by :class:`PingAcked`)."""
        pid = self._next_ping
        self._next_ping = self._next_ping + 2 if self._next_ping < 0x7FFFFFFD else self._next_ping % 2 + 1
        self.pings_outstanding.add(pid)
        self._queue(PingFrame(ping_id=pid))
        return pid

    def goaway(self, status: int = GoAwayStatus.OK) -> None:
        """Queue GOAWAY (once): no new stream either way; open ones may finish."""
        if not self.goaway_sent:
            self.goaway_sent = True
            self._queue(GoAwayFrame(last_good_stream_id=self._last_remote_sid, status=status))

    # ----------------------------------------------------------------- input
    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes read from the connection; returns the events they complete, in order.

        Raises:
            ProtocolError: the connection is broken (a GOAWAY PROTOCOL_ERROR is queued first).
        """
        self._parser.feed(data)
        events: list[Event] = []
        try:
            for frame in self._parser.frames():
                self._handle(frame, events)
        except ProtocolError:
            self.goaway(GoAwayStatus.PROTOCOL_ERROR)
            raise
        return events

    def _handle(self, frame: Frame, events: list[Event]) -> None:
        match frame:
            case DataFrame():
                self._on_data(frame, events)
            case SynStreamFrame():
                self._on_syn_stream(frame, events)
            case SynReplyFrame(stream_id=sid, headers=headers, fin=fin):
                stream = self._streams.get(sid)
                if stream is None or not stream.local:
                    return
                if stream.replied:
                    self.reset_stream(sid, RstStatus.STREAM_IN_USE)
                    events.append(StreamReset(stream_id=sid, status=RstStatus.STREAM_IN_USE, remote=False))
                    return
                stream.replied = True
                events.append(StreamReplied(stream_id=sid, headers=headers, fin=fin))
                if fin:
                    self._transition(stream, _StreamEvent.RECV_FIN)
            case HeadersFrame(stream_id=sid, headers=headers, fin=fin):
                stream = self._streams.get(sid)
                if stream is None:
                    return
                events.append(HeadersReceived(stream_id=sid, headers=headers, fin=fin))
                if fin:
                    self._transition(stream, _StreamEvent.RECV_FIN)
            case RstStreamFrame(stream_id=sid, status=status):
                stream = self._streams.get(sid)
                if stream is not None:
                    self._transition(stream, _StreamEvent.RESET)
                    events.append(StreamReset(stream_id=sid, status=status, remote=True))
            case SettingsFrame(values=values):
                for key, value in values:
                    if key == SettingId.INITIAL_WINDOW_SIZE:
                        self._on_initial_window(value, events)
            case WindowUpdateFrame(stream_id=sid, delta=delta):
                self._on_window_update(sid, delta, events)
            case PingFrame(ping_id=pid):
                if pid % 2 == self._next_ping % 2:
                    if pid in self.pings_outstanding:
                        self.pings_outstanding.discard(pid)
                        events.append(PingAcked(ping_id=pid))
                else:
                    self._queue(PingFrame(ping_id=pid))
                    events.append(PingReceived(ping_id=pid))
            case GoAwayFrame(last_good_stream_id=last, status=status):
                self.goaway_received = True
                events.append(GoAwayReceived(last_good_stream_id=last, status=status))

    def _on_syn_stream(self, frame: SynStreamFrame, events: list[Event]) -> None:
        sid = frame.stream_id
        theirs = 0 if self.role is Role.CLIENT else 1
        if sid == 0 or sid % 2 != theirs or sid <= self._last_remote_sid:
            raise ProtocolError(f"SYN_STREAM with stream id {sid} (last was {self._last_remote_sid})")
        self._last_remote_sid = sid
        if self.goaway_sent:
            self._queue(RstStreamFrame(stream_id=sid, status=RstStatus.REFUSED_STREAM))
            return
        state = StreamState.HALF_CLOSED_REMOTE if frame.fin or frame.unidirectional else StreamState.OPEN
        self._streams[sid] = _Stream(sid=sid, state=state, send_window=self._w.initial_send,
                                     recv_window=self._recv_initial, local=False)
        events.append(StreamOpened(stream_id=sid, headers=frame.headers, fin=frame.fin))

    def _on_data(self, frame: DataFrame, events: list[Event]) -> None:
        sid, size = frame.stream_id, len(frame.data)
        self._w.session_recv -= size
        if self._w.session_recv < 0 and self._w.peer_flow_control:
            raise ProtocolError(f"session window overrun by {-self._w.session_recv} bytes",
                                status=RstStatus.FLOW_CONTROL_ERROR)
        # Credit the session window on receipt (the bytes are buffered per stream), in batches
        # of half the window so WINDOW_UPDATEs stay few.
        self._w.session_unacked += size
        if self._w.session_unacked >= self._w.session_size // 2:
            self._w.session_recv += self._w.session_unacked
            self._queue(WindowUpdateFrame(stream_id=0, delta=self._w.session_unacked))
            self._w.session_unacked = 0
        stream = self._streams.get(sid)
        if stream is None or stream.state in (StreamState.HALF_CLOSED_REMOTE, StreamState.CLOSED):
            if stream is None:
                return  # DATA after a reset crosses it on the wire; §2.4.2 says ignore
            self.reset_stream(sid, RstStatus.STREAM_ALREADY_CLOSED)
            events.append(StreamReset(stream_id=sid, status=RstStatus.STREAM_ALREADY_CLOSED, remote=False))
            return
        stream.recv_window -= size
        if stream.recv_window < 0 and self._w.peer_flow_control:
            self.reset_stream(sid, RstStatus.FLOW_CONTROL_ERROR)
            events.append(StreamReset(stream_id=sid, status=RstStatus.FLOW_CONTROL_ERROR, remote=False))
            return
        events.append(DataReceived(stream_id=sid, data=frame.data, fin=frame.fin))
        if frame.fin:
            self._transition(stream, _StreamEvent.RECV_FIN)

    def _on_initial_window(self, value: int, events: list[Event]) -> None:
        self._w.peer_flow_control = True
        delta = value - self._w.initial_send
        self._w.initial_send = value
        for stream in self._streams.values():
            stream.send_window += delta
            events.append(WindowOpened(stream_id=stream.sid))

    def _on_window_update(self, sid: int, delta: int, events: list[Event]) -> None:
        self._w.peer_flow_control = True
        if sid == 0:
            self._w.session_send = min(_MAX_WINDOW, self._w.session_send + delta)
            events.append(WindowOpened(stream_id=0))
            return
        stream = self._streams.get(sid)
        if stream is None:
            return
        if stream.send_window + delta > _MAX_WINDOW:
            self.reset_stream(sid, RstStatus.FLOW_CONTROL_ERROR)
            events.append(StreamReset(stream_id=sid, status=RstStatus.FLOW_CONTROL_ERROR, remote=False))
            return
        stream.send_window += delta
        events.append(WindowOpened(stream_id=sid))

    def _transition(self, stream: _Stream, event: _StreamEvent) -> None:
        nxt = STREAM_TRANSITIONS.get((stream.state, event))
        if nxt is None:
            if event is _StreamEvent.RESET:
                return
            raise InvalidTransition(f"SPDY stream {stream.sid} ({self.role.value}): "
                                    f"{event.value} in state {stream.state.value}")
        stream.state = nxt
        if nxt is StreamState.CLOSED:
            self._streams.pop(stream.sid, None)

