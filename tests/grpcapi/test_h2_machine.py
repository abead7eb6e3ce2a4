"""The HTTP/2 state machine (``kvserver.api.grpc.h2_machine``), driven with bytes only.

No sockets, no event loop, and a clock the test moves: each test feeds frames to
``H2Machine.receive_data`` and reads the events it returns and the frames it queued
(``data_to_send``). Every test that expects a GOAWAY checks its error code, and every
budget test checks its counter.
"""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest
from hpack import Encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserver.api.grpc import h2
from kvserver.api.grpc.budgets import Http2Limits
from kvserver.api.grpc.h2_events import (
    ConnectionTerminated,
    DataReceived,
    GoAwayReceived,
    InputBudgetExceeded,
    PingAcked,
    RequestReceived,
    StreamEnded,
    StreamReset,
    StreamState,
    WindowOpened,
)
from kvserver.api.grpc.h2_machine import STREAM_WINDOW, H2Machine, H2UsageError
from tests.support.h2frames import frames, goaway_code

REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/etcdserverpb.KV/Put"),
    (":authority", "x"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Peer:
    """A client's side of one machine: frames in, events and the machine's frames out."""

    def __init__(self, *, keepalive_min_time: float = 300.0, **limits: object) -> None:
        self.clock = Clock()
        self.budgets: dict[str, int] = {}
        self.m = H2Machine(
            replace(Http2Limits(), **limits),  # type: ignore[arg-type]
            clock=self.clock,
            budgets=self.budgets,
            keepalive_min_time=keepalive_min_time,
        )
        self.encoder = Encoder()
        self.m.initiate_connection()
        assert self.send(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0)) == []
        self.out = self.m.data_to_send()  # our settings, window update, their ack

    def send(self, data: bytes) -> list:
        return self.m.receive_data(data)

    def block(self, headers: list[tuple[str, str]] | None = None) -> bytes:
        return self.encoder.encode(headers if headers is not None else REQUEST)

    def open(self, sid: int, *, end: bool = False) -> list:
        flags = h2.END_HEADERS | (h2.END_STREAM if end else 0)
        return self.send(h2.frame(h2.HEADERS, flags, sid, self.block()))

    def sent(self) -> list[tuple[int, int, int, bytes]]:
        return frames(self.m.data_to_send())

    def resets(self) -> dict[int, int]:
        return {
            sid: struct.unpack(">I", p)[0] for k, _, sid, p in self.sent() if k == h2.RST_STREAM
        }

    def goaway(self) -> int | None:
        return goaway_code(self.m.data_to_send())


def terminated(events: list, code: int) -> bool:
    return (
        len(events) == 1
        and isinstance(events[0], ConnectionTerminated)
        and events[0].error_code == code
    )


def data(sid: int, payload: bytes, *, end: bool = False, flags: int = 0) -> bytes:
    return h2.frame(h2.DATA, flags | (h2.END_STREAM if end else 0), sid, payload)


# --- stream states (RFC 9113 section 5.1) --------------------------------------------------------


def test_the_states_are_the_rfcs():
    assert [s.value for s in StreamState] == [
        "idle",
        "reserved (local)",
        "reserved (remote)",
        "open",
        "half-closed (local)",
        "half-closed (remote)",
        "closed",
    ]


def test_headers_open_a_stream_and_end_stream_half_closes_it():
    p = Peer()
    assert p.m.stream_state(1) is StreamState.IDLE
    (event,) = p.open(1)
    assert isinstance(event, RequestReceived) and event.stream_id == 1
    assert event.headers == REQUEST and not event.end_stream
    assert p.m.stream_state(1) is StreamState.OPEN
    (event,) = p.send(data(1, b"abc", end=True))
    assert isinstance(event, DataReceived) and event.data == b"abc" and event.end_stream
    assert p.m.stream_state(1) is StreamState.HALF_CLOSED_REMOTE
    (event,) = p.open(3, end=True)
    assert isinstance(event, RequestReceived) and event.end_stream
    assert p.m.stream_state(3) is StreamState.HALF_CLOSED_REMOTE


def test_both_ends_close_a_stream_in_either_order():
    p = Peer()
    p.open(1, end=True)
    assert p.m.send_headers(1, b"\x88")
    assert p.m.send_headers(1, b"\x88", end_stream=True)
    assert p.m.stream_state(1) is StreamState.CLOSED
    p.open(3)
    p.m.send_headers(3, b"\x88", end_stream=True)
    assert p.m.stream_state(3) is StreamState.HALF_CLOSED_LOCAL
    (event,) = p.send(data(3, b"", end=True))
    assert isinstance(event, DataReceived) and event.end_stream
    assert p.m.stream_state(3) is StreamState.CLOSED
    p.open(5)
    p.m.send_headers(5, b"\x88", end_stream=True)
    (event,) = p.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 5, p.block([])))
    assert isinstance(event, StreamEnded)  # the client's trailers
    assert p.m.stream_state(5) is StreamState.CLOSED


