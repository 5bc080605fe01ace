"""The server end of the older WebSocket port-forward protocol, ``v4.channel.k8s.io``.

Theory of operation
-------------------
As the kubelet's ``pkg/kubelet/cri/streaming/portforward/websocket.go`` serves it: the ports
come in the query (``?ports=8080&ports=9090``, comma lists too); port *i* has data channel
``2i`` and error channel ``2i+1``. Every binary message starts with its channel byte. Right after
the upgrade the server writes, on both channels of every port, the port as two little-endian
bytes. Each port gets one connection to the Pod (dialled at once); client messages on a data
channel go to it, its bytes come back on that channel, and a failed dial is written as text on
the error channel. There is no half-close in v4: the forward ends when the WebSocket closes or
every Pod connection has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Sequence

from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from kproxy.errors import ProtocolError
from kproxy.portforward.bridge import Dialer
from kproxy.portforward.connection import READ_CHUNK
from kproxy.portforward.protocol import dial_error_text

__all__ = ["V4_PROTOCOLS", "parse_ports", "serve_v4"]

V4_PROTOCOLS = ("v4.channel.k8s.io", "")


def parse_ports(values: Sequence[str]) -> tuple[int, ...]:
    """The ``ports`` query values (repeated and/or comma-separated) as port numbers.

    Raises:
        ProtocolError: none given, or one that is not an integer 1-65535 (the kubelet's 400).
    """
    ports = []
    for value in values:
        for word in (w.strip() for w in value.split(",") if w.strip()):
            if not word.isdigit() or not 1 <= int(word) <= 65535:
                raise ProtocolError(f"unable to parse {word!r} as a port: must be between 1 and 65535")
            ports.append(int(word))
    if not ports:
        raise ProtocolError("query parameter \"ports\" is required")
    return tuple(ports)


async def serve_v4(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initial: bytes,
                   ports: Sequence[int], dial: Dialer, *, pod: str, uid: str,
                   stop: asyncio.Event | None = None) -> None:
    """Serve one ``v4.channel.k8s.io`` WebSocket (already upgraded) until it or the Pod's
    connections end, or ``stop`` is set."""
    ws = Protocol(Side.SERVER, state=State.OPEN, max_size=None)
    if initial:
        ws.receive_data(initial)

    def flush() -> None:
        for data in ws.data_to_send():
            if data and not writer.is_closing():
                writer.write(data)

    def send(channel: int, payload: bytes) -> None:
        if ws.state is State.OPEN:
            ws.send_binary(bytes([channel]) + payload)
            flush()

    # Every port is dialled before the prefixes go out, so no client byte arrives for a port
    # whose connection is not there yet.
    dialled = await asyncio.gather(*(dial(port) for port in ports), return_exceptions=True)
    for i, port in enumerate(ports):
        send(2 * i, struct.pack("<H", port))
        send(2 * i + 1, struct.pack("<H", port))
    conns: dict[int, asyncio.StreamWriter] = {}
    for i, result in enumerate(dialled):
        if isinstance(result, tuple):
            conns[i] = result[1]

    async def pod_to_ws(i: int) -> None:
        result = dialled[i]
        if not isinstance(result, tuple):
            err = result
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            send(2 * i + 1, dial_error_text(port=ports[i], pod=pod, uid=uid, reason=reason).encode())
            return
        r, w = result
        with contextlib.suppress(ConnectionError, OSError):
            while data := await r.read(READ_CHUNK):
                send(2 * i, data)
                await writer.drain()
        w.close()

    async def ws_to_pod() -> None:
        message = bytearray()
        while ws.state is State.OPEN:
            for event in ws.events_received():
                if not isinstance(event, Frame) or event.opcode not in (Opcode.BINARY, Opcode.CONT):
                    continue
                message += event.data
                if not event.fin:
                    continue
                if message and message[0] % 2 == 0 and message[0] // 2 in conns:
                    target = conns[message[0] // 2]
                    target.write(bytes(message[1:]))
                    with contextlib.suppress(ConnectionError, OSError):
                        await target.drain()
                message.clear()
            flush()
            data = await reader.read(READ_CHUNK)
            if not data:
                ws.receive_eof()
                return
            ws.receive_data(data)

    async def stopper() -> None:
        await (stop.wait() if stop is not None else asyncio.Event().wait())

    try:
        async with asyncio.TaskGroup() as tg:
            pods = [tg.create_task(pod_to_ws(i)) for i in range(len(ports))]
            inbound = tg.create_task(ws_to_pod())
            stopping = tg.create_task(stopper())

            async def all_pods() -> None:
                await asyncio.gather(*pods, return_exceptions=True)

            ended = tg.create_task(all_pods())
            await asyncio.wait([inbound, stopping, ended], return_when=asyncio.FIRST_COMPLETED)
            for task in (*pods, inbound, stopping, ended):
                task.cancel()
    finally:
        for w in conns.values():
            w.close()
        if ws.state is State.OPEN:
            with contextlib.suppress(Exception):
                ws.send_close(1000)
                flush()
        writer.close()
