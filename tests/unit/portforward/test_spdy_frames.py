"""SPDY/3.1 frames: encoding, the incremental parser, header compression with SPDY's dictionary."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kproxy.errors import ProtocolError
from kproxy.portforward.dictionary import SPDY3_DICTIONARY
from kproxy.portforward.frames import (
    DataFrame,
    Frame,
    FrameParser,
    GoAwayFrame,
    HeaderCodec,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    SynReplyFrame,
    SynStreamFrame,
    WindowUpdateFrame,
    encode,
)

_ids = st.integers(min_value=1, max_value=0x7FFFFFFF)
_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12)
_headers = st.lists(st.tuples(_names, st.text(max_size=30)), max_size=5,
                    unique_by=lambda kv: kv[0]).map(tuple)


def frames() -> st.SearchStrategy[Frame]:
    """Every frame type with edge-biased fields."""
    return st.one_of(
        st.builds(DataFrame, stream_id=_ids, data=st.binary(max_size=300), fin=st.booleans()),
        st.builds(SynStreamFrame, stream_id=_ids, headers=_headers, associated_to=st.just(0),
                  priority=st.integers(0, 7), fin=st.booleans(), unidirectional=st.booleans()),
        st.builds(SynReplyFrame, stream_id=_ids, headers=_headers, fin=st.booleans()),
        st.builds(HeadersFrame, stream_id=_ids, headers=_headers, fin=st.booleans()),
        st.builds(RstStreamFrame, stream_id=_ids, status=st.integers(1, 11)),
        st.builds(SettingsFrame, values=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 2**32 - 1)),
                                                 max_size=3).map(tuple)),
        st.builds(PingFrame, ping_id=st.integers(0, 2**32 - 1)),
        st.builds(GoAwayFrame, last_good_stream_id=st.integers(0, 0x7FFFFFFF), status=st.integers(0, 2)),
        st.builds(WindowUpdateFrame, stream_id=st.integers(0, 0x7FFFFFFF), delta=_ids),
    )


def test_dictionary_is_the_drafts_1423_bytes() -> None:
    """The header dictionary has the draft's length and primes zlib so a peer's inflate works."""
    assert len(SPDY3_DICTIONARY) == 1423
    assert SPDY3_DICTIONARY.startswith(b"\x00\x00\x00\x07options")
    assert SPDY3_DICTIONARY.endswith(b",*,enq=0.")
    # A stream compressed with the dictionary names it by its adler32 (RFC 1950 FDICT).
    block = HeaderCodec().encode_block((("port", "80"),))
    assert block[2:6] == zlib.adler32(SPDY3_DICTIONARY).to_bytes(4, "big")


@given(st.lists(frames(), max_size=8), st.data())
def test_frames_round_trip_split_at_any_byte(items: list[Frame], data: st.DataObject) -> None:
    """Frames encoded in order parse back equal, however the bytes are split."""
    sender, receiver = HeaderCodec(), HeaderCodec()
    wire = b"".join(encode(f, sender) for f in items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    parser = FrameParser(receiver)
    out: list[Frame] = []
    last = 0
    for cut in [*cuts, len(wire)]:
        parser.feed(wire[last:cut])
        last = cut
        out.extend(parser.frames())
    assert out == items
    assert parser.buffered == 0


def test_one_byte_at_a_time_yields_a_frame_only_when_complete() -> None:
    """A parser fed one byte at a time yields nothing until the last byte of a frame."""
    wire = encode(DataFrame(stream_id=3, data=b"hello", fin=True), HeaderCodec())
    parser = FrameParser(HeaderCodec())
    seen = []
    for i in range(len(wire)):
        parser.feed(wire[i:i + 1])
        seen.append(list(parser.frames()))
    assert all(not s for s in seen[:-1])
    assert seen[-1] == [DataFrame(stream_id=3, data=b"hello", fin=True)]


def test_control_frame_of_another_version_is_refused() -> None:
    """A control frame of SPDY/2 is a protocol error, not a guess."""
    parser = FrameParser(HeaderCodec())
    parser.feed(bytes([0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1]))
    with pytest.raises(ProtocolError, match="version 2"):
        list(parser.frames())


def test_unknown_control_types_are_skipped() -> None:
    """NOOP (type 5) and unknown types are ignored, as the draft asks; the next frame still parses."""
    codec = HeaderCodec()
    noop = bytes([0x80, 0x03, 0x00, 0x05, 0, 0, 0, 0])
    parser = FrameParser(HeaderCodec())
    parser.feed(noop + encode(PingFrame(ping_id=7), codec))
    assert list(parser.frames()) == [PingFrame(ping_id=7)]


def test_header_block_that_does_not_inflate_is_a_protocol_error() -> None:
    """Garbage in a SYN_STREAM's header block raises ProtocolError naming the stream."""
    payload = (1).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"\x00\x00" + b"not zlib at all"
    parser = FrameParser(HeaderCodec())
    parser.feed(bytes([0x80, 0x03, 0x00, 0x01, 0, 0, 0, len(payload)]) + payload)
    with pytest.raises(ProtocolError, match="stream 1"):
        list(parser.frames())


def test_header_compression_context_spans_frames() -> None:
    """Later header blocks depend on earlier ones (one zlib stream per direction) and still decode."""
    sender, receiver = HeaderCodec(), HeaderCodec()
    hdrs = (("streamtype", "data"), ("port", "8080"), ("requestid", "0"))
    first = sender.encode_block(hdrs)
    second = sender.encode_block(hdrs)
    assert len(second) < len(first)
    assert receiver.decode_block(first, stream_id=1) == hdrs
    assert receiver.decode_block(second, stream_id=3) == hdrs
    with pytest.raises(ProtocolError):
        HeaderCodec().decode_block(second, stream_id=3)