def test_an_answer_before_the_request_ends_stops_the_client_without_error():
    p = Peer()
    p.open(1)
    p.m.end_response(1, b"\x88")
    sent = p.sent()
    assert [(k, f & h2.END_STREAM) for k, f, _, _ in sent] == [
        (h2.HEADERS, h2.END_STREAM),
        (h2.RST_STREAM, 0),
    ]
    assert struct.unpack(">I", sent[1][3])[0] == h2.NO_ERROR
    assert p.m.stream_state(1) is StreamState.CLOSED
    assert p.send(data(1, b"late")) == []  # in flight before our reset: dropped


def test_the_peers_reset_closes_the_stream():
    p = Peer()
    p.open(1)
    (event,) = p.send(h2.rst_stream(1, h2.CANCEL))
    assert isinstance(event, StreamReset) and event.remote and event.error_code == h2.CANCEL
    assert p.m.stream_state(1) is StreamState.CLOSED
    assert not p.m.send_headers(1, b"\x88")  # sending on it does nothing
    assert p.send(h2.window_update(1, 10) + h2.rst_stream(1, h2.CANCEL)) == []  # races
    assert p.sent() == []


def test_sending_after_ending_our_side_is_a_usage_error():
    p = Peer()
    p.open(1)
    p.m.send_headers(1, b"\x88", end_stream=True)
    with pytest.raises(H2UsageError):
        p.m.send_headers(1, b"\x88", end_stream=True)
    with pytest.raises(H2UsageError):
        p.m.send_data(1, b"x")


def test_a_stream_id_below_the_last_is_closed_and_an_even_one_idle():
    p = Peer()
    p.open(7)
    assert p.m.stream_state(3) is StreamState.CLOSED  # implicitly closed by opening 7
    assert p.m.stream_state(2) is StreamState.IDLE


# --- frames a state does not allow ----------------------------------------------------------------


def _open1(p: Peer) -> None:
    p.open(1)


def _half_closed1(p: Peer) -> None:
    p.open(1, end=True)


def _closed1(p: Peer) -> None:
    p.open(1, end=True)
    p.m.send_headers(1, b"\x88", end_stream=True)


def _peer_reset1(p: Peer) -> None:
    p.open(1)
    p.send(h2.rst_stream(1, h2.CANCEL))


def _nothing(p: Peer) -> None:
    pass


def _pending_block(p: Peer) -> None:
    p.send(h2.frame(h2.HEADERS, 0, 1, p.block()))


