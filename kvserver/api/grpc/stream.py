"""One gRPC call's HTTP/2 stream: what the connection keeps per call, and its request reader.

``Stream`` holds a call's state on both sides: the request bytes and complete messages
received, the answer's messages waiting for the peer's windows, its trailers, its deadline,
and the handler's task; its HTTP/2 state and windows are the connection's machine's
(``kvserver.api.grpc.h2_machine``). The connection that owns it (``StreamOwner``:
``kvserver.api.grpc.connection.GrpcConnection``) feeds it what the machine delivers and
sends what it queues. ``Stream.write_message`` is a streaming handler's ``write``: it
queues a message and waits while more than ``STREAM_HIGH_WATER`` bytes of the answer are
unsent, or while the socket's buffer is full. ``Requests`` is a streaming handler's request
iterator: it waits for the next complete message and credits the stream's window back to
the client as the handler reads (so a client cannot queue more than one window ahead of a
slow handler); a front end's passed-on call feeds the same iterator (``RequestSource``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Protocol

from .h2 import U32
from .rpc import Method, PendingCall, RpcContext

STREAM_HIGH_WATER = 1024 * 1024


class StreamOwner(Protocol):
    paused: bool  # the socket's buffer is full
    output_bytes: int  # answer bytes queued in the connection's streams

    @property
    def congested(self) -> bool: ...  # over the connection's output budget

    def flush_stream(self, stream: Stream, *, schedule: bool = True) -> None: ...

    def finish(self, stream: Stream, code: int, details: str = "") -> None: ...

    def credit_stream(self, stream: Stream) -> None: ...


class Stream:
    """One call's HTTP/2 stream."""

    __slots__ = (
        "sid",
        "conn",
        "path",
        "method",
        "context",
        "task",
        "body",
        "messages",
        "waiter",
        "remote_closed",
        "closed",
        "encoding",
        "outbound",
        "outbound_bytes",
        "headers_sent",
        "trailers",
        "drained",
        "deadline",
        "deadline_hit",
        "default_deadline",
        "ended_with",
    )

    def __init__(self, sid: int, conn: StreamOwner, path: str, method: Method):
        self.sid = sid
        self.conn = conn
        self.path = path
        self.method = method
        self.context: RpcContext | None = None
        self.task: PendingCall | None = None  # the handler while it runs
        self.body = bytearray()  # bytes of a message not yet complete
        self.messages: deque[bytes] = deque()  # complete messages not yet read
        self.waiter: asyncio.Future[None] | None = None  # a reader waiting for a message
        self.remote_closed = False  # the client half-closed
        self.closed = False  # trailers sent or the stream reset
        self.encoding: str | None = None  # grpc-encoding of compressed requests
        self.outbound: deque[memoryview] = deque()
        self.outbound_bytes = 0
        self.headers_sent = False
        self.trailers: bytes | None = None  # sent once everything before it is
        self.drained: asyncio.Event | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_hit = False
        self.default_deadline = False  # the deadline is the server's, not the client's
        self.ended_with: tuple[int, str] | None = None  # a status set by ``end``

    def end(self, code: int, details: str) -> None:
        """Ends the call with this status: its handler is canceled (``RpcContext.end``)."""
        if self.ended_with is None:
            self.ended_with = (code, details)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        else:
            self.conn.finish(self, code, details)

    def requests_ended(self) -> bool:
        return self.remote_closed or self.closed

    def requests_read(self) -> None:
        """Every request received so far was read: credit the client's window back."""
        self.conn.credit_stream(self)

    def wake_reader(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def write_message(self, data: bytes) -> None:
        """A streaming answer's next message; waits while too much is unsent."""
        if self.closed:
            raise asyncio.CancelledError()
        self.queue_message(data)
        self.conn.flush_stream(self)
        await self.drain()

    async def drain(self) -> None:
        """Waits while more than ``STREAM_HIGH_WATER`` bytes of the answer are unsent, or the
        socket's buffer is full, or the connection is over its output budget."""
        conn = self.conn
        while (
            self.outbound_bytes > STREAM_HIGH_WATER or conn.paused or conn.congested
        ) and not self.closed:
            if self.drained is None:
                self.drained = asyncio.Event()
            self.drained.clear()
            await self.drained.wait()

    def send_framed(self, data: bytes) -> None:
        """Queues messages already framed (each its 5-byte prefix and bytes, concatenated)
        and sends what the windows let through, without waiting: a front end's watch fan-out
        writes the responses of one revision for all a stream's watchers in one go, and
        bounds each stream itself (``kvserver.api.grpc.watch_fanout``)."""
        if self.closed or not data:
            return
        self.outbound.append(memoryview(data))
        self.outbound_bytes += len(data)
        self.conn.output_bytes += len(data)
        self.conn.flush_stream(self)

    def queue_message(self, data: bytes) -> None:
        prefix = b"\x00" + U32.pack(len(data))
        if len(data) < 4096:
            self.outbound.append(memoryview(prefix + data))
        else:  # big answers are not copied to add the prefix
            self.outbound.append(memoryview(prefix))
            self.outbound.append(memoryview(data))
        self.outbound_bytes += 5 + len(data)
        self.conn.output_bytes += 5 + len(data)


class RequestSource(Protocol):
    """Where a bidirectional call's requests arrive: a client's HTTP/2 stream (``Stream``),
    or a call a front-end process passed on (``kvserver.api.grpc.frontend_link``)."""

    method: Method
    messages: deque[bytes]
    waiter: asyncio.Future[None] | None

    def requests_ended(self) -> bool: ...

    def requests_read(self) -> None: ...


class Requests:
    """A streaming method's requests, as its handler iterates them."""

    def __init__(self, source: RequestSource):
        self.source = source
        self.parse = source.method.request_type.FromString

    def __aiter__(self) -> Requests:
        return self

    async def __anext__(self) -> Any:
        source = self.source
        while not source.messages:
            if source.requests_ended():
                raise StopAsyncIteration
            source.waiter = asyncio.get_running_loop().create_future()
            try:
                await source.waiter
            finally:
                source.waiter = None
        data = source.messages.popleft()
        if not source.messages:
            source.requests_read()
        return self.parse(data)
