"""The asyncio shell around :class:`~kproxy.portforward.session.SpdySession`.

Theory of operation
-------------------
A :class:`ByteChannel` is the upgraded connection as a byte pipe: plain TCP after the SPDY
upgrade (:class:`StreamChannel`) or binary WebSocket messages (``kproxy.portforward.websocket``).
:class:`SpdyConnection` runs one read loop over it (:meth:`SpdyConnection.run`), feeds the sans-IO
session and routes the events to :class:`SpdyStream` objects. Writes go through the session and
are flushed at once; the channel's ``drain()`` gives TCP backpressure.

Backpressure per stream: :meth:`SpdyStream.read` credits the bytes it hands out back to the
peer (``consumed``), so a stream nobody reads stalls at its window and others go on. When the
peer does no flow control (spdystream, i.e. kubectl or the kubelet), a stream holding more than
:data:`MAX_UNREAD` bytes pauses the read loop instead, which is all TCP allows.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

from kproxy.clock import Clock, MonotonicClock
from kproxy.errors import PortForwardError, ProtocolError
from kproxy.portforward.frames import Headers, RstStatus
from kproxy.portforward.session import (
    DataReceived,
    Event,
    GoAwayReceived,
    HeadersReceived,
    PingAcked,
    Role,
    SpdySession,
    StreamOpened,
    StreamReplied,
    StreamReset,
    WindowOpened,
)

__all__ = ["MAX_UNREAD", "READ_CHUNK", "ByteChannel", "SpdyConnection", "SpdyStream", "StreamChannel"]

# Read size from the channel and per stream read, bytes: 256 KiB, the size the userspace relay
# measured best on loopback (shared/reference/userspace-portforward.md §5.2).
READ_CHUNK = 256 * 1024
# Per-stream receive window, bytes: what one unread stream may buffer. 4 MiB, as Go's HTTP/2
# transport gives a stream; enough to keep a loopback pipe full across a busy event loop.
STREAM_WINDOW = 4 * 1024 * 1024
# Unread bytes one stream may hold before the read loop pauses (peers without flow control).
MAX_UNREAD = 4 * 1024 * 1024


class ByteChannel(Protocol):
    """An upgraded connection as bytes: ``read()`` returns ``b""`` at EOF."""

    async def read(self) -> bytes:
        """The next bytes from the peer; ``b""`` when it closed."""
        ...

    def write(self, data: bytes) -> None:
        """Queue ``data`` to the peer."""
        ...

    async def drain(self) -> None:
        """Wait until the write buffer is below its high-water mark."""
        ...

    async def aclose(self) -> None:
        """Close the connection (idempotent)."""
        ...


class StreamChannel:
    """A :class:`ByteChannel` over an asyncio stream pair (the upgraded TCP connection).

    ``initial`` holds bytes the HTTP parser read past the 101 response or request.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 initial: bytes = b"") -> None:
        self._reader, self._writer, self._initial = reader, writer, initial

    async def read(self) -> bytes:
        """The next bytes (``b""`` at EOF or on a reset connection)."""
        if self._initial:
            data, self._initial = self._initial, b""
            return data
        try:
            return await self._reader.read(READ_CHUNK)
        except (ConnectionError, OSError):
            return b""

    def write(self, data: bytes) -> None:
        """Queue ``data``; a closed connection drops it (the read loop sees EOF)."""
        if not self._writer.is_closing():
            self._writer.write(data)

    async def drain(self) -> None:
        """TCP backpressure; a broken connection raises nothing here (the reader sees EOF)."""
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.drain()

    async def aclose(self) -> None:
        """Close the socket and wait for it briefly."""
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)