CONNECTION_ERRORS = [
    ("DATA on stream 0", _nothing, data(0, b"x"), h2.PROTOCOL_ERROR),
    ("DATA on an idle stream", _nothing, data(1, b"x"), h2.PROTOCOL_ERROR),
    ("DATA on an even stream", _open1, data(2, b"x"), h2.PROTOCOL_ERROR),
    ("DATA after the peer's reset", _peer_reset1, data(1, b"x"), h2.STREAM_CLOSED),
    ("DATA padded, empty", _open1, data(1, b"", flags=h2.PADDED), h2.FRAME_SIZE_ERROR),
    ("DATA padding too long", _open1, data(1, b"\x05abc", flags=h2.PADDED), h2.PROTOCOL_ERROR),
    (
        "HEADERS on stream 0",
        _nothing,
        h2.frame(h2.HEADERS, h2.END_HEADERS, 0, b"\x82"),
        h2.PROTOCOL_ERROR,
    ),
    (
        "HEADERS on an even stream",
        _nothing,
        h2.frame(h2.HEADERS, h2.END_HEADERS, 2, b"\x82"),
        h2.PROTOCOL_ERROR,
    ),
    (
        "HEADERS on a closed stream",
        _closed1,
        h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\x82"),
        h2.STREAM_CLOSED,
    ),
    (
        "HEADERS padding too long",
        _nothing,
        h2.frame(h2.HEADERS, h2.END_HEADERS | h2.PADDED, 1, b"\x09\x82"),
        h2.PROTOCOL_ERROR,
    ),
    (
        "HEADERS too short for priority",
        _nothing,
        h2.frame(h2.HEADERS, h2.END_HEADERS | h2.PRIORITY_FLAG, 1, b"\x00\x00"),
        h2.FRAME_SIZE_ERROR,
    ),
    (
        "HEADERS depending on itself",
        _nothing,
        h2.frame(h2.HEADERS, h2.END_HEADERS | h2.PRIORITY_FLAG, 1, b"\x00\x00\x00\x01\x10\x82"),
        h2.PROTOCOL_ERROR,
    ),
    (
        "a bad header block",
        _nothing,
        h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\xff\xff\xff\xff\xff"),
        h2.COMPRESSION_ERROR,
    ),
    (
        "CONTINUATION without HEADERS",
        _open1,
        h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, b"\x82"),
        h2.PROTOCOL_ERROR,
    ),
    (
        "CONTINUATION of another stream",
        _pending_block,
        h2.frame(h2.CONTINUATION, h2.END_HEADERS, 3, b""),
        h2.PROTOCOL_ERROR,
    ),
    (
        "a frame inside a header block",
        _pending_block,
        h2.frame(h2.PING, 0, 0, b"12345678"),
        h2.PROTOCOL_ERROR,
    ),
    ("RST_STREAM on stream 0", _nothing, h2.rst_stream(0, h2.CANCEL), h2.PROTOCOL_ERROR),
    ("RST_STREAM on an idle stream", _nothing, h2.rst_stream(1, h2.CANCEL), h2.PROTOCOL_ERROR),
    (
        "RST_STREAM of 3 bytes",
        _open1,
        h2.frame(h2.RST_STREAM, 0, 1, b"\x00\x00\x08"),
        h2.FRAME_SIZE_ERROR,
    ),
    ("WINDOW_UPDATE on an idle stream", _nothing, h2.window_update(1, 10), h2.PROTOCOL_ERROR),
    (
        "WINDOW_UPDATE of 3 bytes",
        _nothing,
        h2.frame(h2.WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"),
        h2.FRAME_SIZE_ERROR,
    ),
    ("WINDOW_UPDATE of 0 on the connection", _nothing, h2.window_update(0, 0), h2.PROTOCOL_ERROR),
    (
        "the connection window past 2^31-1",
        _nothing,
        h2.window_update(0, 2**31 - 1),
        h2.FLOW_CONTROL_ERROR,
    ),
    ("PING on a stream", _open1, h2.frame(h2.PING, 0, 1, b"12345678"), h2.PROTOCOL_ERROR),
    ("PING of 7 bytes", _nothing, h2.frame(h2.PING, 0, 0, b"1234567"), h2.FRAME_SIZE_ERROR),
    ("SETTINGS on a stream", _open1, h2.frame(h2.SETTINGS, 0, 1), h2.PROTOCOL_ERROR),
    (
        "SETTINGS of 5 bytes",
        _nothing,
        h2.frame(h2.SETTINGS, 0, 0, b"\x00" * 5),
        h2.FRAME_SIZE_ERROR,
    ),
    (
        "a SETTINGS ack with a payload",
        _nothing,
        h2.frame(h2.SETTINGS, h2.ACK, 0, b"\x00" * 6),
        h2.FRAME_SIZE_ERROR,
    ),
    (
        "an initial window past 2^31-1",
        _nothing,
        h2.settings_frame({h2.SETTINGS_INITIAL_WINDOW_SIZE: 2**31}),
        h2.FLOW_CONTROL_ERROR,
    ),
    (
        "a max frame size too small",
        _nothing,
        h2.settings_frame({h2.SETTINGS_MAX_FRAME_SIZE: 100}),
        h2.PROTOCOL_ERROR,
    ),
    (
        "ENABLE_PUSH of 2",
        _nothing,
        h2.settings_frame({h2.SETTINGS_ENABLE_PUSH: 2}),
        h2.PROTOCOL_ERROR,
    ),
    (
        "PUSH_PROMISE from a client",
        _open1,
        h2.frame(h2.PUSH_PROMISE, h2.END_HEADERS, 1, b"\x00\x00\x00\x02"),
        h2.PROTOCOL_ERROR,
    ),
    ("PRIORITY on stream 0", _nothing, h2.frame(h2.PRIORITY, 0, 0, b"\x00" * 5), h2.PROTOCOL_ERROR),
    (
        "PRIORITY of 4 bytes",
        _nothing,
        h2.frame(h2.PRIORITY, 0, 1, b"\x00" * 4),
        h2.FRAME_SIZE_ERROR,
    ),
    (
        "PRIORITY depending on itself",
        _nothing,
        h2.frame(h2.PRIORITY, 0, 3, b"\x00\x00\x00\x03\x10"),
        h2.PROTOCOL_ERROR,
    ),
    ("GOAWAY on a stream", _open1, h2.frame(h2.GOAWAY, 0, 1, b"\x00" * 8), h2.PROTOCOL_ERROR),
    ("GOAWAY of 7 bytes", _nothing, h2.frame(h2.GOAWAY, 0, 0, b"\x00" * 7), h2.FRAME_SIZE_ERROR),
    ("a frame past 16 KiB", _open1, data(1, b"x" * (16_384 + 1)), h2.FRAME_SIZE_ERROR),
]


@pytest.mark.parametrize(
    "setup,frame,code", [c[1:] for c in CONNECTION_ERRORS], ids=[c[0] for c in CONNECTION_ERRORS]
)
def test_connection_errors(setup, frame, code):
    p = Peer()
    setup(p)
    p.m.data_to_send()
    events = p.send(frame)
    assert terminated(events, code)
    assert p.goaway() == code
    assert p.m.terminated
    assert p.send(h2.frame(h2.PING, 0, 0, b"12345678")) == []  # nothing more is read
    assert p.m.data_to_send() == b""


