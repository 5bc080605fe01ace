"""SPDY/3.1 frames: values, their encoding, and an incremental parser (sans-IO).

Theory of operation
-------------------
A SPDY frame is an 8-byte header and a payload (draft-mbelshe-httpbis-spdy-00 §2.2). A control
frame starts with the bit C=1, a 15-bit version (3) and a 16-bit type; a DATA frame starts with
C=0 and a 31-bit stream id. Both end the header with 8 bits of flags and a 24-bit length.
:class:`FrameParser` takes bytes in any split (one byte at a time, or many frames at once) and
yields whole frames; :func:`encode` turns a frame back into bytes. Header blocks (SYN_STREAM,
SYN_REPLY, HEADERS) are zlib streams that share one compression context per direction for the
life of the connection, primed with SPDY's dictionary (:mod:`kproxy.portforward.dictionary`), and
each block ends with a sync flush, as moby/spdystream's ``spdy/write.go`` writes them.

Versions: Kubernetes' peers (moby/spdystream) write version 3 in every control frame and accept
3; SPDY/3.1 differs from 3 only in session flow control (WINDOW_UPDATE on stream 0), which is
handled by :mod:`kproxy.portforward.session`.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from kproxy.errors import ProtocolError
from kproxy.portforward.dictionary import SPDY3_DICTIONARY

__all__ = [
    "MAX_FRAME_LENGTH",
    "SPDY_VERSION",
    "DataFrame",
    "Frame",
    "FrameParser",
    "FrameType",
    "GoAwayFrame",
    "GoAwayStatus",
    "HeaderCodec",
    "HeadersFrame",
    "PingFrame",
    "RstStatus",
    "RstStreamFrame",
    "SettingId",
    "SettingsFrame",
    "SynReplyFrame",
    "SynStreamFrame",
    "WindowUpdateFrame",
    "data_header",
    "encode",
]

SPDY_VERSION = 3
# The 24-bit length field's limit (§2.2); a longer payload cannot be framed at all.
MAX_FRAME_LENGTH = (1 << 24) - 1
# A decompressed header block above this is refused (spdystream has no limit; 1 MiB is far
# above what port-forward sends, three short headers, and bounds a zlib bomb).
MAX_HEADER_BLOCK = 1 << 20
_STREAM_ID_MASK = 0x7FFFFFFF
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02


class FrameType(enum.IntEnum):
    """Control frame types (§2.6)."""

    SYN_STREAM = 1
    SYN_REPLY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PING = 6
    GOAWAY = 7
    HEADERS = 8
    WINDOW_UPDATE = 9


class RstStatus(enum.IntEnum):
    """RST_STREAM status codes (§2.6.3)."""

    PROTOCOL_ERROR = 1
    INVALID_STREAM = 2
    REFUSED_STREAM = 3
    UNSUPPORTED_VERSION = 4
    CANCEL = 5
    INTERNAL_ERROR = 6
    FLOW_CONTROL_ERROR = 7
    STREAM_IN_USE = 8
    STREAM_ALREADY_CLOSED = 9
    FRAME_TOO_LARGE = 11


class GoAwayStatus(enum.IntEnum):
    """GOAWAY status codes (§2.6.6)."""

    OK = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2


class SettingId(enum.IntEnum):
    """The SETTINGS ids this implementation reads (§2.6.4); others are ignored."""

    MAX_CONCURRENT_STREAMS = 4
    INITIAL_WINDOW_SIZE = 7


Headers = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class DataFrame:
    """DATA (§2.2.2): ``data`` for ``stream_id``; ``fin`` half-closes the sender's side."""

    stream_id: int
    data: bytes
    fin: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SynStreamFrame:
    """SYN_STREAM (§2.6.1): opens ``stream_id`` with ``headers`` (lower-case names)."""

    stream_id: int
    headers: Headers
    associated_to: int = 0
    priority: int = 0
    fin: bool = False
    unidirectional: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SynReplyFrame:
    """SYN_REPLY (§2.6.2): accepts ``stream_id``."""

    stream_id: int
    headers: Headers = ()
    fin: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadersFrame:
    """HEADERS (§2.6.7): more headers on an open stream."""

    stream_id: int
    headers: Headers = ()
    fin: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RstStreamFrame:
    """RST_STREAM (§2.6.3): ends ``stream_id`` abnormally, both ways."""

    stream_id: int
    status: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SettingsFrame:
    """SETTINGS (§2.6.4): ``values`` maps setting id to value (unsigned 32-bit)."""

    values: tuple[tuple[int, int], ...] = ()
    clear: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PingFrame:
    """PING (§2.6.5): the receiver echoes an id of the other parity (odd ids are the client's)."""

    ping_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GoAwayFrame:
    """GOAWAY (§2.6.6): no stream above ``last_good_stream_id`` will be processed."""

    last_good_stream_id: int
    status: int = GoAwayStatus.OK


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowUpdateFrame:
    """WINDOW_UPDATE (§2.6.8): ``delta`` more bytes may be sent; stream 0 is the session (3.1)."""

    stream_id: int
    delta: int