class SpdyStream:
    """One SPDY stream as an async byte stream (read, write, half-close, reset)."""

    def __init__(self, conn: SpdyConnection, stream_id: int, headers: Headers) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.headers = headers
        self._chunks: collections.deque[bytes] = collections.deque()
        self._unread = 0
        self._eof = False
        self.reset_status: int | None = None
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._replied = asyncio.Event()
        self.reply_headers: Headers = ()

    # ---------------------------------------------------------- called by the connection
    def _on_data(self, data: bytes, fin: bool) -> None:
        if data:
            self._chunks.append(data)
            self._unread += len(data)
        self._eof = self._eof or fin
        self._readable.set()

    def _on_reset(self, status: int) -> None:
        self.reset_status = status
        self._eof = True
        self._readable.set()
        self._writable.set()
        self._replied.set()

    # ------------------------------------------------------------------- public
    @property
    def unread(self) -> int:
        """Bytes received and not yet read."""
        return self._unread

    async def wait_replied(self) -> None:
        """Wait for the peer's SYN_REPLY.

        Raises:
            PortForwardError: the stream was reset or the connection closed first.
        """
        await self._replied.wait()
        if self.reset_status is not None:
            raise PortForwardError(f"stream {self.stream_id} was reset (status {self.reset_status})")

    async def read(self, max_bytes: int = READ_CHUNK) -> bytes:
        """Up to ``max_bytes`` of data; ``b""`` after the peer's FIN (or a reset)."""
        while not self._chunks and not self._eof:
            self._readable.clear()
            await self._readable.wait()
        if not self._chunks:
            return b""
        data = self._chunks.popleft()
        if len(data) > max_bytes:
            data, rest = data[:max_bytes], data[max_bytes:]
            self._chunks.appendleft(rest)
        self._unread -= len(data)
        if data:
            self.conn._consumed(self.stream_id, len(data))
        return data

    async def read_all(self, limit: int = 1 << 20) -> bytes:
        """Everything until FIN (at most ``limit`` bytes, the rest dropped); for error streams."""
        out = bytearray()
        while chunk := await self.read():
            if len(out) < limit:
                out += chunk[: limit - len(out)]
        return bytes(out)

    async def write(self, data: bytes) -> None:
        """Send ``data``, waiting for window and for TCP; returns when it is queued.

        Raises:
            PortForwardError: the stream was reset or closed for sending, or the connection died.
        """
        view = memoryview(data)
        while view:
            if self.reset_status is not None or self.conn.closed:
                raise PortForwardError(f"stream {self.stream_id} is gone (reset {self.reset_status})")
            n = self.conn.session.sendable(self.stream_id)
            if n == 0:
                self._writable.clear()
                if self.conn.session.sendable(self.stream_id) == 0:
                    await self._writable.wait()
                continue
            chunk, view = view[:n], view[n:]
            try:
                self.conn.session.send_data(self.stream_id, chunk)
            except ProtocolError as err:
                raise PortForwardError(f"stream {self.stream_id}: {err}") from err
            self.conn.flush()
            await self.conn.channel.drain()

    def close(self) -> None:
        """Half-close: send FIN (a no-op if already closed for sending)."""
        if self.reset_status is None and not self.conn.closed:
            self.conn.session.close_stream(self.stream_id)
            self.conn.flush()
            self.conn._forget_closed()

    def reset(self, status: int = RstStatus.CANCEL) -> None:
        """Abort both ways with RST_STREAM."""
        if self.reset_status is None:
            self._on_reset(status)
            if not self.conn.closed:
                self.conn.session.reset_stream(self.stream_id, status)
                self.conn.flush()
        self.conn._streams.pop(self.stream_id, None)


StreamHandler = Callable[[SpdyStream], Awaitable[None] | None]