def _trailers_open(p: Peer) -> bytes:
    return h2.frame(h2.HEADERS, h2.END_HEADERS, 1, p.block([]))


def _trailers_end(p: Peer) -> bytes:
    return h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, p.block([]))


STREAM_ERRORS = [
    (
        "DATA on a half-closed (remote) stream",
        _half_closed1,
        lambda p: data(1, b"x"),
        h2.STREAM_CLOSED,
    ),
    ("HEADERS on a half-closed (remote) stream", _half_closed1, _trailers_end, h2.STREAM_CLOSED),
    ("trailers that leave the request open", _open1, _trailers_open, h2.PROTOCOL_ERROR),
    ("WINDOW_UPDATE of 0 on a stream", _open1, lambda p: h2.window_update(1, 0), h2.PROTOCOL_ERROR),
    (
        "a stream window past 2^31-1",
        _open1,
        lambda p: h2.window_update(1, 2**31 - 1),
        h2.FLOW_CONTROL_ERROR,
    ),
]


@pytest.mark.parametrize(
    "setup,frame,code", [c[1:] for c in STREAM_ERRORS], ids=[c[0] for c in STREAM_ERRORS]
)
def test_stream_errors(setup, frame, code):
    p = Peer()
    setup(p)
    p.m.data_to_send()
    events = p.send(frame(p))
    assert [(type(e), e.stream_id, e.error_code, e.remote) for e in events] == [
        (StreamReset, 1, code, False)
    ]
    assert p.resets() == {1: code}
    assert p.m.stream_state(1) is StreamState.CLOSED
    assert not p.m.terminated
    p.open(3)  # the connection goes on
    assert p.m.stream_state(3) is StreamState.OPEN


def test_frames_racing_our_reset_are_dropped_but_count_toward_the_window():
    p = Peer(max_input_bytes=65_535)
    p.open(1)
    p.m.reset_stream(1, h2.CANCEL)
    assert p.resets() == {1: h2.CANCEL}
    chunk = b"x" * 16_000
    late = data(1, chunk) * 2 + h2.frame(h2.HEADERS, h2.END_HEADERS, 1, p.block([]))
    assert p.send(late) == []
    assert p.m.recv_unacked == 0 and p.sent()[0][0] == h2.WINDOW_UPDATE  # credited back
    assert p.send(h2.window_update(1, 5) + h2.rst_stream(1, h2.CANCEL)) == []


