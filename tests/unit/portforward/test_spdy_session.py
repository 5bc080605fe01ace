"""The sans-IO SPDY/3.1 session: streams, half-close, resets, pings, GOAWAY and flow control."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.errors import ProtocolError
from kproxy.portforward.frames import DataFrame, HeaderCodec, SynStreamFrame, encode
from kproxy.portforward.session import (
    DataReceived,
    Event,
    GoAwayReceived,
    PingAcked,
    PingReceived,
    Role,
    SpdySession,
    StreamOpened,
    StreamReplied,
    StreamReset,
    StreamState,
    WindowOpened,
)


def pump(a: SpdySession, b: SpdySession) -> tuple[list[Event], list[Event]]:
    """Move bytes both ways until quiet; returns (events at a, events at b)."""
    ea: list[Event] = []
    eb: list[Event] = []
    for _ in range(50):
        out_a, out_b = a.data_to_send(), b.data_to_send()
        if not out_a and not out_b:
            return ea, eb
        eb += b.receive_data(out_a)
        ea += a.receive_data(out_b)
    raise AssertionError("sessions never went quiet")


def pair(**kw: int) -> tuple[SpdySession, SpdySession]:
    client, server = SpdySession(Role.CLIENT, **kw), SpdySession(Role.SERVER, **kw)
    pump(client, server)
    return client, server


def test_stream_open_reply_data_and_half_close_both_ways() -> None:
    """A stream carries data both ways and closes one half at a time, then is forgotten."""
    client, server = pair()
    sid = client.open_stream((("port", "80"),))
    _, ev = pump(client, server)
    assert ev == [StreamOpened(stream_id=sid, headers=(("port", "80"),), fin=False)]
    server.reply(sid)
    client.send_data(sid, b"ping", fin=True)
    ec, es = pump(client, server)
    assert StreamReplied(stream_id=sid, headers=(), fin=False) in ec
    assert es == [DataReceived(stream_id=sid, data=b"ping", fin=True)]
    assert client.state(sid) is StreamState.HALF_CLOSED_LOCAL
    assert server.state(sid) is StreamState.HALF_CLOSED_REMOTE
    server.send_data(sid, b"pong")
    server.close_stream(sid)
    ec, _ = pump(client, server)
    assert [e for e in ec if isinstance(e, DataReceived)] == [
        DataReceived(stream_id=sid, data=b"pong", fin=False), DataReceived(stream_id=sid, data=b"", fin=True)]
    assert client.open_streams() == () and server.open_streams() == ()


def test_client_ids_are_odd_and_server_ids_even() -> None:
    """Each side opens ids of its own parity, increasing by two."""
    client, server = pair()
    assert [client.open_stream(()) for _ in range(3)] == [1, 3, 5]
    assert [server.open_stream(()) for _ in range(2)] == [2, 4]


def test_reset_ends_both_halves_and_reaches_the_peer() -> None:
    """RST_STREAM closes the stream on both ends and the peer sees StreamReset(remote=True)."""
    client, server = pair()
    sid = client.open_stream(())
    pump(client, server)
    server.reset_stream(sid, 5)
    ec, _ = pump(client, server)
    assert ec == [StreamReset(stream_id=sid, status=5, remote=True)]
    assert client.state(sid) is StreamState.CLOSED
    with pytest.raises(ProtocolError):
        client.send_data(sid, b"late")


def test_ping_is_echoed_and_acked() -> None:
    """A client ping is echoed by the server and acknowledged at the client."""
    client, server = pair()
    pid = client.ping()
    ec, es = pump(client, server)
    assert pid % 2 == 1
    assert es == [PingReceived(ping_id=pid)]
    assert ec == [PingAcked(ping_id=pid)]
    assert not client.pings_outstanding


def test_goaway_refuses_new_streams_both_ways() -> None:
    """After GOAWAY neither side opens a stream; the peer learns the last good id."""
    client, server = pair()
    sid = client.open_stream(())
    pump(client, server)
    server.goaway()
    ec, _ = pump(client, server)
    assert ec == [GoAwayReceived(last_good_stream_id=sid, status=0)]
    with pytest.raises(ProtocolError, match="GOAWAY"):
        client.open_stream(())


def test_slow_reader_stalls_only_its_own_stream() -> None:
    """With stream windows exhausted on one unread stream, another stream still flows."""
    client, server = pair(initial_window=1000)
    slow, fast = client.open_stream(()), client.open_stream(())
    pump(client, server)
    server.reply(slow)
    server.reply(fast)
    pump(client, server)
    assert client.peer_flow_control
    client.send_data(slow, b"x" * 1000)
    assert client.sendable(slow) == 0
    for _ in range(20):  # the fast stream's reader consumes everything it gets
        n = client.sendable(fast)
        assert n > 0
        client.send_data(fast, b"y" * n)
        _, es = pump(client, server)
        got = sum(len(e.data) for e in es if isinstance(e, DataReceived) and e.stream_id == fast)
        server.consumed(fast, got)
        pump(client, server)
    assert client.sendable(slow) == 0
    server.consumed(slow, 1000)
    ec, _ = pump(client, server)
    assert WindowOpened(stream_id=slow) in ec
    assert client.sendable(slow) == 1000


def test_overrunning_a_stream_window_resets_that_stream_only() -> None:
    """A flow-controlled peer that sends past the window gets FLOW_CONTROL_ERROR on that stream."""
    client, server = pair(initial_window=100)
    sid = client.open_stream(())
    other = client.open_stream(())
    pump(client, server)
    rogue = encode(DataFrame(stream_id=sid, data=b"z" * 101), HeaderCodec())
    events = server.receive_data(rogue)
    assert events == [StreamReset(stream_id=sid, status=7, remote=False)]
    assert server.state(other) is StreamState.OPEN


def test_peer_without_flow_control_is_not_limited_by_windows() -> None:
    """A spdystream-like peer (no SETTINGS, no WINDOW_UPDATE) may send past our window, and we
    send to it without waiting for window updates."""
    server = SpdySession(Role.SERVER, initial_window=100)
    server.data_to_send()
    codec = HeaderCodec()
    wire = encode(SynStreamFrame(stream_id=1, headers=()), codec) + encode(
        DataFrame(stream_id=1, data=b"q" * 5000), codec)
    events = server.receive_data(wire)
    assert DataReceived(stream_id=1, data=b"q" * 5000, fin=False) in events
    server.reply(1)
    assert server.sendable(1) >= 1 << 30
    server.send_data(1, b"r" * 200_000)
    assert len(server.data_to_send()) > 200_000


@settings(max_examples=40)
@given(st.lists(st.binary(min_size=0, max_size=3000), min_size=1, max_size=12), st.integers(256, 5000))
def test_windowed_transfer_delivers_every_byte_in_order(chunks: list[bytes], window: int) -> None:
    """Under any window, sending what sendable() allows delivers the bytes intact and in order."""
    client, server = pair(initial_window=window)
    sid = client.open_stream(())
    pump(client, server)
    server.reply(sid)
    pump(client, server)
    payload = b"".join(chunks)
    sent = 0
    got = bytearray()
    for _ in range(10_000):
        if sent == len(payload):
            break
        n = min(client.sendable(sid), len(payload) - sent)
        if n:
            client.send_data(sid, payload[sent:sent + n])
            sent += n
        _, es = pump(client, server)
        for e in es:
            if isinstance(e, DataReceived):
                got += e.data
                server.consumed(sid, len(e.data))
        pump(client, server)
    client.close_stream(sid)
    _, es = pump(client, server)
    got += b"".join(e.data for e in es if isinstance(e, DataReceived))
    assert bytes(got) == payload


def test_syn_stream_with_wrong_parity_is_a_protocol_error() -> None:
    """A client that opens an even stream id breaks the protocol; a GOAWAY is queued."""
    server = SpdySession(Role.SERVER)
    with pytest.raises(ProtocolError):
        server.receive_data(encode(SynStreamFrame(stream_id=2, headers=()), HeaderCodec()))
    assert server.goaway_sent
