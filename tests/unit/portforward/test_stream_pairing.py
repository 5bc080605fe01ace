"""The portforward.k8s.io stream protocol: pairing by requestID, header checks, the creation timeout."""

from __future__ import annotations

from kproxy.portforward.protocol import (
    Rejected,
    StreamPair,
    StreamPairer,
    StreamType,
    TimedOut,
    dial_error_text,
    stream_headers,
)


def test_error_and_data_streams_pair_by_request_id_in_any_order() -> None:
    """Two interleaved requests pair by requestID, whichever stream comes first."""
    p = StreamPairer()
    assert p.add(1, stream_headers(StreamType.ERROR, 80, 0), 0.0) is None
    assert p.add(3, stream_headers(StreamType.DATA, 81, 1), 0.0) is None
    assert p.add(5, stream_headers(StreamType.ERROR, 81, 1), 0.0) == StreamPair(
        request_id="1", port=81, error_stream=5, data_stream=3)
    assert p.add(7, stream_headers(StreamType.DATA, 80, 0), 0.0) == StreamPair(
        request_id="0", port=80, error_stream=1, data_stream=7)
    assert p.pending == {}


def test_bad_port_and_stream_type_are_rejected() -> None:
    """Ports outside 1-65535, a missing port and unknown stream types are rejected with kubelet's words."""
    p = StreamPairer()
    bad_port = p.add(1, (("streamtype", "data"), ("port", "0"), ("requestid", "0")), 0.0)
    assert isinstance(bad_port, Rejected) and "between 1 and 65535" in bad_port.text
    no_port = p.add(3, (("streamtype", "data"), ("requestid", "1")), 0.0)
    assert isinstance(no_port, Rejected) and "port header is required" in no_port.text
    odd_type = p.add(5, (("streamType", "stdin"), ("port", "80")), 0.0)
    assert isinstance(odd_type, Rejected) and "invalid stream type" in odd_type.text


def test_duplicate_stream_type_is_rejected() -> None:
    """A second error stream for one requestID is 'error stream already assigned'."""
    p = StreamPairer()
    p.add(1, stream_headers(StreamType.ERROR, 80, 9), 0.0)
    dup = p.add(3, stream_headers(StreamType.ERROR, 80, 9), 0.0)
    assert dup == Rejected(stream_id=3, text="error stream already assigned")


def test_incomplete_pair_times_out_after_thirty_seconds() -> None:
    """A pair missing its data stream expires at the creation timeout with kubelet's text."""
    p = StreamPairer()
    p.add(1, stream_headers(StreamType.ERROR, 80, 0), 100.0)
    assert p.next_deadline() == 130.0
    assert p.expire(129.9) == []
    assert p.expire(130.0) == [TimedOut(request_id="0", error_stream=1, data_stream=None)]
    assert p.next_deadline() is None


def test_missing_request_id_is_derived_from_stream_ids() -> None:
    """Without requestID the data stream pairs with the error stream two ids below (old clients)."""
    p = StreamPairer()
    assert p.add(1, (("streamtype", "error"), ("port", "80")), 0.0) is None
    assert p.add(3, (("streamtype", "data"), ("port", "80")), 0.0) == StreamPair(
        request_id="1", port=80, error_stream=1, data_stream=3)


def test_dial_error_text_is_kubelets() -> None:
    """The failure text has kubelet's shape: port, pod, uid, reason."""
    assert dial_error_text(port=80, pod="web", uid="u1", reason="connection refused") == (
        "error forwarding port 80 to pod web, uid u1: connection refused")