def test_priority_and_unknown_frames_are_ignored():
    p = Peer()
    p.open(1)
    assert p.send(h2.frame(h2.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10")) == []
    assert p.send(h2.frame(h2.PRIORITY, 0, 9, b"\x00\x00\x00\x00\x10")) == []  # idle: allowed
    assert p.send(h2.frame(0x42, 0xFF, 1, b"whatever")) == []
    assert p.m.stream_state(1) is StreamState.OPEN and p.sent() == []


def test_a_bad_preface_is_a_protocol_error_from_its_first_bytes():
    m = H2Machine(Http2Limits(), clock=Clock())
    assert m.receive_data(b"PRI * HTTP/2") == []  # a prefix of the preface: wait for more
    events = m.receive_data(b".1\r\n")
    assert terminated(events, h2.PROTOCOL_ERROR)
    assert goaway_code(m.data_to_send()) == h2.PROTOCOL_ERROR
    assert terminated(H2Machine(Http2Limits(), clock=Clock()).receive_data(b"GET /"), 1)


def test_frames_may_arrive_cut_anywhere():
    p = Peer()
    wire = h2.frame(h2.HEADERS, h2.END_HEADERS, 1, p.block()) + data(1, b"hello", end=True)
    events = []
    for i in range(len(wire)):
        events += p.send(wire[i : i + 1])
    assert [type(e) for e in events] == [RequestReceived, DataReceived]
    assert events[1].data == b"hello" and events[1].end_stream


def test_a_header_block_in_continuations_and_padded_frames():
    p = Peer()
    block = p.block()
    frames_ = h2.frame(
        h2.HEADERS,
        h2.PADDED | h2.PRIORITY_FLAG,
        1,
        b"\x02" + b"\x00\x00\x00\x00\x10" + block[:3] + b"\x00\x00",
    )
    frames_ += h2.frame(h2.CONTINUATION, 0, 1, block[3:5])
    frames_ += h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, block[5:])
    frames_ += data(1, b"\x03abcpad", flags=h2.PADDED, end=True)
    req, body = p.send(frames_)
    assert isinstance(req, RequestReceived) and req.headers == REQUEST
    assert isinstance(body, DataReceived) and body.data == b"abc"


# --- flow control ---------------------------------------------------------------------------------


def test_sending_respects_both_windows_and_the_frame_size():
    p = Peer()
    p.open(1, end=True)
    assert p.m.send_allowance(1) == 16_384  # the peer's frame size is the smallest
    p.send(h2.settings_frame({h2.SETTINGS_MAX_FRAME_SIZE: 1 << 20}))
    assert p.m.send_allowance(1) == 65_535
    for _ in range(3):
        p.m.send_data(1, b"x" * 20_000)
    assert p.m.send_allowance(1) == 5_535
    with pytest.raises(H2UsageError):
        p.m.send_data(1, b"x" * 5_536)
    p.m.send_data(1, b"x" * 5_535)
    assert p.m.send_allowance(1) == 0
    assert [type(e) for e in p.send(h2.window_update(1, 1000))] == [WindowOpened]
    assert p.m.send_allowance(1) == 0  # the connection's window is still closed
    (event,) = p.send(h2.window_update(0, 400))
    assert isinstance(event, WindowOpened) and event.stream_id == 0
    assert p.m.send_allowance(1) == 400


def test_a_new_initial_window_moves_every_stream_window():
    p = Peer()
    p.open(1, end=True)
    p.send(h2.window_update(0, 1 << 20))
    (event,) = p.send(h2.settings_frame({h2.SETTINGS_INITIAL_WINDOW_SIZE: 0}))
    assert isinstance(event, WindowOpened) and p.m.send_allowance(1) == 0
    p.send(h2.settings_frame({h2.SETTINGS_INITIAL_WINDOW_SIZE: 100}))
    assert p.m.send_allowance(1) == 100
    p.send(h2.window_update(1, 2**31 - 1 - 100))  # the stream's window is at the maximum
    events = p.send(h2.settings_frame({h2.SETTINGS_INITIAL_WINDOW_SIZE: 101}))
    assert terminated(events, h2.FLOW_CONTROL_ERROR) and p.goaway() == h2.FLOW_CONTROL_ERROR


def test_headers_past_the_peers_frame_size_go_in_continuations():
    p = Peer()
    p.open(1, end=True)
    p.m.send_headers(1, b"\x00" * 40_000, end_stream=True)
    sent = p.sent()
    assert [k for k, _, _, _ in sent] == [h2.HEADERS, h2.CONTINUATION, h2.CONTINUATION]
    assert [f & h2.END_HEADERS for _, f, _, _ in sent] == [0, 0, h2.END_HEADERS]
    assert sent[0][1] & h2.END_STREAM
    assert b"".join(p for _, _, _, p in sent) == b"\x00" * 40_000


def test_a_whole_answer_goes_at_once_only_if_it_fits():
    p = Peer()
    p.open(1, end=True)
    assert p.m.send_answer(1, b"\x88", b"\x00\x00\x00\x00\x03", b"abc", b"\x40\x01a\x01b")
    sent = p.sent()
    assert [(k, f) for k, f, _, _ in sent] == [
        (h2.HEADERS, h2.END_HEADERS),
        (h2.DATA, 0),
        (h2.HEADERS, h2.END_HEADERS | h2.END_STREAM),
    ]
    assert sent[1][3] == b"\x00\x00\x00\x00\x03abc"
    assert p.m.stream_state(1) is StreamState.CLOSED
    p.send(h2.settings_frame({h2.SETTINGS_INITIAL_WINDOW_SIZE: 4}))
    p.open(3, end=True)
    assert not p.m.send_answer(3, b"\x88", b"\x00\x00\x00\x00\x03", b"abc", b"")
    assert p.sent() == [(h2.SETTINGS, h2.ACK, 0, b"")]  # nothing of the answer
    assert p.m.stream_state(3) is StreamState.HALF_CLOSED_REMOTE


def test_the_receive_windows_are_credited_back():
    p = Peer(max_input_bytes=64 * 1024)  # the connection's window: the default
    p.open(1)
    p.send(data(1, b"x" * 10_000))
    assert p.sent() == []  # under a quarter of the connection's window: not yet
    p.send(data(1, b"x" * 10_000))
    assert p.sent() == [(h2.WINDOW_UPDATE, 0, 0, struct.pack(">I", 20_000))]
    p.m.acknowledge_received_data(1, at_least=30_000)
    assert p.sent() == []
    p.m.acknowledge_received_data(1)
    assert p.sent() == [(h2.WINDOW_UPDATE, 0, 1, struct.pack(">I", 20_000))]


def test_a_stream_that_overruns_its_window_is_reset():
    p = Peer(max_input_bytes=64 * 1024 * 1024)
    p.open(1)
    for _ in range(STREAM_WINDOW // 16_000):
        assert [type(e) for e in p.send(data(1, b"x" * 16_000))] == [DataReceived]
    (event,) = p.send(data(1, b"x" * 16_000))
    assert isinstance(event, StreamReset) and event.error_code == h2.FLOW_CONTROL_ERROR
    assert p.resets() == {1: h2.FLOW_CONTROL_ERROR}
    assert p.m.input_bytes == 0  # its bytes are released with it


# --- budgets --------------------------------------------------------------------------------------


def test_streams_past_the_limit_are_refused_and_a_running_one_keeps_its_slot():
    p = Peer(max_concurrent_streams=2)
    p.open(1)
    p.open(3)
    assert p.open(5) == []
    assert p.resets() == {5: h2.REFUSED_STREAM}
    assert p.budgets["streams"] == 1
    assert p.send(data(5, b"late")) == []  # refused: its data in flight is dropped
    p.m.running = 2  # the application still works on both ...
    p.send(h2.rst_stream(1, h2.CANCEL) + h2.rst_stream(3, h2.CANCEL))  # ... after their reset
    assert p.open(7) == [] and p.budgets["streams"] == 2
    p.m.running = 0
    assert [type(e) for e in p.open(9)] == [RequestReceived]


def test_rapid_reset_ends_with_enhance_your_calm():
    p = Peer(max_resets_per_s=10.0)
    sid = 1
    for _ in range(20):  # the bucket holds two seconds' worth
        p.open(sid)
        (event,) = p.send(h2.rst_stream(sid, h2.CANCEL))
        assert isinstance(event, StreamReset)
        sid += 2
    p.clock.now += 0.5  # five more come back
    for _ in range(5):
        p.open(sid)
        assert [type(e) for e in p.send(h2.rst_stream(sid, h2.CANCEL))] == [StreamReset]
        sid += 2
    p.open(sid)
    assert terminated(p.send(h2.rst_stream(sid, h2.CANCEL)), h2.ENHANCE_YOUR_CALM)
    assert p.goaway() == h2.ENHANCE_YOUR_CALM
    assert p.budgets == {"resets": 1}


def test_a_header_block_past_its_budget():
    p = Peer(max_header_block_bytes=32 * 1024)
    p.send(h2.frame(h2.HEADERS, 0, 1, b"\x82"))
    events: list = []
    for _ in range(3):
        events = p.send(h2.frame(h2.CONTINUATION, 0, 1, b"\x82" * 16_000))
    assert terminated(events, h2.ENHANCE_YOUR_CALM) and p.goaway() == h2.ENHANCE_YOUR_CALM
    assert p.budgets == {"header_block": 1}
    p = Peer(max_header_block_bytes=100)  # a single frame counts too
    assert terminated(p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\x82" * 101)), 0xB)
    assert p.budgets == {"header_block": 1}


def test_a_header_list_past_its_budget():
    p = Peer(max_header_list_bytes=4096)
    many = p.encoder.encode([(f"x-{i}", "v") for i in range(200)])  # 200 * 36 B > 4 KiB
    assert terminated(p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, many)), h2.COMPRESSION_ERROR)
    assert p.goaway() == h2.COMPRESSION_ERROR
    assert p.budgets == {"header_list": 1}


def test_too_many_table_size_updates():
    p = Peer()
    block = b"\x3f\xe1\x1f" * 3 + p.block()  # three "table size 4096" updates, then headers
    events = p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, block))
    assert terminated(events, h2.COMPRESSION_ERROR) and p.goaway() == h2.COMPRESSION_ERROR
    assert p.budgets == {"table_updates": 1}
    p = Peer()  # two are allowed
    events = p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"\x3f\xe1\x1f" * 2 + p.block()))
    assert [type(e) for e in events] == [RequestReceived]