class SpdyConnection:
    """A SPDY/3.1 connection over a :class:`ByteChannel`.

    Args:
        channel: the upgraded connection.
        role: which end we are.
        on_stream: called (synchronously; it may return an awaitable that is ignored) for each
            stream the peer opens, before it is replied to; the handler replies or resets.
        clock: for pings and idle timeouts.
    """

    def __init__(self, channel: ByteChannel, role: Role, *, on_stream: StreamHandler | None = None,
                 clock: Clock | None = None, initial_window: int = STREAM_WINDOW) -> None:
        self.channel = channel
        self.session = SpdySession(role, initial_window=initial_window)
        self.clock = clock or MonotonicClock()
        self._on_stream = on_stream
        self._streams: dict[int, SpdyStream] = {}
        self._pings: dict[int, asyncio.Future[float]] = {}
        self.closed = False
        self.goaway_received = False
        self.last_activity_s = self.clock.now()
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self.flush()

    def flush(self) -> None:
        """Write what the session queued."""
        out = self.session.data_to_send()
        if out and not self.closed:
            self.channel.write(out)

    def _consumed(self, stream_id: int, n: int) -> None:
        self.session.consumed(stream_id, n)
        self.flush()
        if not self._unpaused.is_set() and all(s.unread <= MAX_UNREAD for s in self._streams.values()):
            self._unpaused.set()

    async def run(self) -> None:
        """Read and dispatch until the peer closes or breaks the protocol; then every stream is
        reset (readers see EOF with ``reset_status`` set) and the channel closed."""
        try:
            while not self.closed:
                await self._unpaused.wait()
                data = await self.channel.read()
                if not data:
                    break
                self.last_activity_s = self.clock.now()
                try:
                    events = self.session.receive_data(data)
                except ProtocolError:
                    self.flush()
                    break
                for event in events:
                    self._dispatch(event)
                self.flush()
                self._forget_closed()
        finally:
            await self.aclose()

    def _forget_closed(self) -> None:
        from_session = self.session.open_streams()
        if len(from_session) != len(self._streams):
            live = set(from_session)
            for sid in [sid for sid in self._streams if sid not in live]:
                del self._streams[sid]

    def _dispatch(self, event: Event) -> None:
        match event:
            case DataReceived(stream_id=sid, data=data, fin=fin):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream._on_data(data, fin)
                    if not self.session.peer_flow_control and stream.unread > MAX_UNREAD:
                        self._unpaused.clear()
            case StreamOpened(stream_id=sid, headers=headers):
                stream = SpdyStream(self, sid, headers)
                self._streams[sid] = stream
                if self._on_stream is None:
                    stream.reset(RstStatus.REFUSED_STREAM)
                else:
                    self._on_stream(stream)
            case StreamReplied(stream_id=sid, headers=headers, fin=fin):
                stream = self._streams.get(sid)
                if stream is not None:
                    stream.reply_headers = headers
                    stream._replied.set()
                    if fin:
                        stream._on_data(b"", True)
            case HeadersReceived(stream_id=sid, fin=fin):
                stream = self._streams.get(sid)
                if stream is not None and fin:
                    stream._on_data(b"", True)
            case StreamReset(stream_id=sid, status=status):
                stream = self._streams.pop(sid, None)
                if stream is not None:
                    stream._on_reset(status)
            case WindowOpened(stream_id=sid):
                targets = self._streams.values() if sid == 0 else filter(None, [self._streams.get(sid)])
                for stream in targets:
                    stream._writable.set()
            case PingAcked(ping_id=pid):
                fut = self._pings.pop(pid, None)
                if fut is not None and not fut.done():
                    fut.set_result(self.clock.now())
            case GoAwayReceived():
                self.goaway_received = True

    def reply(self, stream: SpdyStream, headers: Headers = ()) -> None:
        """Accept a stream the peer opened (SYN_REPLY)."""
        self.session.reply(stream.stream_id, headers)
        stream._replied.set()
        self.flush()

    async def open_stream(self, headers: Headers, *, wait_reply: bool = True) -> SpdyStream:
        """Open a stream with ``headers`` and (by default) wait for the peer's reply.

        Raises:
            PortForwardError: the connection is closed or going away, or the peer reset the stream.
        """
        if self.closed or self.goaway_received:
            raise PortForwardError("the port-forward connection is closed")
        try:
            sid = self.session.open_stream(headers)
        except ProtocolError as err:
            raise PortForwardError(str(err)) from err
        stream = SpdyStream(self, sid, headers)
        self._streams[sid] = stream
        self.flush()
        if wait_reply:
            await stream.wait_replied()
        return stream

    async def ping(self) -> float:
        """Send a PING and wait for its echo; returns the round trip in seconds.

        Raises:
            PortForwardError: the connection closed before the echo.
        """
        if self.closed:
            raise PortForwardError("the port-forward connection is closed")
        start = self.clock.now()
        pid = self.session.ping()
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._pings[pid] = fut
        self.flush()
        return (await fut) - start

    async def aclose(self) -> None:
        """Send GOAWAY, reset every stream locally and close the channel (idempotent)."""
        if self.closed:
            return
        self.session.goaway()
        self.flush()
        self.closed = True
        for stream in list(self._streams.values()):
            stream._on_reset(RstStatus.CANCEL)
        self._streams.clear()
        for fut in self._pings.values():
            if not fut.done():
                fut.set_exception(PortForwardError("the port-forward connection closed"))
        self._pings.clear()
        self._unpaused.set()
        await self.channel.aclose()