Frame = (DataFrame | SynStreamFrame | SynReplyFrame | HeadersFrame | RstStreamFrame | SettingsFrame
         | PingFrame | GoAwayFrame | WindowUpdateFrame)


class HeaderCodec:
    """One direction's header compression contexts: a compressor for what we send, a
    decompressor for what we receive, both primed with SPDY/3's dictionary (§2.6.10.1).

    The contexts live as long as the connection; blocks must be encoded and decoded in frame
    order (the parser and :func:`encode` do that when called in order).
    """

    __slots__ = ("_compress", "_decompress")

    def __init__(self) -> None:
        # Level 9 and a sync flush per block, as spdystream (compress/zlib BestCompression).
        self._compress = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY,
                                          SPDY3_DICTIONARY)
        self._decompress = zlib.decompressobj(zlib.MAX_WBITS, zdict=SPDY3_DICTIONARY)

    def encode_block(self, headers: Headers) -> bytes:
        """The compressed name/value block for ``headers`` (names lower-cased, §2.6.10)."""
        parts = [struct.pack(">I", len(headers))]
        for name, value in headers:
            raw_name = name.lower().encode("utf-8")
            raw_value = value.encode("utf-8")
            parts.append(struct.pack(">I", len(raw_name)) + raw_name)
            parts.append(struct.pack(">I", len(raw_value)) + raw_value)
        plain = b"".join(parts)
        return self._compress.compress(plain) + self._compress.flush(zlib.Z_SYNC_FLUSH)

    def decode_block(self, block: bytes, *, stream_id: int) -> Headers:
        """The headers of one compressed block.

        Raises:
            ProtocolError: the block does not inflate, is truncated or too large (status
                PROTOCOL_ERROR), or repeats a name.
        """
        try:
            plain = self._decompress.decompress(block, MAX_HEADER_BLOCK)
        except zlib.error as err:
            raise ProtocolError(f"stream {stream_id}: header block does not inflate: {err}") from err
        if self._decompress.unconsumed_tail:
            raise ProtocolError(f"stream {stream_id}: header block above {MAX_HEADER_BLOCK} bytes")
        return _parse_block(plain, stream_id)


def _parse_block(plain: bytes, stream_id: int) -> Headers:
    if len(plain) < 4:
        raise ProtocolError(f"stream {stream_id}: header block of {len(plain)} bytes has no count")
    (count,) = struct.unpack_from(">I", plain, 0)
    pos = 4
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for _ in range(count):
        name, pos = _read_string(plain, pos, stream_id)
        value, pos = _read_string(plain, pos, stream_id)
        if name in seen:
            raise ProtocolError(f"stream {stream_id}: header {name!r} appears twice")
        seen.add(name)
        out.append((name.lower(), value))
    if pos != len(plain):
        raise ProtocolError(f"stream {stream_id}: {len(plain) - pos} stray bytes after the headers")
    return tuple(out)


def _read_string(buf: bytes, pos: int, stream_id: int) -> tuple[str, int]:
    if pos + 4 > len(buf):
        raise ProtocolError(f"stream {stream_id}: header block truncated at byte {pos}")
    (length,) = struct.unpack_from(">I", buf, pos)
    end = pos + 4 + length
    if end > len(buf):
        raise ProtocolError(f"stream {stream_id}: header of {length} bytes runs past the block")
    return buf[pos + 4:end].decode("utf-8", "replace"), end