def test_the_decode_cache_stays_within_its_bytes():
    p = Peer(decode_cache_bytes=8 * 1024)
    names = [(f"x-{i}", "v" * 20) for i in range(60)]
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, p.encoder.encode(names)))
    sid = 3
    for start in range(55):  # blocks of table references only, all different
        block = p.encoder.encode(names[start : start + 5])
        p.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, block))
        sid += 2
        assert 0 < p.m.decoder.cached_bytes <= 8 * 1024
    assert not p.m.terminated


@pytest.mark.parametrize(
    "provoke",
    [
        lambda p, i: h2.frame(h2.SETTINGS, 0, 0),
        lambda p, i: h2.frame(h2.PING, 0, 0, b"12345678"),
        lambda p, i: h2.frame(h2.HEADERS, h2.END_HEADERS, 2 * i + 1, p.block()),  # refused
    ],
    ids=["SETTINGS", "PING", "refused streams"],
)
def test_answers_the_peer_does_not_read_are_bounded(provoke):
    p = Peer(max_control_answers=100, max_concurrent_streams=0)
    p.clock.now += 1e6
    p.m.keepalive_min_time = 0.0  # pings are allowed as often as they come
    for i in range(500):  # while it reads, any number
        assert not any(isinstance(e, ConnectionTerminated) for e in p.send(provoke(p, i)))
    p.m.set_writable(False)  # its socket is full
    events: list = []
    for i in range(500, 1000):
        events = p.send(provoke(p, i))
        if events:
            break
    assert terminated(events, h2.ENHANCE_YOUR_CALM) and i == 600
    assert p.goaway() == h2.ENHANCE_YOUR_CALM
    assert p.budgets["control_frames"] == 1


