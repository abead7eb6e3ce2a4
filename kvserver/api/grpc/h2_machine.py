"""HTTP/2 for a server, as a state machine without I/O: bytes in, events out, frames to send.

``H2Machine`` is one client connection's HTTP/2 (RFC 9113, header blocks RFC 7541) with no
socket, no event loop and no clock of its own (``clock`` is given to it), in the manner of
python-hyper's ``h2`` and ``h11``:

- ``receive_data(data)`` parses what the peer sent and returns ``h2_events`` events;
  ``data_to_send()`` returns the frames queued since it was last called. Nothing the peer
  sends raises: a fault of the peer is a stream error (RST_STREAM with the RFC's code, and a
  ``StreamReset`` event) or a connection error (GOAWAY with the RFC's code, and a
  ``ConnectionTerminated`` event, after which nothing more is read). A peer's fault is never
  INTERNAL_ERROR.
- ``send_headers``, ``send_data``, ``end_response``, ``reset_stream``, ``go_away``,
  ``close_connection`` and ``send_ping`` queue frames. ``send_data`` never exceeds the
  peer's windows or frame size (``send_allowance`` says how much may go now; a
  ``WindowOpened`` event says when more may). Sending on a stream the peer has already
  reset does nothing: the application learns of the reset from its event.
- Each stream moves through ``StreamState`` (RFC 9113 section 5.1) and frames that are not
  allowed in a stream's state get the RFC's error: DATA, RST_STREAM or WINDOW_UPDATE on an
  idle stream, PROTOCOL_ERROR for the connection; DATA or HEADERS on a half-closed (remote)
  stream, STREAM_CLOSED for the stream; on a closed one, STREAM_CLOSED for the connection,
  except frames racing our own RST_STREAM, which are dropped (DATA still counts toward the
  connection's window). The machine remembers the streams reset (the last
  ``CLOSED_MEMORY``); DATA for a stream it no longer remembers is dropped as if it raced a
  reset, HEADERS for it is STREAM_CLOSED. Frames after the peer's own RST_STREAM: DATA and
  HEADERS are STREAM_CLOSED for the connection; WINDOW_UPDATE and RST_STREAM, which a
  peer's race can explain, are dropped.

Every budget of ``kvserver.api.grpc.budgets`` that is about what the peer sends is enforced
here, and counted in ``budgets`` when met: concurrent streams (``streams``; a stream the
application still works on after it closed keeps its slot, see ``H2Machine.running``),
stream resets a second (``resets``), header block bytes (``header_block``), the decoded
header list (``header_list``), leading table size updates (``table_updates``), the decode
cache (``HeaderDecoder``), control answers queued while the peer does not read
(``control_frames``, see ``set_writable``), and request bytes (``input``: the connection's
receive window, credited back as bytes arrive, bounds what may be in flight; bytes
delivered and not yet released by the application are bounded by ``max_input_bytes``).
So is the keepalive policy: a peer that pings more often than ``keepalive_min_time`` while
we send nothing gets GOAWAY ENHANCE_YOUR_CALM after ``MAX_PING_STRIKES`` strikes.

A request's header fields get RFC 9113's checks (sections 8.2 and 8.3, ``malformed``):
lowercase names, no connection-specific field (``te`` only as ``trailers``), pseudo-headers
first, each known to requests, none twice, ``:method``, ``:scheme`` and ``:path`` present;
trailers carry no pseudo-header. A malformed request or trailer is a stream error
PROTOCOL_ERROR. A block the decoder answered from its cache was checked when first seen.

Not implemented: server push (a gRPC server has no use for it) and priorities (checked for
form, then ignored, as RFC 9113 allows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from . import h2
from .budgets import Http2Limits, ResetBucket
from .h2 import (
    ACK,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FRAME,
    GOAWAY,
    HEADERS,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    U32,
    WINDOW_UPDATE,
    ConnectionError_,
    HeaderDecoder,
)
from .h2_events import (
    ConnectionTerminated,
    DataReceived,
    Event,
    GoAwayReceived,
    InputBudgetExceeded,
    PingAcked,
    RequestReceived,
    StreamEnded,
    StreamReset,
    StreamState,
    WindowOpened,
)

STREAM_WINDOW: Final = 1024 * 1024  # the receive window we give each stream
MAX_PING_STRIKES: Final = 2
CLOSED_MEMORY: Final = 4096  # streams reset whose late frames are still recognized

OPEN: Final = StreamState.OPEN
HALF_CLOSED_LOCAL: Final = StreamState.HALF_CLOSED_LOCAL
HALF_CLOSED_REMOTE: Final = StreamState.HALF_CLOSED_REMOTE
CLOSED: Final = StreamState.CLOSED

_END: Final = END_STREAM | END_HEADERS
_TRIMMED: Final = PADDED | PRIORITY_FLAG
_BY_US: Final = True  # how a remembered stream was reset
_BY_PEER: Final = False


class H2UsageError(Exception):
    """The application asked for something HTTP/2 does not allow (a bug of ours, not the
    peer's): sending past a window, or on a stream it already ended."""


_WELL_FORMED_KEPT: Final = 256
_REQUEST_PSEUDO: Final = frozenset({":method", ":scheme", ":authority", ":path"})
_CONNECTION_SPECIFIC: Final = frozenset(
    {"connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade"}
)


def well_formed(headers: list[tuple[str, str]], *, trailers: bool = False) -> bool:
    """Whether a request's header fields (or its trailers) are well formed by RFC 9113
    8.2-8.3: lowercase names, no connection-specific field, ``te`` only ``trailers``,
    pseudo-headers before the rest, each a request's, none twice, and ``:method``,
    ``:scheme`` and ``:path`` present (trailers: no pseudo-header at all)."""
    seen: set[str] = set()
    regular = False
    for name, value in headers:
        if name.startswith(":"):
            if trailers or regular or name not in _REQUEST_PSEUDO or name in seen:
                return False
            seen.add(name)
            continue
        regular = True
        if name != name.lower() or name in _CONNECTION_SPECIFIC:
            return False
        if name == "te" and value != "trailers":
            return False
    if trailers:
        return True
    return ":method" in seen and ":scheme" in seen and ":path" in seen


class H2Stream:
    """One stream's HTTP/2 state: its ``StreamState``, windows and request bytes held."""

    __slots__ = ("sid", "state", "send_window", "recv_unacked", "held", "input_refused")

    def __init__(self, sid: int, state: StreamState, send_window: int):
        self.sid = sid
        self.state = state
        self.send_window = send_window
        self.recv_unacked = 0  # received and not credited back: the window is the rest
        self.held = 0  # bytes delivered that the application has not released
        self.input_refused = False  # over the input budget: later DATA is dropped


class H2Machine:
    """A server's side of one HTTP/2 connection (see the module doc)."""

    def __init__(
        self,
        limits: Http2Limits,
        *,
        clock: Callable[[], float],
        budgets: dict[str, int] | None = None,
        keepalive_min_time: float = 300.0,
        stream_window: int = STREAM_WINDOW,
    ):
        self.limits = limits
        self.clock = clock
        self.budgets: dict[str, int] = budgets if budgets is not None else {}
        self.keepalive_min_time = keepalive_min_time
        self.stream_window = stream_window
        self.conn_window = max(h2.DEFAULT_WINDOW, limits.max_input_bytes)
        self.credit_at = self.conn_window // 4  # received bytes credited back past this
        self.decoder = HeaderDecoder(
            limits.max_header_list_bytes,
            table_size=limits.header_table_bytes,
            cache_bytes=limits.decode_cache_bytes,
        )
        # header lists found well formed, by id (the decoder's cache returns the same list)
        self._well_formed_lists: dict[tuple[int, bool], list[tuple[str, str]]] = {}
        self.resets = ResetBucket(limits.max_resets_per_s, clock())
        self.streams: dict[int, H2Stream] = {}  # every stream not closed
        self.closed_resets: dict[int, bool] = {}  # recently reset streams: by us or the peer
        self.last_sid = 0  # the highest stream the peer opened
        self.running = 0  # streams the application still works on, closed ones included
        self.input_bytes = 0  # request bytes delivered and not released
        self.accepting = True  # False after either side's GOAWAY: new streams are refused
        self.goaway_sent = False
        self.terminated = False  # a connection error: GOAWAY sent, nothing more is read
        self.send_window = h2.DEFAULT_WINDOW
        self.peer_initial_window = h2.DEFAULT_WINDOW
        self.peer_max_frame = h2.DEFAULT_MAX_FRAME
        self.recv_unacked = 0  # received on the connection and not credited back
        self.writable = True  # the peer reads what we send (see ``set_writable``)
        self.control_answers = 0  # answers queued while it does not
        self.ping_strikes = 0
        self.last_ping = float("-inf")
        self.sent_since_ping = False  # HEADERS or DATA went out since the peer's last PING
        self._buffer = bytearray()
        self._preface_seen = False
        self._pending: tuple[int, int, bytearray] | None = None  # sid, flags, header block
        self._events: list[Event] = []
        self._out: list[bytes | memoryview] = []

    # --- the application's view ----------------------------------------------------------------

    def stream_state(self, sid: int) -> StreamState:
        stream = self.streams.get(sid)
        if stream is not None:
            return stream.state
        if sid % 2 and sid <= self.last_sid:
            return CLOSED
        return StreamState.IDLE  # we push nothing: an even stream never leaves idle

    @property
    def last_stream_id(self) -> int:
        return self.last_sid

    def data_to_send(self) -> bytes:
        """The frames queued since the last call, in order."""
        out = self._out
        if not out:
            return b""
        self._out = []
        return b"".join(out)

    def set_writable(self, writable: bool) -> None:
        """Whether the peer reads what we send (the transport's buffer has room). While it
        does not, each SETTINGS or PING answer and each RST_STREAM the peer provokes counts,
        and past ``max_control_answers`` the connection ends: an unread answer costs memory
        the peer chose to make us spend."""
        self.writable = writable
        if writable:
            self.control_answers = 0

    # --- receiving -----------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """Parses ``data`` (any cut of the byte stream) and returns what it meant."""
        if self.terminated:
            return []  # after our GOAWAY what arrives is dropped
        events = self._events = []
        buffer = self._buffer
        buffer += data
        try:
            if not self._preface_seen:
                if len(buffer) < len(h2.PREFACE):
                    if not h2.PREFACE.startswith(bytes(buffer)):
                        raise ConnectionError_(h2.PROTOCOL_ERROR, "bad connection preface")
                    return events
                if bytes(buffer[: len(h2.PREFACE)]) != h2.PREFACE:
                    raise ConnectionError_(h2.PROTOCOL_ERROR, "bad connection preface")
                del buffer[: len(h2.PREFACE)]
                self._preface_seen = True
            self._read_frames()
        except ConnectionError_ as exc:
            return [self._terminate(exc.code, str(exc), exc.budget)]
        if self.recv_unacked >= self.credit_at:
            self._out.append(h2.window_update(0, self.recv_unacked))
            self.recv_unacked = 0
        return events

    def _terminate(self, code: int, message: str, budget: str | None) -> ConnectionTerminated:
        if budget is not None:
            self.budgets[budget] = self.budgets.get(budget, 0) + 1
        self.close_connection(code, message)
        return ConnectionTerminated(code, message, budget)

    def _read_frames(self) -> None:
        buffer = self._buffer
        view = memoryview(buffer)
        pos = 0
        end = len(buffer)
        try:
            while end - pos >= 9:
                length_type, flags, sid = FRAME.unpack_from(buffer, pos)
                length = length_type >> 8
                if length > h2.DEFAULT_MAX_FRAME:  # we never allow a bigger one
                    raise ConnectionError_(h2.FRAME_SIZE_ERROR, "frame larger than allowed")
                if end - pos - 9 < length:
                    break
                payload = bytes(view[pos + 9 : pos + 9 + length])
                pos += 9 + length
                self._frame(length_type & 0xFF, flags, sid & 0x7FFFFFFF, payload)
        finally:
            view.release()
            del buffer[:pos]

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._pending is not None and kind != CONTINUATION:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == DATA:
            self._on_data(flags, sid, payload)
        elif kind == HEADERS:
            self._on_headers(flags, sid, payload)
        elif kind == CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif kind == SETTINGS:
            self._on_settings(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif kind == PING:
            self._on_ping(flags, sid, payload)
        elif kind == RST_STREAM:
            self._on_rst_stream(sid, payload)
        elif kind == GOAWAY:
            self._on_goaway(sid, payload)
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a client may not push")
        elif kind == PRIORITY:
            if sid == 0:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:  # a stream error, which we may make the connection's
                raise ConnectionError_(h2.FRAME_SIZE_ERROR, "bad PRIORITY length")
            self._check_dependency(sid, payload)
        # other frame types are ignored, as RFC 9113 asks

    def _idle(self, sid: int) -> bool:
        """A stream the peer has not opened (we open none: an even one is always idle)."""
        return sid > self.last_sid or not sid % 2

    def _check_dependency(self, sid: int, fields: bytes) -> None:
        if U32.unpack_from(fields)[0] & 0x7FFFFFFF == sid:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a stream depends on itself")

    # DATA

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if flags & PADDED:
            if not size:
                raise ConnectionError_(h2.FRAME_SIZE_ERROR, "DATA too short for its padding")
            if payload[0] >= size:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "bad padding")
        if self.recv_unacked + size > self.conn_window:
            raise ConnectionError_(
                h2.FLOW_CONTROL_ERROR, "the connection's window is exceeded", "input"
            )
        self.recv_unacked += size  # credited back when a quarter of the window is used
        stream = self.streams.get(sid)
        if stream is None:
            if self._idle(sid):
                raise ConnectionError_(h2.PROTOCOL_ERROR, "DATA on an idle stream")
            if self.closed_resets.get(sid) is _BY_PEER:
                raise ConnectionError_(h2.STREAM_CLOSED, "DATA after the stream's reset")
            return  # a stream we ended or reset: what was in flight is dropped
        state = stream.state
        if state is HALF_CLOSED_REMOTE:
            self._stream_error(stream, h2.STREAM_CLOSED)
            return
        if stream.recv_unacked + size > self.stream_window:
            self._stream_error(stream, h2.FLOW_CONTROL_ERROR)
            return
        stream.recv_unacked += size
        if flags & PADDED:
            payload = payload[1 : size - payload[0]]
        end_stream = bool(flags & END_STREAM)
        if end_stream:
            stream.recv_unacked = 0  # nothing more comes: no credit is owed
            if state is OPEN:
                stream.state = HALF_CLOSED_REMOTE
            else:
                self._close(stream)
        if stream.input_refused:
            if end_stream:
                self._events.append(StreamEnded(sid))
            return
        n = len(payload)
        if self.input_bytes + n > self.limits.max_input_bytes:
            stream.input_refused = True
            self.budgets["input"] = self.budgets.get("input", 0) + 1
            self._events.append(InputBudgetExceeded(sid))
            if end_stream:
                self._events.append(StreamEnded(sid))
            return
        if stream.state is not CLOSED:
            stream.held += n
            self.input_bytes += n
        self._events.append(DataReceived(sid, payload, end_stream))

    # HEADERS and CONTINUATION

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & PADDED:
            if not payload:
                raise ConnectionError_(h2.FRAME_SIZE_ERROR, "HEADERS too short for its padding")
            start, end = 1, end - payload[0]
        if flags & PRIORITY_FLAG:
            if len(payload) < start + 5:
                raise ConnectionError_(h2.FRAME_SIZE_ERROR, "HEADERS too short for priority")
            self._check_dependency(sid, payload[start : start + 4])
            start += 5
        if start > end:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "bad padding")
        if flags & END_HEADERS:
            self._header_block(sid, flags, payload[start:end] if flags & _TRIMMED else payload)
            return
        block = bytearray(payload[start:end])
        if len(block) > self.limits.max_header_block_bytes:
            raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "header block too large", "header_block")
        self._pending = (sid, flags, block)

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        pending = self._pending
        if pending is None or pending[0] != sid:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "unexpected CONTINUATION")
        block = pending[2]
        block += payload
        if len(block) > self.limits.max_header_block_bytes:
            raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "header block too large", "header_block")
        if flags & END_HEADERS:
            self._pending = None
            self._header_block(sid, pending[1], bytes(block))

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        if len(block) > self.limits.max_header_block_bytes:
            raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "header block too large", "header_block")
        headers = self.decoder.decode(block)  # always: the decoder's table must keep step
        stream = self.streams.get(sid)
        end_stream = bool(flags & END_STREAM)
        if stream is not None:  # trailers
            if stream.state is HALF_CLOSED_REMOTE:
                self._stream_error(stream, h2.STREAM_CLOSED)
            elif not end_stream or not self._well_formed(headers, trailers=True):
                # a request is malformed if more HEADERS leave it open, or its trailers are
                self._stream_error(stream, h2.PROTOCOL_ERROR)
            else:
                self._remote_end(stream)
                self._events.append(StreamEnded(sid))
            return
        if not sid % 2:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a client stream id must be odd")
        if sid <= self.last_sid:
            if self.closed_resets.get(sid) is _BY_US:
                return  # sent before the peer saw our reset: dropped
            raise ConnectionError_(h2.STREAM_CLOSED, "HEADERS on a closed stream")
        self.last_sid = sid
        if not self.accepting:
            self._refuse(sid)
            return
        if max(len(self.streams), self.running) >= self.limits.max_concurrent_streams:
            self.budgets["streams"] = self.budgets.get("streams", 0) + 1
            self._refuse(sid)
            return
        if not self._well_formed(headers, trailers=False):
            self._control(h2.rst_stream(sid, h2.PROTOCOL_ERROR))  # malformed: RFC 9113 8.1.1
            self._remember(sid, _BY_US)
            return
        state = HALF_CLOSED_REMOTE if end_stream else OPEN
        self.streams[sid] = H2Stream(sid, state, self.peer_initial_window)
        self._events.append(RequestReceived(sid, headers, end_stream))

    def _well_formed(self, headers: list[tuple[str, str]], *, trailers: bool) -> bool:
        """RFC 9113 8.2-8.3 for a request's fields (or its trailers'); a list the decoder
        gave before (its cache answers with the same list) passed already."""
        checked = self._well_formed_lists
        key = (id(headers), trailers)
        if checked.get(key) is headers:
            return True
        ok = well_formed(headers, trailers=trailers)
        if ok:
            if len(checked) >= _WELL_FORMED_KEPT:
                checked.clear()
            checked[key] = headers  # kept: its id is not reused while it is here
        return ok

    def _refuse(self, sid: int) -> None:
        """The stream never opens: the peer may retry it (REFUSED_STREAM), and its frames
        already in flight are dropped."""
        self._control(h2.rst_stream(sid, h2.REFUSED_STREAM))
        self._remember(sid, _BY_US)

    # the connection's frames

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionError_(h2.FRAME_SIZE_ERROR, "SETTINGS ack with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "bad SETTINGS length")
        opened = False
        for i in range(0, len(payload), 6):
            key, value = h2.SETTING.unpack_from(payload, i)
            if key == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > h2.MAX_WINDOW:
                    raise ConnectionError_(h2.FLOW_CONTROL_ERROR, "window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > h2.MAX_WINDOW:
                        raise ConnectionError_(h2.FLOW_CONTROL_ERROR, "a stream window overflows")
                opened = True
            elif key == h2.SETTINGS_MAX_FRAME_SIZE:
                if not h2.DEFAULT_MAX_FRAME <= value <= h2.MAX_FRAME_LIMIT:
                    raise ConnectionError_(h2.PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
                opened = True
            elif key == h2.SETTINGS_ENABLE_PUSH and value > 1:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")
        self._control(h2.frame(SETTINGS, ACK, 0))
        if opened:
            self._events.append(WindowOpened(0))

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE length")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > h2.MAX_WINDOW:
                raise ConnectionError_(h2.FLOW_CONTROL_ERROR, "connection window overflow")
            self._events.append(WindowOpened(0))
            return
        stream = self.streams.get(sid)
        if stream is None:
            if self._idle(sid):
                raise ConnectionError_(h2.PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # a closed stream's late update
        if increment == 0:
            self._stream_error(stream, h2.PROTOCOL_ERROR)
        elif stream.send_window + increment > h2.MAX_WINDOW:
            self._stream_error(stream, h2.FLOW_CONTROL_ERROR)
        else:
            stream.send_window += increment
            self._events.append(WindowOpened(sid))

    def _on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "bad PING length")
        if flags & ACK:
            self._events.append(PingAcked(payload))
            return
        now = self.clock()
        if self.sent_since_ping:  # we sent data since the last ping: it was not idle
            self.sent_since_ping = False
            self.ping_strikes = 0
        elif now - self.last_ping < self.keepalive_min_time:
            self.ping_strikes += 1
            if self.ping_strikes > MAX_PING_STRIKES:
                raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "too_many_pings")
        self.last_ping = now
        self._control(h2.frame(PING, ACK, 0, payload))

    def _on_rst_stream(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "bad RST_STREAM length")
        stream = self.streams.get(sid)
        if stream is None:
            if self._idle(sid):
                raise ConnectionError_(h2.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
            return  # it crossed our own end of the stream
        if not self.resets.take(self.clock()):
            raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "too many stream resets", "resets")
        code = U32.unpack(payload)[0]
        self._close(stream, _BY_PEER)
        self._events.append(StreamReset(sid, code, True))

    def _on_goaway(self, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "GOAWAY too short")
        self.accepting = False  # the peer opens no more streams
        last = U32.unpack_from(payload)[0] & 0x7FFFFFFF
        self._events.append(GoAwayReceived(U32.unpack_from(payload, 4)[0], last))

    # stream states

    def _remote_end(self, stream: H2Stream) -> None:
        if stream.state is OPEN:
            stream.state = HALF_CLOSED_REMOTE
        else:  # half-closed (local)
            self._close(stream)
        stream.recv_unacked = 0

    def _local_end(self, stream: H2Stream) -> None:
        if stream.state is OPEN:
            stream.state = HALF_CLOSED_LOCAL
        elif stream.state is HALF_CLOSED_REMOTE:
            self._close(stream)
        else:
            raise H2UsageError(f"stream {stream.sid} already ended its side")

    def _close(self, stream: H2Stream, reset: bool | None = None) -> None:
        """``reset``: by us (``_BY_US``), by the peer (``_BY_PEER``), or None: both sides
        ended the stream."""
        stream.state = CLOSED
        del self.streams[stream.sid]
        if stream.held:
            self.input_bytes -= stream.held
            stream.held = 0
        if reset is not None:
            self._remember(stream.sid, reset)

    def _remember(self, sid: int, by_us: bool) -> None:
        closed = self.closed_resets
        closed[sid] = by_us
        if len(closed) > CLOSED_MEMORY:
            del closed[next(iter(closed))]

    def _stream_error(self, stream: H2Stream, code: int) -> None:
        self._control(h2.rst_stream(stream.sid, code))
        self._close(stream, _BY_US)
        self._events.append(StreamReset(stream.sid, code, False))

    def _control(self, frame: bytes) -> None:
        """Queues an answer the peer's frames asked for (see ``set_writable``)."""
        if not self.writable:
            self.control_answers += 1
            if self.control_answers > self.limits.max_control_answers:
                raise ConnectionError_(
                    h2.ENHANCE_YOUR_CALM, "too many control frames unread", "control_frames"
                )
        self._out.append(frame)

    # --- sending -------------------------------------------------------------------------------

    def initiate_connection(self) -> None:
        """The server's preface: our settings, and the connection's receive window."""
        limits = self.limits
        self._out.append(
            h2.settings_frame(
                {
                    h2.SETTINGS_HEADER_TABLE_SIZE: limits.header_table_bytes,
                    h2.SETTINGS_MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                    h2.SETTINGS_INITIAL_WINDOW_SIZE: self.stream_window,
                    h2.SETTINGS_MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
                }
            )
        )
        if self.conn_window > h2.DEFAULT_WINDOW:
            self._out.append(h2.window_update(0, self.conn_window - h2.DEFAULT_WINDOW))

    def send_allowance(self, sid: int) -> int:
        """How many bytes of DATA ``sid`` may send now (0: none, or the stream is closed)."""
        stream = self.streams.get(sid)
        if stream is None or self.terminated:
            return 0
        return min(stream.send_window, self.send_window, self.peer_max_frame)

    def send_headers(self, sid: int, block: bytes, *, end_stream: bool = False) -> bool:
        """Queues a header block (split into CONTINUATIONs past the peer's frame size);
        False if the stream is already closed."""
        stream = self.streams.get(sid)
        if stream is None or self.terminated:
            return False
        self.sent_since_ping = True
        flags = END_STREAM if end_stream else 0
        limit = self.peer_max_frame
        out = self._out
        if len(block) <= limit:
            out.append(FRAME.pack((len(block) << 8) | HEADERS, flags | END_HEADERS, sid))
            out.append(block)
        else:
            out.append(h2.frame(HEADERS, flags, sid, block[:limit]))
            for i in range(limit, len(block), limit):
                last = i + limit >= len(block)
                more = END_HEADERS if last else 0
                out.append(h2.frame(CONTINUATION, more, sid, block[i : i + limit]))
        if end_stream:
            self._local_end(stream)
        return True

    def send_data(
        self,
        sid: int,
        data: bytes | memoryview,
        *,
        end_stream: bool = False,
        prefix: bytes = b"",
    ) -> bool:
        """Queues one DATA frame of ``prefix`` and ``data`` (a gRPC message's length prefix
        is given apart, so that a big message is not copied to add it); the frame must fit
        ``send_allowance(sid)``. False if the stream is already closed."""
        stream = self.streams.get(sid)
        if stream is None or self.terminated:
            return False
        size = len(prefix) + len(data)
        if size > min(stream.send_window, self.send_window, self.peer_max_frame):
            raise H2UsageError(f"{size} bytes exceed stream {sid}'s window or frame size")
        if stream.state is HALF_CLOSED_LOCAL:
            raise H2UsageError(f"stream {sid} already ended its side")
        stream.send_window -= size
        self.send_window -= size
        self.sent_since_ping = True
        self._out.append(
            FRAME.pack((size << 8) | DATA, END_STREAM if end_stream else 0, sid) + prefix
        )
        self._out.append(data)
        if end_stream:
            self._local_end(stream)
        return True

    def send_answer(
        self, sid: int, headers: bytes, prefix: bytes, data: bytes, trailers: bytes
    ) -> bool:
        """A whole answer at once, the common case of a unary call: HEADERS, one DATA frame
        (``prefix`` and ``data``, as ``send_data``) and trailers, then as ``end_response``.
        False, with nothing queued, unless it all fits the windows and the frame size."""
        stream = self.streams.get(sid)
        if stream is None or self.terminated:
            return False
        size = len(prefix) + len(data)
        limit = self.peer_max_frame
        if (
            size > stream.send_window
            or size > self.send_window
            or size > limit
            or len(headers) > limit
            or len(trailers) > limit
            or stream.state is HALF_CLOSED_LOCAL
        ):
            return False
        stream.send_window -= size
        self.send_window -= size
        self.sent_since_ping = True
        out = self._out
        out.append(
            FRAME.pack((len(headers) << 8) | HEADERS, END_HEADERS, sid)
            + headers
            + FRAME.pack((size << 8) | DATA, 0, sid)
            + prefix
        )
        out.append(data)
        out.append(FRAME.pack((len(trailers) << 8) | HEADERS, _END, sid) + trailers)
        if stream.state is OPEN:  # the peer is still sending: stop it (see ``end_response``)
            out.append(h2.rst_stream(sid, h2.NO_ERROR))
            self._close(stream, _BY_US)
        else:
            self._close(stream)
        return True

    def end_response(self, sid: int, trailers: bytes) -> None:
        """Ends our side with ``trailers``; a peer still sending its request is asked to
        stop without error (RST_STREAM NO_ERROR, as RFC 9113 section 8.1 allows a server
        that answered early)."""
        if self.send_headers(sid, trailers, end_stream=True):
            stream = self.streams.get(sid)
            if stream is not None:  # half-closed (local)
                self._out.append(h2.rst_stream(sid, h2.NO_ERROR))
                self._close(stream, _BY_US)

    def reset_stream(self, sid: int, code: int) -> None:
        """RST_STREAM with ``code``; nothing if the stream is already closed."""
        stream = self.streams.get(sid)
        if stream is None or self.terminated:
            return
        self._out.append(h2.rst_stream(sid, code))
        self._close(stream, _BY_US)

    def acknowledge_received_data(self, sid: int, at_least: int = 0) -> None:
        """Credits back the stream's window for the bytes received so far, once they are at
        least ``at_least`` (nothing once the peer has ended its side)."""
        stream = self.streams.get(sid)
        if stream is None or self.terminated:
            return
        unacked = stream.recv_unacked
        if unacked and unacked >= at_least and stream.state is not HALF_CLOSED_REMOTE:
            self._out.append(h2.window_update(sid, unacked))
            stream.recv_unacked = 0

    def release_input(self, sid: int, keep: int = 0) -> None:
        """The application now holds only ``keep`` of the bytes delivered on ``sid``."""
        stream = self.streams.get(sid)
        if stream is not None and stream.held > keep:
            self.input_bytes -= stream.held - keep
            stream.held = keep

    def send_ping(self, data: bytes) -> None:
        if not self.terminated:
            self._out.append(h2.frame(PING, 0, 0, data))

    def go_away(self) -> None:
        """GOAWAY NO_ERROR: streams open go on, new ones are refused."""
        if not self.goaway_sent:
            self.goaway_sent = True
            self._out.append(h2.goaway(self.last_sid, h2.NO_ERROR))
        self.accepting = False

    def close_connection(self, code: int, message: str = "") -> None:
        """GOAWAY with ``code``: the connection ends, nothing more is read or sent."""
        if self.terminated:
            return
        self.terminated = self.goaway_sent = True
        self.accepting = False
        self._out.append(h2.goaway(self.last_sid, code, message.encode()))
        self._buffer.clear()
        self._pending = None
        for stream in self.streams.values():
            stream.state = CLOSED
        self.streams.clear()
        self.input_bytes = 0
