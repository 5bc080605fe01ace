"""The server end of ``portforward.k8s.io``, as the kubelet's streaming server runs it.

Theory of operation
-------------------
:func:`serve_portforward` runs one upgraded connection for one Pod: it replies to every stream
the client opens (spdystream's server replies on accept), pairs them with
:class:`~kproxy.portforward.protocol.StreamPairer`, and for each pair dials the Pod's port with
the given :data:`~kproxy.portforward.bridge.Dialer` and relays the data stream. A failed dial
writes kubelet's text (``error forwarding port P to pod NAME, uid UID: REASON``) on the error
stream; success leaves it empty. Both streams are closed when the forward ends, as
``httpstream.go`` defers. Incomplete pairs time out after the stream-creation timeout; a
connection idle (no frame either way, no open pair) for the idle timeout is closed. Every task
belongs to one TaskGroup scoped to the connection; ``stop`` (an event) ends the connection,
which is how a deleted Pod cuts its forwards.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from kproxy.portforward.bridge import Dialer, relay
from kproxy.portforward.connection import SpdyConnection, SpdyStream
from kproxy.portforward.frames import RstStatus
from kproxy.portforward.protocol import (
    IDLE_TIMEOUT_S,
    STREAM_CREATION_TIMEOUT_S,
    Rejected,
    StreamPair,
    StreamPairer,
    dial_error_text,
)

__all__ = ["PodTarget", "serve_portforward"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PodTarget:
    """The Pod a connection forwards to: its name and uid (for the error text) and its dialer."""

    name: str
    uid: str
    dial: Dialer


def _reason(err: BaseException) -> str:
    if isinstance(err, asyncio.TimeoutError):
        return "i/o timeout"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


async def serve_portforward(conn: SpdyConnection, pod: PodTarget, *, stop: asyncio.Event | None = None,
                            creation_timeout_s: float = STREAM_CREATION_TIMEOUT_S,
                            idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
    """Serve ``conn`` (created with ``on_stream=None``; this installs the handler) until the peer
    leaves, ``stop`` is set or the connection idles out; then every forward is cut."""
    pairer = StreamPairer(creation_timeout_s=creation_timeout_s)
    streams: dict[int, SpdyStream] = {}
    active: set[str] = set()
    pair_ready: asyncio.Queue[StreamPair] = asyncio.Queue()
    wake = asyncio.Event()

    def on_stream(stream: SpdyStream) -> None:
        conn.reply(stream)
        result = pairer.add(stream.stream_id, stream.headers, conn.clock.now())
        if isinstance(result, Rejected):
            stream.reset(RstStatus.PROTOCOL_ERROR)
            return
        streams[stream.stream_id] = stream
        if result is not None:
            pair_ready.put_nowait(result)
        wake.set()

    conn._on_stream = on_stream

    async def forward(pair: StreamPair) -> None:
        err_stream, data = streams.pop(pair.error_stream), streams.pop(pair.data_stream)
        active.add(pair.request_id)
        try:
            try:
                reader, writer = await pod.dial(pair.port)
            except (TimeoutError, OSError) as err:
                text = dial_error_text(port=pair.port, pod=pod.name, uid=pod.uid, reason=_reason(err))
                with contextlib.suppress(Exception):
                    await err_stream.write(text.encode())
                data.close()
                return
            await relay(data, reader, writer)
        finally:
            active.discard(pair.request_id)
            err_stream.close()
            data.close()
            wake.set()

    async def pairs(tg: asyncio.TaskGroup) -> None:
        while True:
            pair = await pair_ready.get()
            tg.create_task(forward(pair))

    async def timers() -> None:
        while True:
            wake.clear()
            now = conn.clock.now()
            for late in pairer.expire(now):
                for sid in (late.error_stream, late.data_stream):
                    stream = streams.pop(sid, None) if sid is not None else None
                    if stream is None:
                        continue
                    if sid == late.error_stream:
                        with contextlib.suppress(Exception):
                            await stream.write(late.text.encode())
                    stream.close()
            if not active and not pairer.pending and now - conn.last_activity_s >= idle_timeout_s:
                await conn.aclose()
                return
            deadline = pairer.next_deadline()
            idle_at = conn.last_activity_s + idle_timeout_s
            until = min(idle_at, deadline) if deadline is not None else idle_at
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), max(0.01, until - now))

    async def stopper() -> None:
        if stop is None:
            await asyncio.Event().wait()
        else:
            await stop.wait()
        await conn.aclose()

    async with asyncio.TaskGroup() as tg:
        helpers = [tg.create_task(pairs(tg)), tg.create_task(timers()), tg.create_task(stopper())]
        await conn.run()
        for task in helpers:
            task.cancel()

