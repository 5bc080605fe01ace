"""The asyncio shell over real sockets: pings, the stream-creation timeout, the idle timeout,
rejected streams, and a dial refused by the pod."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from kproxy.portforward.bridge import dial_loopback
from kproxy.portforward.connection import SpdyConnection, StreamChannel
from kproxy.portforward.protocol import StreamType, stream_headers
from kproxy.portforward.server import PodTarget, serve_portforward
from kproxy.portforward.session import Role


@contextlib.asynccontextmanager
async def linked(**serve_kw: float) -> AsyncIterator[tuple[SpdyConnection, asyncio.Task[None]]]:
    """A client connection to serve_portforward over a loopback TCP pair; yields (client, server task)."""
    accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
        asyncio.get_running_loop().create_future())
    listener = await asyncio.start_server(lambda r, w: accepted.set_result((r, w)), "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    s_reader, s_writer = await accepted
    server = SpdyConnection(StreamChannel(s_reader, s_writer), Role.SERVER)
    pod = PodTarget(name="web-0", uid="u-1", dial=dial_loopback("127.0.0.1"))
    server_task = asyncio.ensure_future(serve_portforward(server, pod, **serve_kw))
    client = SpdyConnection(StreamChannel(reader, writer), Role.CLIENT)
    client_task = asyncio.ensure_future(client.run())
    try:
        yield client, server_task
    finally:
        await client.aclose()
        await asyncio.wait_for(asyncio.gather(client_task, server_task, return_exceptions=True), 5)
        listener.close()


async def test_ping_round_trip_over_a_socket() -> None:
    """A client PING is echoed by the server end and measured in seconds."""
    async with linked() as (client, _):
        rtt = await asyncio.wait_for(client.ping(), 5)
        assert 0 <= rtt < 5


async def test_incomplete_pair_gets_the_creation_timeout_text() -> None:
    """An error stream whose data stream never comes gets 'timed out waiting for streams'."""
    async with linked(creation_timeout_s=0.2) as (client, _):
        err = await client.open_stream(stream_headers(StreamType.ERROR, 80, 0))
        err.close()
        text = await asyncio.wait_for(err.read_all(), 5)
        assert text == b"timed out waiting for streams"


async def test_idle_connection_is_closed_after_the_idle_timeout() -> None:
    """With no stream and no frame for the idle timeout the server closes the connection."""
    async with linked(idle_timeout_s=0.3) as (client, server_task):
        await asyncio.wait_for(server_task, 5)
        for _ in range(100):
            if client.closed:
                break
            await asyncio.sleep(0.02)
        assert client.closed


async def test_stream_with_a_bad_port_is_reset() -> None:
    """A data stream naming port 0 is reset by the server; the connection stays usable."""
    async with linked() as (client, _):
        bad = await client.open_stream((("streamtype", "data"), ("port", "0"), ("requestid", "1")),
                                       wait_reply=False)
        assert await asyncio.wait_for(bad.read(), 5) == b""
        assert bad.reset_status is not None
        assert await asyncio.wait_for(client.ping(), 5) >= 0


async def test_refused_dial_writes_kubelets_text_and_ends_the_data_stream() -> None:
    """A pod port with nothing listening: the error stream carries kubelet's text, the data stream ends."""
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    async with linked() as (client, _):
        err = await client.open_stream(stream_headers(StreamType.ERROR, port, 7))
        err.close()
        data = await client.open_stream(stream_headers(StreamType.DATA, port, 7))
        text = (await asyncio.wait_for(err.read_all(), 5)).decode()
        assert text.startswith(f"error forwarding port {port} to pod web-0, uid u-1: ")
        assert f"dial tcp 127.0.0.1:{port}: connect: connection refused" in text
        assert await asyncio.wait_for(data.read(), 5) == b""
