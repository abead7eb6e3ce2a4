"""A client's HTTP/2 connection carrying gRPC calls, served on this member's event loop.

``GrpcConnection`` is the protocol of a client-URL connection once its first bytes were the
HTTP/2 preface (``kvserver.api.grpc.mux``). It reads frames, runs each call's handler as a
task, and writes the answers, in the same loop as the HTTP API and raft. It does this itself
rather than through grpc's own server because of cost: a put through grpc.aio (its Cython
server, its completion-queue threads, and a byte copy into it) cost the leader about four
times the CPU of the same put over HTTP, and calls reached raft one by one, so proposals
were no longer batched. Here a packet with calls from many clients is parsed in one go and
their proposals meet in the same raft step, as HTTP requests do.

What it implements, as a gRPC server needs (RFC 9113):

- Streams: a client opens one per call with HEADERS (method, metadata, ``grpc-timeout``),
  sends length-prefixed messages in DATA, and half-closes; the answer is HEADERS, messages
  in DATA, and trailers with ``grpc-status``. Calls end early on RST_STREAM (the handler's
  task is canceled) or at their deadline (``DEADLINE_EXCEEDED``). Unary methods run once
  their request is complete; streaming ones as soon as their HEADERS arrive.
- Flow control both ways. Received data is credited back to the connection as it arrives;
  to a stream, as its handler reads the messages (a unary request as it arrives; its size
  is bounded by the message limit), so a client cannot queue more than one stream window
  (``STREAM_WINDOW``) per stream ahead of a slow handler. Sent data waits for the peer's
  windows; a streaming handler's ``write`` waits while its stream has more than
  ``STREAM_HIGH_WATER`` bytes unsent, or while the socket's buffer is full (a call's own
  state and its request reader: ``kvserver.api.grpc.stream``).
- Limits: messages up to ``max_receive`` bytes (bigger: ``RESOURCE_EXHAUSTED``, as grpc-go
  says it), and the budgets of ``kvserver.api.grpc.budgets`` (``ServerSettings.limits``):
  concurrent streams (more: REFUSED_STREAM, which clients retry; a reset stream keeps its
  slot until its handler ends), stream resets a second, header block and header list
  bytes, table size updates, the decode cache, control answers the client does not read,
  answer bytes buffered, request bytes buffered, idle time and a default deadline for
  unary calls. Each time a client meets one, ``ServerSettings.budgets`` counts it.
- Buffered answers: above ``max_output_bytes`` queued for the client (windows closed, or
  a socket it does not read), no new call starts; when the socket's own buffer is over
  it, nothing more is read either (so unread SETTINGS and PING answers stop piling up).
  A connection that makes no progress for ``drain_timeout_s`` while over ends with
  GOAWAY ENHANCE_YOUR_CALM.
- Buffered requests: the connection's window is credited back as bytes arrive, and the
  bytes calls have not taken yet (partial messages and unread ones) are bounded by
  ``max_input_bytes``; the call whose bytes cross it ends with RESOURCE_EXHAUSTED.
  Crediting only as calls take their bytes would bound the same memory, but a client
  with several big requests half-sent would then wait for window that only completing
  one of them frees: a deadlock of honest clients.
- Keepalive, as etcd's gRPC server enforces it: a client may ping every
  ``keepalive_min_time`` s; more often than that three times without an answer in between
  ends the connection with GOAWAY ``too_many_pings``. The server pings a connection idle for
  ``keepalive_interval`` s and closes it if nothing arrives within ``keepalive_timeout`` s.
- A peer that breaks the protocol gets GOAWAY with the error's code and the connection
  closes; nothing a peer sends raises out of ``data_received``.
- ``go_away()`` (the server stopping) refuses new calls and closes the connection once the
  running ones end.

Not implemented, because no gRPC client needs them: server push, priorities (ignored), and
answers compressed with ``grpc-encoding`` (requests compressed with gzip or deflate are
accepted).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import zlib
from collections import Counter, deque

import grpc

from . import h2
from .budgets import BudgetCounts, Http2Limits, ResetBucket
from .h2 import FRAME, U32, ConnectionError_, HeaderDecoder
from .metrics import CallCounts
from .rpc import (
    RESPONSE_HEADERS,
    STREAM_STREAM,
    UNARY_UNARY,
    ClientIdentity,
    Method,
    RpcContext,
    error_status,
    parse_timeout,
    run_handler,
    status_code,
    trailers,
    trailers_only,
)
from .stream import STREAM_HIGH_WATER, Requests, Stream

log = logging.getLogger(__name__)

STREAM_WINDOW = 1024 * 1024
LINGER_S = 1.0  # after an error's GOAWAY, the client's bytes are dropped this long
MAX_PING_STRIKES = 2

_OK = status_code(grpc.StatusCode.OK)
_CANCELLED = status_code(grpc.StatusCode.CANCELLED)
_RESERVED = frozenset({"content-type", "te", "grpc-timeout", "grpc-encoding"})


class ServerSettings:
    """What every connection of one server shares."""

    def __init__(
        self,
        methods: dict[str, Method],
        *,
        max_receive: int,
        keepalive_min_time: float,
        keepalive_interval: float,
        keepalive_timeout: float,
        limits: Http2Limits | None = None,
    ):
        self.methods = methods
        self.limits = limits or Http2Limits()
        self.budgets = BudgetCounts()  # clients that met a budget, by budget
        self.per_address: Counter[str] = Counter()  # open connections by client IP
        self.max_receive = max_receive
        self.keepalive_min_time = keepalive_min_time
        self.keepalive_interval = keepalive_interval
        self.keepalive_timeout = keepalive_timeout
        self.connections: set[GrpcConnection] = set()
        self.accepted = 0  # connections so far (for tests and /metrics)
        self.calls = CallCounts()


class GrpcConnection(asyncio.Protocol):
    def __init__(self, settings: ServerSettings, identity: ClientIdentity):
        self.settings = settings
        self.limits = limits = settings.limits
        self.identity = identity
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.buffer = bytearray()
        self.preface_seen = False
        self.decoder = HeaderDecoder(
            limits.max_header_list_bytes,
            table_size=limits.header_table_bytes,
            cache_bytes=limits.decode_cache_bytes,
        )
        self.resets = ResetBucket(limits.max_resets_per_s, time.monotonic())
        self.handlers = 0  # handler tasks still running, a reset stream's included
        self.unary_running = 0  # ... of them, unary calls (the running budget counts these)
        self.deferred: deque[Stream] = deque()  # calls waiting for the output budget
        self.output_bytes = 0  # answer bytes queued in streams, not yet written
        self.input_bytes = 0  # request bytes received that no call has taken yet
        self.control_answers = 0  # SETTINGS/PING answers queued while writing is paused
        self.reading_paused = False  # the socket's buffer is over the output budget
        self.drain_timer: asyncio.TimerHandle | None = None
        self.drain_mark = 0  # output_bytes when the drain timer was armed
        self.last_active = time.monotonic()  # when a call last opened or ended
        self.idle_timer: asyncio.TimerHandle | None = None
        self.host = ""  # the client's IP address, once admitted
        self.streams: dict[int, Stream] = {}
        self.last_sid = 0  # the highest stream the client opened
        self.pending_headers: tuple[int, int, bytearray] | None = None  # sid, flags, block
        self.send_window = h2.DEFAULT_WINDOW
        self.peer_initial_window = h2.DEFAULT_WINDOW
        self.peer_max_frame = h2.DEFAULT_MAX_FRAME
        self.recv_unacked = 0  # received bytes not yet credited back: the window is the rest
        self.blocked: set[Stream] = set()  # streams with data waiting for a window
        self.out: list[bytes | memoryview] = []
        self.flush_scheduled = False
        self.paused = False  # the transport's buffer is full
        self.closing = False  # GOAWAY sent: no new calls
        self.failed = False  # GOAWAY with an error sent: nothing more is read
        self.last_recv = time.monotonic()
        self.ping_strikes = 0
        self.last_ping = 0.0
        self.reset_ping_strikes = False
        self.keepalive: asyncio.TimerHandle | None = None
        self.ping_timeout: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        settings = self.settings
        host = self.identity.address.rpartition(":")[0] or self.identity.address
        if len(settings.connections) >= self.limits.max_connections:
            self._refuse("connections", "too many connections")
            return
        if settings.per_address[host] >= self.limits.max_connections_per_address:
            self._refuse("connections_per_address", "too many connections from this address")
            return
        self.host = host
        settings.per_address[host] += 1
        settings.connections.add(self)
        settings.accepted += 1
        limits = self.limits
        self.out.append(
            h2.settings_frame(
                {
                    h2.SETTINGS_HEADER_TABLE_SIZE: limits.header_table_bytes,
                    h2.SETTINGS_MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
                    h2.SETTINGS_INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                    h2.SETTINGS_MAX_HEADER_LIST_SIZE: limits.max_header_list_bytes,
                }
            )
        )
        self.out.append(h2.window_update(0, self._conn_window - h2.DEFAULT_WINDOW))
        self.schedule_flush()
        self.keepalive = self.loop.call_later(
            self.settings.keepalive_interval, self._keepalive_check
        )
        self.idle_timer = self.loop.call_later(limits.idle_timeout_s, self._idle_check)

    @property
    def _conn_window(self) -> int:
        return max(h2.DEFAULT_WINDOW, self.limits.max_input_bytes)

    def data_received(self, data: bytes) -> None:
        if self.failed:
            return  # lingering after GOAWAY: what arrives is dropped
        self.last_recv = time.monotonic()
        buffer = self.buffer
        buffer += data
        try:
            if not self.preface_seen:
                if len(buffer) < len(h2.PREFACE):
                    return
                if bytes(buffer[: len(h2.PREFACE)]) != h2.PREFACE:
                    raise ConnectionError_(h2.PROTOCOL_ERROR, "bad connection preface")
                del buffer[: len(h2.PREFACE)]
                self.preface_seen = True
            self._read_frames()
        except ConnectionError_ as exc:
            if exc.budget is not None:
                self.settings.budgets[exc.budget] += 1
            self._fail(exc.code, str(exc))
            return
        except Exception:
            log.exception("gRPC: a connection's frames could not be handled")
            self._fail(h2.INTERNAL_ERROR, "internal error")
            return
        if self.recv_unacked >= self._conn_window // 4:
            self.out.append(h2.window_update(0, self.recv_unacked))
            self.recv_unacked = 0
        self.flush()

    def eof_received(self) -> bool | None:
        return None  # close; the handlers are canceled in connection_lost

    def _refuse(self, budget: str, message: str) -> None:
        self.settings.budgets[budget] += 1
        self.failed = self.closing = True
        assert self.transport is not None
        self.transport.write(
            h2.settings_frame({}) + h2.goaway(0, h2.ENHANCE_YOUR_CALM, message.encode())
        )
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.settings.connections:
            self.settings.connections.discard(self)
            self.settings.per_address[self.host] -= 1
            if not self.settings.per_address[self.host]:
                del self.settings.per_address[self.host]
        for handle in (self.keepalive, self.ping_timeout, self.idle_timer, self.drain_timer):
            if handle is not None:
                handle.cancel()
        self.deferred.clear()
        for stream in list(self.streams.values()):
            self._drop(stream)
        self.streams.clear()
        self.blocked.clear()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.control_answers = 0
        for stream in list(self.blocked):
            self.flush_stream(stream, schedule=False)
        self._output_progress()
        for stream in list(self.streams.values()):
            if stream.drained is not None:
                stream.drained.set()
        self.schedule_flush()

    # --- reading frames ------------------------------------------------------------------------

    def _read_frames(self) -> None:
        buffer = self.buffer
        view = memoryview(buffer)
        pos = 0
        end = len(buffer)
        try:
            while end - pos >= 9:
                length_type, flags, sid = FRAME.unpack_from(buffer, pos)
                length = length_type >> 8
                if length > h2.DEFAULT_MAX_FRAME:
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
        if self.pending_headers is not None and kind != h2.CONTINUATION:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a header block was interrupted")
        if kind == h2.DATA:
            self._on_data(flags, sid, payload)
        elif kind == h2.HEADERS:
            self._on_headers(flags, sid, payload)
        elif kind == h2.CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif kind == h2.SETTINGS:
            self._on_settings(flags, sid, payload)
        elif kind == h2.WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif kind == h2.PING:
            self._on_ping(flags, sid, payload)
        elif kind == h2.RST_STREAM:
            if sid == 0 or len(payload) != 4:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "bad RST_STREAM")
            stream = self.streams.get(sid)
            if stream is not None:
                if not self.resets.take(time.monotonic()):
                    raise ConnectionError_(
                        h2.ENHANCE_YOUR_CALM, "too many stream resets", budget="resets"
                    )
                self._drop(stream)
        elif kind == h2.GOAWAY:
            if sid != 0:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "GOAWAY on a stream")
            self.closing = True  # the client opens no more calls here
        elif kind == h2.PUSH_PROMISE:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a client may not push")
        elif kind == h2.PRIORITY:
            if sid == 0 or len(payload) != 5:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "bad PRIORITY")
        # other frame types are ignored, as RFC 9113 asks

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & h2.ACK:
            if payload:
                raise ConnectionError_(h2.FRAME_SIZE_ERROR, "SETTINGS ack with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "bad SETTINGS length")
        for i in range(0, len(payload), 6):
            key, value = h2.SETTING.unpack_from(payload, i)
            if key == h2.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > h2.MAX_WINDOW:
                    raise ConnectionError_(h2.FLOW_CONTROL_ERROR, "window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == h2.SETTINGS_MAX_FRAME_SIZE:
                if not h2.DEFAULT_MAX_FRAME <= value <= h2.MAX_FRAME_LIMIT:
                    raise ConnectionError_(h2.PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == h2.SETTINGS_ENABLE_PUSH and value > 1:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")
        self._control_answer(h2.frame(h2.SETTINGS, h2.ACK, 0))
        for stream in list(self.blocked):
            self.flush_stream(stream, schedule=False)

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
            for blocked in list(self.blocked):
                self.flush_stream(blocked, schedule=False)
            return
        stream = self.streams.get(sid)
        if stream is None:
            return  # a closed stream's late update
        if increment == 0 or stream.send_window + increment > h2.MAX_WINDOW:
            self._reset(stream, h2.PROTOCOL_ERROR if increment == 0 else h2.FLOW_CONTROL_ERROR)
            return
        stream.send_window += increment
        self.flush_stream(stream, schedule=False)

    def _on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ConnectionError_(h2.FRAME_SIZE_ERROR, "bad PING length")
        if flags & h2.ACK:
            if self.ping_timeout is not None:
                self.ping_timeout.cancel()
                self.ping_timeout = None
            return
        now = time.monotonic()
        if self.reset_ping_strikes:  # we sent data since the last ping: it was not idle
            self.reset_ping_strikes = False
            self.ping_strikes = 0
        elif now - self.last_ping < self.settings.keepalive_min_time:
            self.ping_strikes += 1
            if self.ping_strikes > MAX_PING_STRIKES:
                raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "too_many_pings")
        self.last_ping = now
        self._control_answer(h2.frame(h2.PING, h2.ACK, 0, payload))

    def _control_answer(self, frame: bytes) -> None:
        """Queues a SETTINGS or PING answer; a client that keeps asking while it does not
        read them meets the control-frame budget."""
        if self.paused:
            self.control_answers += 1
            if self.control_answers > self.limits.max_control_answers:
                raise ConnectionError_(
                    h2.ENHANCE_YOUR_CALM, "too many control frames unread", "control_frames"
                )
        self.out.append(frame)

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & h2.PADDED:
            if not payload:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "bad padding")
            start, end = 1, len(payload) - payload[0]
        if flags & h2.PRIORITY_FLAG:
            start += 5
        if start > end:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "bad padding")
        block = bytearray(payload[start:end])
        if flags & h2.END_HEADERS:
            self._on_header_block(sid, flags, bytes(block))
        else:
            self.pending_headers = (sid, flags, block)

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        pending = self.pending_headers
        if pending is None or pending[0] != sid:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "unexpected CONTINUATION")
        block = pending[2]
        block += payload
        if len(block) > self.limits.max_header_block_bytes:
            raise ConnectionError_(h2.ENHANCE_YOUR_CALM, "header block too large", "header_block")
        if flags & h2.END_HEADERS:
            self.pending_headers = None
            self._on_header_block(sid, pending[1], bytes(block))

    def _on_header_block(self, sid: int, flags: int, block: bytes) -> None:
        headers = self.decoder.decode(block)  # always: the decoder's table must keep step
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: only their END_STREAM counts
            if flags & h2.END_STREAM:
                self._end_of_requests(stream)
            return
        if sid <= self.last_sid or sid % 2 == 0:
            if sid <= self.last_sid:
                raise ConnectionError_(h2.STREAM_CLOSED, "HEADERS on a closed stream")
            raise ConnectionError_(h2.PROTOCOL_ERROR, "a client stream id must be odd")
        self.last_sid = sid
        if self.closing:
            self.out.append(h2.rst_stream(sid, h2.REFUSED_STREAM))
            return
        if max(len(self.streams), self.handlers) >= self.limits.max_concurrent_streams:
            self.settings.budgets["streams"] += 1
            self.out.append(h2.rst_stream(sid, h2.REFUSED_STREAM))
            return
        self._open(sid, flags, headers)

    def _open(self, sid: int, flags: int, headers: list[tuple[str, str]]) -> None:
        path = method_name = content_type = None
        timeout: float | None = None
        encoding = None
        metadata: list[tuple[str, str]] = []
        for name, value in headers:
            if name[0] == ":":
                if name == ":path":
                    path = value
                elif name == ":method":
                    method_name = value
                continue
            if name == "content-type":
                content_type = value
            elif name == "grpc-timeout":
                timeout = parse_timeout(value)
            elif name == "grpc-encoding":
                encoding = value
            elif name not in _RESERVED:
                metadata.append((name, _binary(value) if name.endswith("-bin") else value))
        if method_name != "POST" or not (content_type or "").startswith("application/grpc"):
            self._answer_only(sid, flags, grpc.StatusCode.INTERNAL, "raftkv: not a gRPC request")
            return
        method = self.settings.methods.get(path or "")
        if method is None:
            self._answer_only(
                sid, flags, grpc.StatusCode.UNIMPLEMENTED, _unknown_method(path or "")
            )
            return
        assert path is not None
        stream = Stream(sid, self, path, method, self.peer_initial_window)
        self.settings.calls.started(path)
        self.last_active = time.monotonic()
        stream.encoding = encoding if encoding not in (None, "identity") else None
        deadline = None
        if timeout is None and method.kind == UNARY_UNARY:
            timeout = self.limits.default_call_timeout_s
            stream.default_deadline = True
        if timeout is not None:
            deadline = time.monotonic() + timeout
            stream.deadline = self.loop.call_later(timeout, self._deadline_passed, stream)
        stream.context = RpcContext(self.identity, tuple(metadata), deadline, stream)
        self.streams[sid] = stream
        if method.kind == STREAM_STREAM:
            self._start(stream)
        if flags & h2.END_STREAM:
            self._end_of_requests(stream)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(h2.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if self.recv_unacked + size > self._conn_window:
            raise ConnectionError_(
                h2.FLOW_CONTROL_ERROR, "the connection's window is exceeded", "input"
            )
        self.recv_unacked += size  # credited back when a quarter of the window is used
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid > self.last_sid:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we answered or reset: its data is dropped
        if flags & h2.PADDED:
            if not payload or payload[0] >= size:
                raise ConnectionError_(h2.PROTOCOL_ERROR, "bad padding")
            payload = payload[1 : size - payload[0]]
        if stream.recv_unacked + size > STREAM_WINDOW:  # the stream's window is what is unacked
            self._reset(stream, h2.FLOW_CONTROL_ERROR)
            return
        stream.recv_unacked += size
        self._add_request_bytes(stream, payload)
        if stream.closed:
            return
        if flags & h2.END_STREAM:
            stream.recv_unacked = 0  # nothing more comes on this stream
            self._end_of_requests(stream)
        elif stream.method.kind != STREAM_STREAM:
            # a unary request is credited as it arrives: its size is bounded by the limit
            if stream.recv_unacked >= STREAM_WINDOW // 2:
                self.credit_stream(stream)
        elif not stream.messages:
            # a stream's requests are credited as its handler reads them (``_Requests``),
            # or now if the handler waits for the rest of a message
            self.credit_stream(stream)

    def _add_request_bytes(self, stream: Stream, payload: bytes) -> None:
        if self.input_bytes + len(payload) > self.limits.max_input_bytes:
            self.settings.budgets["input"] += 1
            self._finish_early(
                stream,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "raftkv: too many request bytes waiting on this connection",
            )
            return
        stream.held += len(payload)
        self.input_bytes += len(payload)
        body = stream.body
        body += payload
        max_receive = self.settings.max_receive
        added = False
        while len(body) >= 5:
            compressed = body[0]
            length = U32.unpack_from(body, 1)[0]
            if length > max_receive:
                self._finish_early(
                    stream,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"grpc: received message larger than max ({length} vs. {max_receive})",
                )
                return
            if len(body) < 5 + length:
                break
            message = bytes(body[5 : 5 + length])
            del body[: 5 + length]
            if compressed:
                try:
                    message = self._decompress(stream, message)
                except _BadMessage as exc:
                    self._finish_early(stream, exc.code, exc.details)
                    return
            stream.messages.append(message)
            added = True
        if added:
            stream.wake_reader()

    def _decompress(self, stream: Stream, message: bytes) -> bytes:
        encoding = stream.encoding
        if encoding not in ("gzip", "deflate"):
            raise _BadMessage(
                grpc.StatusCode.UNIMPLEMENTED if encoding else grpc.StatusCode.INTERNAL,
                f"grpc: Decompressor is not installed for grpc-encoding {encoding!r}",
            )
        wbits = 31 if encoding == "gzip" else 15
        inflater = zlib.decompressobj(wbits)
        try:
            data = inflater.decompress(message, self.settings.max_receive + 1)
        except zlib.error as exc:
            raise _BadMessage(
                grpc.StatusCode.INTERNAL, f"grpc: failed to decompress: {exc}"
            ) from None
        if len(data) > self.settings.max_receive or inflater.unconsumed_tail:
            raise _BadMessage(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "grpc: received message after decompression larger than max "
                f"({self.settings.max_receive})",
            )
        return data

    def _end_of_requests(self, stream: Stream) -> None:
        stream.remote_closed = True
        if stream.body:
            self._finish_early(stream, grpc.StatusCode.INTERNAL, "grpc: a message was cut short")
            return
        if stream.method.kind == STREAM_STREAM:
            stream.wake_reader()
            return
        if len(stream.messages) != 1:
            self._finish_early(
                stream,
                grpc.StatusCode.INTERNAL if stream.messages else grpc.StatusCode.UNIMPLEMENTED,
                "grpc: a unary call needs exactly one request message",
            )
            return
        self._start(stream)

    def _start(self, stream: Stream) -> None:
        """Runs the call's handler now, or once the answers buffered for this client are
        back under the output budget."""
        if self._over_output():
            self.settings.budgets["output"] += 1
            self.deferred.append(stream)
            self._arm_drain_timer()
            return
        unary = stream.method.kind == UNARY_UNARY
        if unary and self.unary_running >= self.limits.max_running_calls:
            self.settings.budgets["running"] += 1
            self.deferred.append(stream)
            return
        self._run(stream)

    def _run(self, stream: Stream) -> None:
        self.handlers += 1
        if stream.method.kind == UNARY_UNARY:
            self.unary_running += 1
        stream.task = self.loop.create_task(self._serve(stream))

    # --- running a call ------------------------------------------------------------------------

    async def _serve(self, stream: Stream) -> None:
        method = stream.method
        context = stream.context
        assert context is not None
        if method.kind == STREAM_STREAM:
            request: object = Requests(stream)
        else:
            request = stream.messages.popleft()
            self._release_input(stream, stream.held)
        try:
            answer = await run_handler(method, context, request, stream.write_message)
            if answer is None:
                self.finish(stream, _OK)
            else:
                self.answer_unary(stream, answer)
        except asyncio.CancelledError:
            if stream.ended_with is not None:
                self.finish(stream, *stream.ended_with)
            elif stream.deadline_hit:
                self.finish(
                    stream, status_code(grpc.StatusCode.DEADLINE_EXCEEDED), "Deadline Exceeded"
                )
            elif not stream.closed and stream.trailers is None:
                self._reset(stream, h2.CANCEL)  # the server is stopping
        except Exception as exc:
            self.finish(stream, *error_status(method, exc))
        finally:
            self.handlers -= 1
            if method.kind == UNARY_UNARY:
                self.unary_running -= 1
            if stream.deadline is not None:
                stream.deadline.cancel()
            if self.deferred:
                self._output_progress()

    def answer_unary(self, stream: Stream, data: bytes) -> None:
        if stream.closed:
            return
        size = len(data) + 5
        if (
            not stream.headers_sent
            and size <= stream.send_window
            and size <= self.send_window
            and size <= self.peer_max_frame
        ):  # the common case: the answer's three frames in one write
            stream.send_window -= size
            self.send_window -= size
            sid = stream.sid
            self.out.append(
                FRAME.pack((len(RESPONSE_HEADERS) << 8) | h2.HEADERS, h2.END_HEADERS, sid)
                + RESPONSE_HEADERS
                + FRAME.pack((size << 8) | h2.DATA, 0, sid)
                + b"\x00"
                + U32.pack(len(data))
            )
            self.out.append(data)
            self._send_trailers(stream, trailers(_OK))
            self.settings.calls.handled(stream.path, _OK)
            self.schedule_flush()
            return
        stream.queue_message(data)
        stream.trailers = trailers(_OK)
        self.settings.calls.handled(stream.path, _OK)
        self.flush_stream(stream)

    def finish(self, stream: Stream, code: int, details: str = "") -> None:
        """Ends the call with a status once what it wrote is sent."""
        if stream.closed or stream.trailers is not None:
            return
        self.settings.calls.handled(stream.path, code)
        if not stream.headers_sent and not stream.outbound:
            stream.headers_sent = True
            self._send_headers(stream.sid, trailers_only(code, details), end_stream=True)
            self._closed(stream)
            self.schedule_flush()
            return
        stream.trailers = trailers(code, details)
        self.flush_stream(stream)

    def _finish_early(self, stream: Stream, code: grpc.StatusCode, details: str) -> None:
        """A call refused before its handler saw it (or while it runs)."""
        if stream.task is not None:
            stream.task.cancel()
        self.finish(stream, status_code(code), details)

    def _answer_only(self, sid: int, flags: int, code: grpc.StatusCode, details: str) -> None:
        """A call answered with a status from its HEADERS alone (it never becomes a stream)."""
        self._send_headers(sid, trailers_only(status_code(code), details), end_stream=True)
        if not flags & h2.END_STREAM:  # stop the client's sending
            self.out.append(h2.rst_stream(sid, h2.NO_ERROR))

    def _deadline_passed(self, stream: Stream) -> None:
        stream.deadline = None
        stream.deadline_hit = True
        if stream.default_deadline:
            self.settings.budgets["deadline"] += 1
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        else:
            self.finish(stream, status_code(grpc.StatusCode.DEADLINE_EXCEEDED), "Deadline Exceeded")

    # --- writing -------------------------------------------------------------------------------

    def _send_headers(self, sid: int, block: bytes, *, end_stream: bool) -> None:
        self.reset_ping_strikes = True
        flags = h2.END_STREAM if end_stream else 0
        limit = self.peer_max_frame
        if len(block) <= limit:
            self.out.append(h2.frame(h2.HEADERS, flags | h2.END_HEADERS, sid, block))
            return
        self.out.append(h2.frame(h2.HEADERS, flags, sid, block[:limit]))
        for i in range(limit, len(block), limit):
            last = i + limit >= len(block)
            kind_flags = h2.END_HEADERS if last else 0
            self.out.append(h2.frame(h2.CONTINUATION, kind_flags, sid, block[i : i + limit]))

    def _send_trailers(self, stream: Stream, block: bytes) -> None:
        self._send_headers(stream.sid, block, end_stream=True)
        self._closed(stream)

    def flush_stream(self, stream: Stream, *, schedule: bool = True) -> None:
        """Sends what the windows let through of ``stream``'s answer, then its trailers."""
        if stream.closed or (not stream.outbound and stream.trailers is None):
            return  # nothing to send yet (e.g. a window update before the answer)
        out = self.out
        if not stream.headers_sent:
            stream.headers_sent = True
            self._send_headers(stream.sid, RESPONSE_HEADERS, end_stream=False)
        outbound = stream.outbound
        sid = stream.sid
        socket_full = self.reading_paused
        while outbound:
            allowed = min(stream.send_window, self.send_window, self.peer_max_frame)
            if allowed <= 0 or socket_full:
                self.blocked.add(stream)
                break
            chunk = outbound[0]
            if len(chunk) <= allowed:
                outbound.popleft()
            else:
                outbound[0] = chunk[allowed:]
                chunk = chunk[:allowed]
            size = len(chunk)
            stream.send_window -= size
            self.send_window -= size
            stream.outbound_bytes -= size
            self.output_bytes -= size
            out.append(FRAME.pack((size << 8) | h2.DATA, 0, sid))
            out.append(chunk)
            self.reset_ping_strikes = True
        else:
            self.blocked.discard(stream)
            if stream.trailers is not None:
                self._send_trailers(stream, stream.trailers)
        if stream.drained is not None and stream.outbound_bytes <= STREAM_HIGH_WATER:
            stream.drained.set()
        if self.deferred or self.drain_timer is not None:
            self._output_progress()
        if schedule:
            self.schedule_flush()

    def credit_stream(self, stream: Stream) -> None:
        if stream.recv_unacked and not stream.remote_closed:
            self.out.append(h2.window_update(stream.sid, stream.recv_unacked))
            self.schedule_flush()
        stream.recv_unacked = 0
        if stream.method.kind == STREAM_STREAM:
            # the messages its handler took no longer wait here; a partial one still does
            # (a unary call's request is taken when the call starts)
            self._release_input(stream, stream.held - len(stream.body))

    def _release_input(self, stream: Stream, size: int) -> None:
        if size > 0:
            stream.held -= size
            self.input_bytes -= size

    # --- the output budget ---------------------------------------------------------------------

    @property
    def congested(self) -> bool:
        """Over the output budget: streaming handlers wait in ``write``."""
        return self._over_output()

    def _over_output(self) -> bool:
        return self._buffered_output() > self.limits.max_output_bytes

    def _arm_drain_timer(self) -> None:
        if self.drain_timer is None:
            self.drain_mark = self._buffered_output()
            self.drain_timer = self.loop.call_later(self.limits.drain_timeout_s, self._drain_check)

    def _buffered_output(self) -> int:
        written = self.transport.get_write_buffer_size() if self.transport is not None else 0
        return self.output_bytes + written

    def _drain_check(self) -> None:
        """Over the output budget for a whole drain timeout: ends the connection if the
        client read nothing meanwhile, else waits another timeout."""
        self.drain_timer = None
        if not self._over_output() and not self.reading_paused:
            self._output_progress()
            return
        if self._buffered_output() >= self.drain_mark:
            self.settings.budgets["output"] += 1
            self._fail(h2.ENHANCE_YOUR_CALM, "answers not read in time")
            return
        self._arm_drain_timer()

    def _output_progress(self) -> None:
        """Answers were written: read again once the socket's buffer is under budget (the
        client's window updates must get through even while answers wait for them), and
        start waiting calls once everything buffered is."""
        transport = self.transport
        if (
            self.reading_paused
            and transport is not None
            and not transport.is_closing()
            and transport.get_write_buffer_size() <= self.limits.max_output_bytes
        ):
            self.reading_paused = False
            transport.resume_reading()
        if self._over_output():
            self._arm_drain_timer()
            return
        if self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        while self.deferred and not self._over_output():
            stream = self.deferred[0]
            if stream.closed:
                self.deferred.popleft()
                continue
            if (
                stream.method.kind == UNARY_UNARY
                and self.unary_running >= self.limits.max_running_calls
            ):
                break  # its turn comes when a unary call ends
            self.deferred.popleft()
            self._run(stream)
        for stream in list(self.streams.values()):
            if stream.drained is not None:
                stream.drained.set()

    def schedule_flush(self) -> None:
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Writes every frame queued since the last flush in one go."""
        self.flush_scheduled = False
        out = self.out
        if not out:
            return
        self.out = []
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(b"".join(out))
            if (
                not self.reading_paused
                and transport.get_write_buffer_size() > self.limits.max_output_bytes
            ):  # the client does not read: stop reading it too, until it does
                self.settings.budgets["output"] += 1
                self.reading_paused = True
                transport.pause_reading()
                self._arm_drain_timer()
        if self.closing and not self.streams and transport is not None:
            transport.close()

    # --- ending streams and the connection -----------------------------------------------------

    def _closed(self, stream: Stream) -> None:
        stream.closed = True
        self.streams.pop(stream.sid, None)
        self.blocked.discard(stream)
        self.last_active = time.monotonic()
        if stream.outbound_bytes:
            self.output_bytes -= stream.outbound_bytes
            stream.outbound_bytes = 0
            stream.outbound.clear()
        self._release_input(stream, stream.held)
        if stream.deadline is not None:
            stream.deadline.cancel()
            stream.deadline = None
        if not stream.remote_closed:  # answered before the client finished: stop its sending
            stream.remote_closed = True
            self.out.append(h2.rst_stream(stream.sid, h2.NO_ERROR))
        stream.wake_reader()
        if stream.drained is not None:
            stream.drained.set()

    def _reset(self, stream: Stream, code: int) -> None:
        if not stream.closed:
            if stream.trailers is None:
                self.settings.calls.handled(stream.path, _CANCELLED)
            stream.remote_closed = True  # no RST_STREAM(NO_ERROR) after this one
            self.out.append(h2.rst_stream(stream.sid, code))
            self._closed(stream)
            self.schedule_flush()
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()

    def _drop(self, stream: Stream) -> None:
        """The client reset the stream or went away: the call ends without an answer."""
        if not stream.closed and stream.trailers is None:
            self.settings.calls.handled(stream.path, _CANCELLED)
        stream.remote_closed = True
        self._closed(stream)
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()

    def go_away(self) -> None:
        """The server is stopping: no new calls; close once the running ones end."""
        if self.closing:
            return
        self.closing = True
        self.out.append(h2.goaway(self.last_sid, h2.NO_ERROR))
        self.schedule_flush()

    def abort(self) -> None:
        """Ends every call and closes the connection now."""
        for stream in list(self.streams.values()):
            self._drop(stream)
        if self.transport is not None:
            self.transport.close()

    def _fail(self, code: int, message: str) -> None:
        """GOAWAY with ``code``, then a lingering close, as nginx closes: our side of the
        socket ends at once, and what the client still sends is read and dropped for up to
        ``LINGER_S``. Closing at once would make the kernel answer the client's next bytes
        with a reset, which can destroy the GOAWAY before the client reads it."""
        log.info("gRPC: closing a connection from %s: %s", self.identity.address, message)
        self.closing = True
        self.failed = True
        self.out.append(h2.goaway(self.last_sid, code, message.encode()))
        self.flush()
        for stream in list(self.streams.values()):
            self._drop(stream)
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(LINGER_S, transport.close)
        else:
            transport.close()

    def _keepalive_check(self) -> None:
        interval = self.settings.keepalive_interval
        idle = time.monotonic() - self.last_recv
        if idle >= interval and self.ping_timeout is None:
            self.out.append(h2.frame(h2.PING, 0, 0, b"raftkv\0\0"))
            self.schedule_flush()
            self.ping_timeout = self.loop.call_later(
                self.settings.keepalive_timeout, self._fail, h2.NO_ERROR, "keepalive timed out"
            )
            idle = 0.0
        self.keepalive = self.loop.call_later(max(1.0, interval - idle), self._keepalive_check)

    def _idle_check(self) -> None:
        """No call open for ``idle_timeout_s``: GOAWAY, as grpc-go's MaxConnectionIdle."""
        timeout = self.limits.idle_timeout_s
        idle = time.monotonic() - self.last_active
        if self.streams or self.handlers or idle < timeout:
            wait = timeout if (self.streams or self.handlers) else timeout - idle
            self.idle_timer = self.loop.call_later(max(0.1, wait), self._idle_check)
            return
        self.idle_timer = None
        self.settings.budgets["idle"] += 1
        self.go_away()
        self.schedule_flush()


class _BadMessage(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


def _binary(value: str) -> str:
    """A ``-bin`` header's value, base64-decoded (as text: the servicers read none of them)."""
    try:
        return base64.b64decode(value + "=" * (-len(value) % 4)).decode("utf-8", "replace")
    except ValueError:
        return value


def _unknown_method(path: str) -> str:
    service, _, method = path.lstrip("/").partition("/")
    return f"unknown method {method} for service {service}"
