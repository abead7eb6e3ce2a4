"""A client's HTTP/2 connection carrying gRPC calls, served on this member's event loop.

``GrpcConnection`` is the protocol of a client-URL connection once its first bytes were the
HTTP/2 preface (``kvserver.api.grpc.mux``). It runs each call's handler as a task and writes
the answers, in the same loop as the HTTP API and raft. It does this itself rather than
through grpc's own server because of cost: a put through grpc.aio (its Cython server, its
completion-queue threads, and a byte copy into it) cost the leader about four times the CPU
of the same put over HTTP, and calls reached raft one by one, so proposals were no longer
batched. Here a packet with calls from many clients is parsed in one go and their proposals
meet in the same raft step, as HTTP requests do.

HTTP/2 itself is ``kvserver.api.grpc.h2_machine.H2Machine``, a state machine without I/O:
this class feeds it the bytes read and acts on its events (``h2_events``), and writes what
it queues. The machine owns frames, stream states, both directions' flow control, and every
budget about what the client sends (streams, resets, header blocks and lists, table size
updates, the decode cache, unread control answers, request bytes held, ping strikes). What
is left here is I/O and gRPC:

- Calls: a client opens a stream per call with HEADERS (method, metadata,
  ``grpc-timeout``), sends length-prefixed messages in DATA, and half-closes; the answer is
  HEADERS, messages in DATA, and trailers with ``grpc-status``. Calls end early on
  RST_STREAM (the handler's task is canceled) or at their deadline (``DEADLINE_EXCEEDED``).
  Unary methods run once their request is complete; streaming ones as soon as their
  HEADERS arrive. A request's window is credited back as the call takes its bytes (a unary
  request as it arrives; its size is bounded by the message limit; a stream's as its handler
  reads: ``kvserver.api.grpc.stream``), so a client cannot queue more than one stream window
  (``STREAM_WINDOW``) per stream ahead of a slow handler. Answers wait for the peer's
  windows; a streaming handler's ``write`` waits while its stream has more than
  ``STREAM_HIGH_WATER`` bytes unsent, or while the socket's buffer is full.
- Limits: messages up to ``max_receive`` bytes (bigger: ``RESOURCE_EXHAUSTED``, as grpc-go
  says it); a call whose request bytes cross the machine's input budget ends with
  RESOURCE_EXHAUSTED; and the budgets of ``kvserver.api.grpc.budgets`` that need a clock or
  the socket: answer bytes buffered, running unary calls, idle time, a default deadline for
  unary calls, connections per process and per address. Each time a client meets one,
  ``ServerSettings.budgets`` counts it.
- Buffered answers: above ``max_output_bytes`` queued for the client (windows closed, or
  a socket it does not read), no new call starts; when the socket's own buffer is over
  it, nothing more is read either (so unread SETTINGS and PING answers stop piling up).
  A connection that makes no progress for ``drain_timeout_s`` while over ends with
  GOAWAY ENHANCE_YOUR_CALM.
- Keepalive, as etcd's gRPC server enforces it: the machine ends a connection that pings
  too often (GOAWAY ``too_many_pings``); the server pings a connection idle for
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
import functools
import logging
import time
import zlib
from collections import Counter, deque

import grpc

from . import h2
from .budgets import BudgetCounts, Http2Limits
from .h2 import U32, HeaderDecoder
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
    WindowOpened,
)
from .h2_machine import STREAM_WINDOW, H2Machine
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

LINGER_S = 1.0  # after an error's GOAWAY, the client's bytes are dropped this long

_OK = status_code(grpc.StatusCode.OK)
_CANCELLED = status_code(grpc.StatusCode.CANCELLED)
_RESERVED = frozenset({"content-type", "te", "grpc-timeout", "grpc-encoding"})
_UNARY_CREDIT = STREAM_WINDOW // 2  # a unary request's window is credited past this


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
        self.machine = H2Machine(
            limits,
            clock=time.monotonic,
            budgets=settings.budgets,
            keepalive_min_time=settings.keepalive_min_time,
        )
        self.handlers = 0  # handler tasks still running, a reset stream's included
        self.unary_running = 0  # ... of them, unary calls (the running budget counts these)
        self.deferred: deque[Stream] = deque()  # calls waiting for the output budget
        self.output_bytes = 0  # answer bytes queued in streams, not yet written
        self.reading_paused = False  # the socket's buffer is over the output budget
        self.drain_timer: asyncio.TimerHandle | None = None
        self.drain_mark = 0  # output_bytes when the drain timer was armed
        self.last_active = time.monotonic()  # when a call last opened or ended
        self.idle_timer: asyncio.TimerHandle | None = None
        self.host = ""  # the client's IP address, once admitted
        self.streams: dict[int, Stream] = {}  # the calls not yet ended
        self.blocked: set[Stream] = set()  # streams with data waiting for a window
        self.flush_scheduled = False
        self.paused = False  # the transport's buffer is full
        self.closing = False  # GOAWAY sent or received: no new calls
        self.failed = False  # GOAWAY with an error sent: nothing more is read
        self.last_recv = time.monotonic()
        self.keepalive: asyncio.TimerHandle | None = None
        self.ping_timeout: asyncio.TimerHandle | None = None

    @property
    def decoder(self) -> HeaderDecoder:
        return self.machine.decoder

    @property
    def input_bytes(self) -> int:
        """Request bytes received that no call has taken yet."""
        return self.machine.input_bytes

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
        self.machine.initiate_connection()
        self.schedule_flush()
        self.keepalive = self.loop.call_later(
            self.settings.keepalive_interval, self._keepalive_check
        )
        self.idle_timer = self.loop.call_later(self.limits.idle_timeout_s, self._idle_check)

    def data_received(self, data: bytes) -> None:
        if self.failed:
            return  # lingering after GOAWAY: what arrives is dropped
        self.last_recv = time.monotonic()
        try:
            self._handle(self.machine.receive_data(data))
        except Exception:
            log.exception("gRPC: a connection's frames could not be handled")
            self._fail(h2.INTERNAL_ERROR, "internal error")
            return
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
        self.machine.set_writable(False)

    def resume_writing(self) -> None:
        self.paused = False
        self.machine.set_writable(True)
        for stream in list(self.blocked):
            self.flush_stream(stream, schedule=False)
        self._output_progress()
        for stream in list(self.streams.values()):
            if stream.drained is not None:
                stream.drained.set()
        self.schedule_flush()

    # --- the machine's events ------------------------------------------------------------------

    def _handle(self, events: list[Event]) -> None:
        streams = self.streams
        for event in events:
            if isinstance(event, DataReceived):
                stream = streams.get(event.stream_id)
                if stream is not None:  # else: a call already answered
                    self._on_data(stream, event.data, event.end_stream)
            elif isinstance(event, RequestReceived):
                self._open(event.stream_id, event.end_stream, event.headers)
            elif isinstance(event, StreamReset):
                stream = streams.get(event.stream_id)
                if stream is not None:
                    self._drop(stream)
            elif isinstance(event, WindowOpened):
                sid = event.stream_id
                if sid == 0:
                    for blocked in list(self.blocked):
                        self.flush_stream(blocked, schedule=False)
                else:
                    stream = streams.get(sid)
                    if stream is not None:
                        self.flush_stream(stream, schedule=False)
            elif isinstance(event, StreamEnded):
                stream = streams.get(event.stream_id)
                if stream is not None:
                    self._end_of_requests(stream)
            elif isinstance(event, InputBudgetExceeded):
                stream = streams.get(event.stream_id)
                if stream is not None:
                    self._finish_early(
                        stream,
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        "raftkv: too many request bytes waiting on this connection",
                    )
            elif isinstance(event, PingAcked):
                if self.ping_timeout is not None:
                    self.ping_timeout.cancel()
                    self.ping_timeout = None
            elif isinstance(event, GoAwayReceived):
                self.closing = True  # the client opens no more calls here
            elif isinstance(event, ConnectionTerminated):
                self._fail(event.error_code, event.message)

    # --- calls ---------------------------------------------------------------------------------

    def _open(self, sid: int, end_stream: bool, headers: list[tuple[str, str]]) -> None:
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
            self._answer_only(sid, grpc.StatusCode.INTERNAL, "raftkv: not a gRPC request")
            return
        method = self.settings.methods.get(path or "")
        if method is None:
            self._answer_only(sid, grpc.StatusCode.UNIMPLEMENTED, _unknown_method(path or ""))
            return
        assert path is not None
        stream = Stream(sid, self, path, method)
        self.settings.calls.started(path)
        self.last_active = now = time.monotonic()
        stream.encoding = encoding if encoding not in (None, "identity") else None
        deadline = None
        if timeout is None and method.kind == UNARY_UNARY:
            timeout = self.limits.default_call_timeout_s
            stream.default_deadline = True
        if timeout is not None:
            deadline = now + timeout
            stream.deadline = self.loop.call_later(timeout, self._deadline_passed, stream)
        stream.context = RpcContext(self.identity, tuple(metadata), deadline, stream)
        self.streams[sid] = stream
        if method.kind == STREAM_STREAM:
            self._start(stream)
        if end_stream:
            self._end_of_requests(stream)

    def _on_data(self, stream: Stream, payload: bytes, end_stream: bool) -> None:
        self._add_request_bytes(stream, payload)
        if stream.closed:
            return
        if end_stream:
            self._end_of_requests(stream)
        elif stream.method.kind != STREAM_STREAM:
            # a unary request is credited as it arrives: its size is bounded by the limit
            self.machine.acknowledge_received_data(stream.sid, _UNARY_CREDIT)
        elif not stream.messages:
            # a stream's requests are credited as its handler reads them (``Requests``),
            # or now if the handler waits for the rest of a message
            self.credit_stream(stream)

    def _add_request_bytes(self, stream: Stream, payload: bytes) -> None:
        body = stream.body
        max_receive = self.settings.max_receive
        if (
            not body
            and len(payload) >= 5
            and not payload[0]
            and U32.unpack_from(payload, 1)[0] == len(payload) - 5 <= max_receive
        ):  # the common case: one whole message in one frame, taken without a copy more
            stream.messages.append(payload[5:])
            stream.wake_reader()
            return
        body += payload
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
        self.machine.running = self.handlers  # a reset stream keeps its slot until it ends
        method = stream.method
        if method.kind == UNARY_UNARY:
            self.unary_running += 1
            if method.start is not None:
                request = stream.messages.popleft()
                self.machine.release_input(stream.sid)
                assert stream.context is not None
                stream.task = method.start(
                    request, stream.context, functools.partial(self._answered, stream)
                )
                return
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
            self.machine.release_input(stream.sid)
        try:
            answer = await run_handler(method, context, request, stream.write_message)
            if answer is None:
                self.finish(stream, _OK)
            else:
                self.answer_unary(stream, answer)
        except asyncio.CancelledError:
            self._canceled(stream)
        except Exception as exc:
            self.finish(stream, *error_status(method, exc))
        finally:
            self._handler_ended(stream)

    def _answered(
        self, stream: Stream, answer: bytes | None, status: tuple[int, str] | None
    ) -> None:
        """A ``Method.start`` call's end, as ``_serve`` ends a handler's task."""
        if answer is not None:
            self.answer_unary(stream, answer)
        elif status is not None:
            self.finish(stream, *status)
        else:
            self._canceled(stream)
        self._handler_ended(stream)

    def _canceled(self, stream: Stream) -> None:
        if stream.ended_with is not None:
            self.finish(stream, *stream.ended_with)
        elif stream.deadline_hit:
            self.finish(stream, status_code(grpc.StatusCode.DEADLINE_EXCEEDED), "Deadline Exceeded")
        elif not stream.closed and stream.trailers is None:
            self._reset(stream, h2.CANCEL)  # the server is stopping

    def _handler_ended(self, stream: Stream) -> None:
        self.handlers -= 1
        self.machine.running = self.handlers
        if stream.method.kind == UNARY_UNARY:
            self.unary_running -= 1
        if stream.deadline is not None:
            stream.deadline.cancel()
        if self.deferred:
            self._output_progress()

    def answer_unary(self, stream: Stream, data: bytes) -> None:
        if stream.closed:
            return
        if not stream.headers_sent and self.machine.send_answer(
            stream.sid, RESPONSE_HEADERS, b"\x00" + U32.pack(len(data)), data, trailers(_OK)
        ):  # the common case: the answer's three frames in one write
            self._closed(stream)
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
            self.machine.end_response(stream.sid, trailers_only(code, details))
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

    def _answer_only(self, sid: int, code: grpc.StatusCode, details: str) -> None:
        """A call answered with a status from its HEADERS alone (it never becomes a call)."""
        self.machine.end_response(sid, trailers_only(status_code(code), details))

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

    def _send_trailers(self, stream: Stream, block: bytes) -> None:
        self.machine.end_response(stream.sid, block)
        self._closed(stream)

    def flush_stream(self, stream: Stream, *, schedule: bool = True) -> None:
        """Sends what the windows let through of ``stream``'s answer, then its trailers."""
        if stream.closed or (not stream.outbound and stream.trailers is None):
            return  # nothing to send yet (e.g. a window update before the answer)
        machine = self.machine
        sid = stream.sid
        if not stream.headers_sent:
            stream.headers_sent = True
            machine.send_headers(sid, RESPONSE_HEADERS)
        outbound = stream.outbound
        socket_full = self.reading_paused
        while outbound:
            allowed = machine.send_allowance(sid)
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
            stream.outbound_bytes -= size
            self.output_bytes -= size
            machine.send_data(sid, chunk)
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
        """The call's handler took its requests so far: credit the client's window back."""
        machine = self.machine
        if not stream.remote_closed:
            machine.acknowledge_received_data(stream.sid)
            self.schedule_flush()
        if stream.method.kind == STREAM_STREAM:
            # the messages its handler took no longer wait here; a partial one still does
            # (a unary call's request is taken when the call starts)
            machine.release_input(stream.sid, keep=len(stream.body))

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
        data = self.machine.data_to_send()
        if not data:
            return
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
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
        if stream.deadline is not None:
            stream.deadline.cancel()
            stream.deadline = None
        stream.remote_closed = True  # the machine's stream is closed too: nothing more comes
        stream.wake_reader()
        if stream.drained is not None:
            stream.drained.set()

    def _reset(self, stream: Stream, code: int) -> None:
        if not stream.closed:
            if stream.trailers is None:
                self.settings.calls.handled(stream.path, _CANCELLED)
            self.machine.reset_stream(stream.sid, code)
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
        self.machine.go_away()
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
        self.machine.close_connection(code, message)  # no-op if the machine ended it itself
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
            self.machine.send_ping(b"raftkv\0\0")
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
