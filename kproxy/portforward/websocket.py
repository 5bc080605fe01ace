"""WebSocket pieces of port-forward: the SPDY tunnel's byte channel and the handshake helpers.

Theory of operation
-------------------
KEP-4006 tunnels SPDY through a WebSocket negotiated with the subprotocol
``SPDY/3.1+portforward.k8s.io``: the SPDY byte stream is cut into binary messages at arbitrary
points, and a reader concatenates their payloads (client-go
``tools/portforward/tunneling_connection.go``: each ``Write`` is one binary message, ``Read``
continues across messages). :class:`WebSocketChannel` is that byte stream as a
:class:`~kproxy.portforward.connection.ByteChannel`, on the sans-IO protocol of the
``websockets`` library (its C speedups mask and unmask; wsproto's pure-Python masking cost
a third of the client's time) after the HTTP/1.1 handshake (done with h11 by the caller:
:func:`client_handshake_headers` and :func:`accept_token`). Pings are answered by the
library; a close frame is EOF.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os

from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from kproxy.portforward.connection import READ_CHUNK

__all__ = ["WebSocketChannel", "accept_token", "client_handshake_headers"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3


def accept_token(key: str) -> str:
    """``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key`` (RFC 6455 §4.2.2)."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode("ascii")


def client_handshake_headers(protocols: tuple[str, ...]) -> tuple[str, list[tuple[str, str]]]:
    """A fresh ``Sec-WebSocket-Key`` and the upgrade headers offering ``protocols``."""
    key = base64.b64encode(os.urandom(16)).decode("ascii")
    headers = [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13"),
               ("Sec-WebSocket-Key", key), ("Sec-WebSocket-Protocol", ", ".join(protocols))]
    return key, headers


class WebSocketChannel:
    """A :class:`~kproxy.portforward.connection.ByteChannel` over binary WebSocket messages.

    Args:
        reader, writer: the upgraded TCP connection.
        client: True on the client end (its frames are masked, RFC 6455 §5.3).
        initial: bytes read past the handshake.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, client: bool,
                 initial: bytes = b"") -> None:
        self._reader, self._writer = reader, writer
        # No message size limit: the tunnel is a byte stream, bounded by SPDY's windows.
        self._ws = Protocol(Side.CLIENT if client else Side.SERVER, state=State.OPEN, max_size=None)
        self._closed = False
        if initial:
            self._ws.receive_data(initial)

    def _flush(self) -> None:
        for data in self._ws.data_to_send():
            if data and not self._writer.is_closing():
                self._writer.write(data)

    def _pending(self) -> bytes | None:
        out = bytearray()
        for event in self._ws.events_received():
            if isinstance(event, Frame) and event.opcode in (Opcode.BINARY, Opcode.CONT, Opcode.TEXT):
                out += event.data
            elif isinstance(event, Frame) and event.opcode is Opcode.CLOSE:
                self._closed = True
        self._flush()  # pongs and the close answer
        if self._closed or self._ws.state is State.CLOSED:
            return bytes(out) if out else None
        return bytes(out)

    async def read(self) -> bytes:
        """The next tunnelled bytes; ``b""`` on a close frame or EOF."""
        while True:
            got = self._pending()
            if got:
                return got
            if got is None:
                return b""
            try:
                data = await self._reader.read(READ_CHUNK)
            except (ConnectionError, OSError):
                return b""
            if not data:
                self._ws.receive_eof()
                return b""
            self._ws.receive_data(data)

    def write(self, data: bytes) -> None:
        """Send ``data`` as one binary message."""
        if not self._closed and self._ws.state is State.OPEN:
            self._ws.send_binary(data)
            self._flush()

    async def drain(self) -> None:
        """TCP backpressure (errors surface on the read side)."""
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.drain()

    async def aclose(self) -> None:
        """Send a close frame (1000) once, then close the socket."""
        if self._ws.state is State.OPEN:
            with contextlib.suppress(Exception):
                self._ws.send_close(1000)
                self._flush()
        self._closed = True
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError, asyncio.TimeoutError):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)