def test_request_bytes_held_are_bounded():
    p = Peer(max_input_bytes=100_000)
    chunk = b"x" * 16_000
    for sid in range(1, 13, 2):  # six streams, 16 KB each: 96 KB held
        p.open(sid)
        assert [type(e) for e in p.send(data(sid, chunk))] == [DataReceived]
    p.open(13)
    (event,) = p.send(data(13, chunk))
    assert isinstance(event, InputBudgetExceeded) and event.stream_id == 13
    assert p.budgets == {"input": 1}
    assert p.send(data(13, chunk)) == []  # the rest of that stream is dropped, once counted
    assert p.budgets == {"input": 1} and p.m.input_bytes == 96_000
    p.m.release_input(1, keep=1000)  # the application took most of one
    assert p.m.input_bytes == 81_000
    p.m.reset_stream(3, h2.CANCEL)  # closing a stream releases what it held
    assert p.m.input_bytes == 65_000
    p.open(15)
    assert [type(e) for e in p.send(data(15, chunk))] == [DataReceived]


def test_the_connection_window_is_the_input_budget():
    p = Peer(max_input_bytes=1000)  # the window is never below HTTP/2's default
    p.open(1)
    events = p.send(data(1, b"x" * 16_000) * 5)  # 80 000 bytes before any credit: too many
    assert terminated(events, h2.FLOW_CONTROL_ERROR) and p.goaway() == h2.FLOW_CONTROL_ERROR
    assert p.budgets == {"input": 2}  # held bytes past the budget, then the window


def test_too_many_pings_end_the_connection():
    p = Peer(keepalive_min_time=5.0)
    ping = h2.frame(h2.PING, 0, 0, b"12345678")
    for _ in range(10):  # pings at the allowed pace
        p.clock.now += 5.0
        assert p.send(ping) == []
    assert [k for k, f, _, _ in p.sent()] == [h2.PING] * 10
    p.open(1, end=True)
    for _ in range(10):  # each answered by data: never a strike
        p.m.send_headers(1, b"\x88")
        assert p.send(ping) == []
    for _ in range(2):  # two strikes are forgiven
        assert p.send(ping) == []
    events = p.send(ping)
    assert terminated(events, h2.ENHANCE_YOUR_CALM) and p.goaway() == h2.ENHANCE_YOUR_CALM
    assert events[0].message == "too_many_pings"


def test_ping_acks_and_goaway_from_the_peer():
    p = Peer()
    p.m.send_ping(b"raftkv\0\0")
    assert p.sent() == [(h2.PING, 0, 0, b"raftkv\0\0")]
    (event,) = p.send(h2.frame(h2.PING, h2.ACK, 0, b"raftkv\0\0"))
    assert isinstance(event, PingAcked) and event.data == b"raftkv\0\0"
    p.open(1)
    (event,) = p.send(h2.goaway(1, h2.NO_ERROR))
    assert isinstance(event, GoAwayReceived) and event.last_stream_id == 1
    assert p.open(3) == [] and p.resets() == {3: h2.REFUSED_STREAM}  # no new streams
    assert p.m.stream_state(1) is StreamState.OPEN  # the open one goes on


def test_our_goaway_refuses_new_streams_and_lets_open_ones_finish():
    p = Peer()
    p.open(1)
    p.m.go_away()
    p.m.go_away()  # once
    assert p.sent() == [(h2.GOAWAY, 0, 0, struct.pack(">II", 1, h2.NO_ERROR))]
    assert p.open(3) == [] and p.resets() == {3: h2.REFUSED_STREAM}
    assert p.budgets == {}  # refused because we stop, not because of a budget
    assert [type(e) for e in p.send(data(1, b"x", end=True))] == [DataReceived]


def test_closing_the_connection_sends_one_goaway_and_nothing_after():
    p = Peer()
    p.open(1)
    p.m.close_connection(h2.ENHANCE_YOUR_CALM, "answers not read in time")
    p.m.close_connection(h2.NO_ERROR)
    p.m.send_ping(b"12345678")
    assert not p.m.send_headers(1, b"\x88")
    sent = p.sent()
    assert [k for k, _, _, _ in sent] == [h2.GOAWAY]
    assert sent[0][3] == struct.pack(">II", 1, h2.ENHANCE_YOUR_CALM) + b"answers not read in time"


# --- anything at all ------------------------------------------------------------------------------

ERROR_CODES = {
    h2.NO_ERROR,
    h2.PROTOCOL_ERROR,
    h2.FLOW_CONTROL_ERROR,
    h2.STREAM_CLOSED,
    h2.FRAME_SIZE_ERROR,
    h2.REFUSED_STREAM,
    h2.CANCEL,
    h2.COMPRESSION_ERROR,
    h2.ENHANCE_YOUR_CALM,
}
_ENCODER = Encoder()
_BLOCKS = [_ENCODER.encode(REQUEST), b"\x82\x86\x84", b"", b"\x3f\xe1\x1f" * 3, b"\xff\xff"]