def _control(ftype: FrameType, flags: int, payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME_LENGTH:
        raise ProtocolError(f"{ftype.name} payload of {len(payload)} bytes exceeds {MAX_FRAME_LENGTH}")
    return struct.pack(">HHI", 0x8000 | SPDY_VERSION, ftype, (flags << 24) | len(payload)) + payload


def data_header(stream_id: int, length: int, *, fin: bool = False) -> bytes:
    """The 8-byte header of a DATA frame of ``length`` bytes (the payload follows it unchanged,
    so a sender can queue header and payload without joining them).

    Raises:
        ProtocolError: ``length`` does not fit the 24-bit length field.
    """
    if length > MAX_FRAME_LENGTH:
        raise ProtocolError(f"DATA of {length} bytes exceeds {MAX_FRAME_LENGTH}")
    return struct.pack(">II", stream_id & _STREAM_ID_MASK, ((FLAG_FIN if fin else 0) << 24) | length)


def encode(frame: Frame, codec: HeaderCodec) -> bytes:
    """The wire bytes of ``frame``; header blocks are compressed with ``codec`` (in order).

    Raises:
        ProtocolError: a payload longer than the 24-bit length field allows.
    """
    match frame:
        case DataFrame(stream_id=sid, data=data, fin=fin):
            if len(data) > MAX_FRAME_LENGTH:
                raise ProtocolError(f"DATA of {len(data)} bytes exceeds {MAX_FRAME_LENGTH}")
            flags = FLAG_FIN if fin else 0
            return struct.pack(">II", sid & _STREAM_ID_MASK, (flags << 24) | len(data)) + data
        case SynStreamFrame():
            flags = (FLAG_FIN if frame.fin else 0) | (FLAG_UNIDIRECTIONAL if frame.unidirectional else 0)
            head = struct.pack(">IIBB", frame.stream_id & _STREAM_ID_MASK,
                               frame.associated_to & _STREAM_ID_MASK, (frame.priority & 7) << 5, 0)
            return _control(FrameType.SYN_STREAM, flags, head + codec.encode_block(frame.headers))
        case SynReplyFrame(stream_id=sid, headers=headers, fin=fin):
            body = struct.pack(">I", sid & _STREAM_ID_MASK) + codec.encode_block(headers)
            return _control(FrameType.SYN_REPLY, FLAG_FIN if fin else 0, body)
        case HeadersFrame(stream_id=sid, headers=headers, fin=fin):
            body = struct.pack(">I", sid & _STREAM_ID_MASK) + codec.encode_block(headers)
            return _control(FrameType.HEADERS, FLAG_FIN if fin else 0, body)
        case RstStreamFrame(stream_id=sid, status=status):
            return _control(FrameType.RST_STREAM, 0, struct.pack(">II", sid & _STREAM_ID_MASK, status))
        case SettingsFrame(values=values, clear=clear):
            body = struct.pack(">I", len(values)) + b"".join(
                struct.pack(">II", key & 0xFFFFFF, value) for key, value in values)
            return _control(FrameType.SETTINGS, 1 if clear else 0, body)
        case PingFrame(ping_id=pid):
            return _control(FrameType.PING, 0, struct.pack(">I", pid))
        case GoAwayFrame(last_good_stream_id=last, status=status):
            return _control(FrameType.GOAWAY, 0, struct.pack(">II", last & _STREAM_ID_MASK, status))
        case WindowUpdateFrame(stream_id=sid, delta=delta):
            return _control(FrameType.WINDOW_UPDATE, 0,
                            struct.pack(">II", sid & _STREAM_ID_MASK, delta & _STREAM_ID_MASK))
    raise ProtocolError(f"not a SPDY frame: {frame!r}")  # pragma: no cover - exhaustive above


class FrameParser:
    """Bytes in, frames out, in any split (sans-IO).

    ``feed(data)`` buffers; iterating :meth:`frames` yields every whole frame buffered so far.
    Unknown control types (NOOP, CREDENTIAL, future ones) are skipped, as §2.2.1 asks.

    Raises (from :meth:`frames`):
        ProtocolError: a control frame of another version, a malformed payload, or a header
            block that does not inflate; the connection cannot continue after it.
    """

    __slots__ = ("_buf", "_codec")

    def __init__(self, codec: HeaderCodec) -> None:
        self._buf = bytearray()
        self._codec = codec

    def feed(self, data: bytes) -> None:
        """Buffer ``data`` (any length, including empty)."""
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buf)

    def frames(self) -> Iterator[Frame]:
        """Every whole frame in the buffer, in order; the partial rest stays buffered."""
        buf = self._buf
        pos, end = 0, len(buf)
        try:
            while end - pos >= 8:
                word, flags_len = struct.unpack_from(">II", buf, pos)
                length = flags_len & 0xFFFFFF
                if end - pos < 8 + length:
                    return
                flags = flags_len >> 24
                payload = bytes(buf[pos + 8:pos + 8 + length])
                pos += 8 + length
                frame = self._frame(word, flags, payload)
                if frame is not None:
                    yield frame
        finally:
            # One compaction per call, not one per frame: a memmove of the rest each time
            # made large reads quadratic.
            del buf[:pos]

    def _frame(self, word: int, flags: int, payload: bytes) -> Frame | None:
        if not word & 0x80000000:
            return DataFrame(stream_id=word & _STREAM_ID_MASK, data=payload, fin=bool(flags & FLAG_FIN))
        version = (word >> 16) & 0x7FFF
        if version != SPDY_VERSION:
            raise ProtocolError(f"control frame of SPDY version {version}, expected {SPDY_VERSION}",
                                status=RstStatus.UNSUPPORTED_VERSION)
        return self._control(word & 0xFFFF, flags, payload)

    def _control(self, ftype: int, flags: int, p: bytes) -> Frame | None:
        fin = bool(flags & FLAG_FIN)
        try:
            if ftype == FrameType.SYN_STREAM:
                sid, assoc, pri = struct.unpack_from(">IIB", p, 0)
                sid &= _STREAM_ID_MASK
                return SynStreamFrame(stream_id=sid, associated_to=assoc & _STREAM_ID_MASK,
                                      priority=pri >> 5, fin=fin,
                                      unidirectional=bool(flags & FLAG_UNIDIRECTIONAL),
                                      headers=self._codec.decode_block(p[10:], stream_id=sid))
            if ftype in (FrameType.SYN_REPLY, FrameType.HEADERS):
                (sid,) = struct.unpack_from(">I", p, 0)
                sid &= _STREAM_ID_MASK
                headers = self._codec.decode_block(p[4:], stream_id=sid)
                if ftype == FrameType.SYN_REPLY:
                    return SynReplyFrame(stream_id=sid, headers=headers, fin=fin)
                return HeadersFrame(stream_id=sid, headers=headers, fin=fin)
            if ftype == FrameType.RST_STREAM:
                sid, status = struct.unpack_from(">II", p, 0)
                return RstStreamFrame(stream_id=sid & _STREAM_ID_MASK, status=status)
            if ftype == FrameType.SETTINGS:
                (count,) = struct.unpack_from(">I", p, 0)
                if len(p) != 4 + 8 * count:
                    raise ProtocolError(f"SETTINGS of {len(p)} bytes for {count} entries")
                values = tuple((key & 0xFFFFFF, value)
                               for key, value in struct.iter_unpack(">II", p[4:]))
                return SettingsFrame(values=values, clear=bool(flags & 1))
            if ftype == FrameType.PING:
                (pid,) = struct.unpack_from(">I", p, 0)
                return PingFrame(ping_id=pid)
            if ftype == FrameType.GOAWAY:
                last, status = struct.unpack_from(">II", p, 0)
                return GoAwayFrame(last_good_stream_id=last & _STREAM_ID_MASK, status=status)
            if ftype == FrameType.WINDOW_UPDATE:
                sid, delta = struct.unpack_from(">II", p, 0)
                return WindowUpdateFrame(stream_id=sid & _STREAM_ID_MASK, delta=delta & _STREAM_ID_MASK)
        except struct.error as err:
            raise ProtocolError(f"control frame type {ftype} of {len(p)} bytes is too short") from err
        return None