FRAMES = st.one_of(
    st.tuples(
        st.integers(0, 10),  # the frame types, and one unknown
        st.sampled_from(
            [0, h2.END_STREAM, h2.END_HEADERS, h2.END_STREAM | h2.END_HEADERS, h2.PADDED, 0xFF]
        ),
        st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1]),
        st.one_of(
            st.binary(max_size=24),
            st.sampled_from(_BLOCKS),
            st.integers(0, 2**32 - 1).map(lambda n: struct.pack(">I", n)),
            st.binary(min_size=6, max_size=6),
        ),
    ).map(lambda t: h2.frame(*t)),
    st.binary(max_size=16),  # bytes that are no frame at all
)
ACTIONS = st.sampled_from(
    ["send", "answer", "end", "reset", "ack", "release", "unwritable", "writable", "tick"]
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(FRAMES, ACTIONS, st.integers(0, 7)), max_size=30))
def test_any_frames_end_in_the_protocols_own_answers(steps):
    """Whatever a peer sends, mixed with whatever the application does, the machine never
    raises, never answers INTERNAL_ERROR, and keeps its bounds."""
    p = Peer(
        max_concurrent_streams=3,
        max_input_bytes=70_000,
        max_control_answers=5,
        max_resets_per_s=2.0,
        max_header_block_bytes=1000,
    )
    for frame, action, n in steps:
        events = p.send(frame)
        for event in events:
            if isinstance(event, ConnectionTerminated):
                assert event.error_code in ERROR_CODES and len(events) == 1
        sid = 2 * n + 1
        if action == "send" and p.m.send_allowance(sid):
            p.m.send_data(sid, b"x" * min(100, p.m.send_allowance(sid)))
        elif action == "answer":
            p.m.send_answer(sid, b"\x88", b"", b"ok", b"\x40\x01a\x01b")
        elif action == "end":
            p.m.end_response(sid, b"\x88")
        elif action == "reset":
            p.m.reset_stream(sid, h2.CANCEL)
        elif action == "ack":
            p.m.acknowledge_received_data(sid)
        elif action == "release":
            p.m.release_input(sid)
        elif action == "unwritable":
            p.m.set_writable(False)
        elif action == "writable":
            p.m.set_writable(True)
        elif action == "tick":
            p.clock.now += n
        for kind, _, _, payload in frames(p.m.data_to_send()):
            if kind == h2.GOAWAY:
                assert struct.unpack(">I", payload[4:8])[0] in ERROR_CODES
            if kind == h2.RST_STREAM:
                assert struct.unpack(">I", payload)[0] in ERROR_CODES
        assert 0 <= p.m.input_bytes <= 70_000
        assert len(p.m.streams) <= 3
        assert sum(s.held for s in p.m.streams.values()) == p.m.input_bytes
        for s in p.m.streams.values():
            assert s.state in (
                StreamState.OPEN,
                StreamState.HALF_CLOSED_LOCAL,
                StreamState.HALF_CLOSED_REMOTE,
            )
            assert s.recv_unacked <= STREAM_WINDOW


# --- malformed requests (RFC 9113 sections 8.2 and 8.3) ------------------------------------------


def _without(name: str) -> list[tuple[str, str]]:
    return [(n, v) for n, v in REQUEST if n != name]


MALFORMED = {
    "an uppercase name": [*REQUEST, ("X-Token", "a")],
    "a connection-specific field": [*REQUEST, ("connection", "keep-alive")],
    "transfer-encoding": [*REQUEST, ("transfer-encoding", "chunked")],
    "te other than trailers": [*_without("te"), ("te", "gzip")],
    "a pseudo-header after a regular field": [*_without(":path"), (":path", "/p")],
    "a response's pseudo-header": [(":status", "200"), *REQUEST],
    "a pseudo-header twice": [(":path", "/a"), *REQUEST],
    "no :method": _without(":method"),
    "no :scheme": _without(":scheme"),
    "no :path": _without(":path"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_request_is_reset_with_protocol_error(case):
    p = Peer()
    events = p.send(h2.frame(h2.HEADERS, h2.END_HEADERS, 1, p.block(MALFORMED[case])))
    assert events == []  # the application never sees it
    assert p.resets() == {1: h2.PROTOCOL_ERROR}
    (opened,) = p.open(3, end=True)  # the connection goes on
    assert isinstance(opened, RequestReceived) and (opened.stream_id, opened.headers) == (
        3,
        REQUEST,
    )


def test_trailers_with_a_pseudo_header_reset_the_stream():
    p = Peer()
    p.open(1)
    block = p.block([(":path", "/x")])
    events = p.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, block))
    assert [type(e) for e in events] == [StreamReset]
    assert p.resets() == {1: h2.PROTOCOL_ERROR}


def test_a_well_formed_block_sent_again_comes_from_the_cache_and_passes():
    p = Peer()
    p.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, p.block()))  # literals
    again = p.block()  # the same fields, now table references only
    first = p.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 3, again))
    second = p.send(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 5, again))
    assert [type(e) for e in first + second] == [RequestReceived, RequestReceived]
    assert second[0].headers is first[0].headers  # the decoder's cached list, checked once
