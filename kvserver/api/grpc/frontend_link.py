"""The member's end of a front end's link: the calls a front-end process passed on, served here.

A ``FrontendLink`` is the protocol of the member's end of one link
(``kvserver.api.grpc.frontend_wire``). It runs each call the front end sends through the
same method table as the member's own HTTP/2 connections (``run_handler``), so the servicers,
auth, learner refusal, leader forwarding and the call counts in ``/metrics`` are the same
whichever process terminated the client's connection. What it costs this member's loop per
call is a msgpack event each way instead of HTTP/2 frames, header blocks, flow control and
a socket write per connection: that work runs in the front ends, on other cores.

- A call's context has the client's metadata (``token`` for auth), its deadline, its
  address and, on an https URL with ``--client-cert-auth``, the common name of the
  certificate the front end verified.
- A streaming handler's ``write`` sends the message at once and waits while the front end
  has said PAUSE for that call (its client reads slower than the member writes) or while
  the link's socket buffer is full.
- A bidirectional call queues at most ``MAX_QUEUED_REQUESTS`` requests its handler has not
  read; more ends the call with RESOURCE_EXHAUSTED.
- A front end has at most ``max_calls`` calls running here; a call past it ends at once with
  RESOURCE_EXHAUSTED (counted as ``calls_in_flight``). A call counts until its handler has
  ended, not when the front end cancels it; a write it proposed stays counted by the raft
  driver until it is applied or dropped (``Node.propose``).
- CANCEL from the front end, or the link closing, cancels the handler; nothing is answered.
- Watches are not calls: the front end keeps its clients' Watch streams and asks for one feed
  per distinct watch (``kvserver.api.grpc.watch_feeds``, built by ``watch_feeds``).
- Events that break the link's format close the link (the front end's clients then see
  their connections go, and reconnect); events about calls that have ended are ignored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc

from kvserver import stages

from . import frontend_wire as wire
from .budgets import BudgetCounts
from .metrics import CallCounts
from .rpc import (
    STREAM_STREAM,
    ClientIdentity,
    Method,
    RpcContext,
    error_status,
    run_handler,
    status_code,
)
from .stream import Requests
from .watch_feeds import WatchFeeds

log = logging.getLogger(__name__)

MAX_QUEUED_REQUESTS = 1024
MAX_IDENTITIES = 4096
_OK = status_code(grpc.StatusCode.OK)
_CANCELLED = status_code(grpc.StatusCode.CANCELLED)
_EXHAUSTED = status_code(grpc.StatusCode.RESOURCE_EXHAUSTED)


class LinkedCall:
    """One call a front end passed on: its state here, and its ``AnswerStream``."""

    __slots__ = (
        "id",
        "link",
        "path",
        "method",
        "context",
        "task",
        "request",
        "messages",
        "waiter",
        "half_closed",
        "paused",
        "resumed",
        "done",
        "ended_with",
    )

    def __init__(self, call_id: int, link: FrontendLink, path: str, method: Method):
        self.id = call_id
        self.link = link
        self.path = path
        self.method = method
        self.context: RpcContext | None = None
        self.task: asyncio.Task[None] | None = None
        self.request: Any = None
        self.messages: deque[bytes] = deque()  # a bidirectional call's unread requests
        self.waiter: asyncio.Future[None] | None = None
        self.half_closed = False
        self.paused = False  # the front end asked to wait
        self.resumed: asyncio.Event | None = None
        self.done = False  # answered, or canceled by the front end
        self.ended_with: tuple[int, str] | None = None

    async def write_message(self, data: bytes) -> None:
        if self.done:
            raise asyncio.CancelledError()
        link = self.link
        link.writer.send((wire.MSG, self.id, data))
        while (self.paused or link.write_paused) and not self.done:
            if self.resumed is None:
                self.resumed = asyncio.Event()
            self.resumed.clear()
            await self.resumed.wait()

    def end(self, code: int, details: str) -> None:
        """Ends the call from outside its handler (``RpcContext.end``)."""
        if self.ended_with is None:
            self.ended_with = (code, details)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        else:
            self.link.finish(self, code, details)

    def requests_ended(self) -> bool:
        return self.half_closed or self.done

    def requests_read(self) -> None:
        pass  # the front end bounds nothing by it: MAX_QUEUED_REQUESTS does

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.resumed is not None:
            self.resumed.set()


class FrontendLink(asyncio.Protocol):
    def __init__(
        self,
        methods: dict[str, Method],
        counts: CallCounts,
        hello: tuple[Any, ...],
        *,
        max_calls: int = 4096,
        budgets: BudgetCounts | None = None,
        on_ready: Callable[[], None] | None = None,
        on_lost: Callable[[], None] | None = None,
        watch_feeds: Callable[[FrontendLink], WatchFeeds] | None = None,
    ):
        self.methods = methods
        self.counts = counts
        self.hello = hello
        self.on_ready = on_ready  # called once the front end says READY
        self.on_lost = on_lost  # called once the link has closed
        self.loop = asyncio.get_running_loop()
        self.writer = wire.EventWriter(self.loop)
        self.unpacker = wire.unpacker()
        self.calls: dict[int, LinkedCall] = {}
        self.transport: asyncio.Transport | None = None
        self.write_paused = False
        self.ready = False  # the front end said READY
        self.calls_served = 0
        self.pauses = 0  # PAUSE events: a front end's client read slower than calls wrote
        self.identities: dict[str, ClientIdentity] = {}  # by client address: one per connection
        self.max_calls = max_calls
        self.running = 0  # handler tasks not yet ended, canceled ones included
        self.budgets = budgets if budgets is not None else BudgetCounts()
        self.frontend_budgets: dict[str, int] = {}  # the front end's own counts (STATS)
        # the front end's watches (kvserver.api.grpc.watch_feeds), if this member serves them
        self.watches = watch_feeds(self) if watch_feeds is not None else None

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.writer.transport = self.transport
        self.writer.send((wire.HELLO, *self.hello))

    def data_received(self, data: bytes) -> None:
        try:
            self.unpacker.feed(data)
            for event in self.unpacker:
                self._event(event)
        except Exception:
            log.exception("gRPC front-end link: a malformed event; closing the link")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for call in list(self.calls.values()):
            self._cancel(call)
        self.calls.clear()
        if self.watches is not None:
            self.watches.close()
        if self.on_lost is not None:
            self.on_lost()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        for call in self.calls.values():
            call.wake()
        if self.watches is not None:
            self.watches.resume()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # --- events ---------------------------------------------------------------------------------

    def _event(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == wire.CALL:
            self._open(*event[1:])
            return
        if kind in wire.WATCH_EVENTS_TO_MEMBER and self.watches is not None:
            self.watches.event(event)
            return
        if kind == wire.READY:
            self.ready = True
            if self.on_ready is not None:
                self.on_ready()
            return
        if kind == wire.STATS:
            if type(event[1]) is not dict:
                raise ValueError("STATS without a map")
            self.frontend_budgets = {str(k): int(v) for k, v in event[1].items()}
            return
        call = self.calls.get(event[1])
        if call is None:
            if kind not in (wire.MSG, wire.HALF_CLOSE, wire.CANCEL, wire.PAUSE, wire.RESUME):
                raise ValueError(f"unknown event {kind!r}")
            return  # the call has ended meanwhile
        if kind == wire.MSG:
            call.messages.append(event[2])
            if len(call.messages) > MAX_QUEUED_REQUESTS:
                call.end(_EXHAUSTED, "grpc: too many requests not yet read")
            call.wake()
        elif kind == wire.HALF_CLOSE:
            call.half_closed = True
            call.wake()
        elif kind == wire.CANCEL:
            self._cancel(call)
        elif kind == wire.PAUSE:
            call.paused = True
            self.pauses += 1
        elif kind == wire.RESUME:
            call.paused = False
            call.wake()
        else:
            raise ValueError(f"unknown event {kind!r}")

    def _open(
        self,
        call_id: int,
        path: str,
        metadata: tuple[tuple[str, str], ...],
        timeout: float | None,
        address: str,
        request: bytes | None,
        common_name: str | None = None,
    ) -> None:
        if stages.ON:
            stages.mark("link.call_in")
        method = self.methods.get(path)
        if method is None or call_id in self.calls or type(metadata) is not tuple:
            raise ValueError(f"a call to an unknown method, a reused id or bad metadata: {path!r}")
        if self.running >= self.max_calls:
            self.budgets["calls_in_flight"] += 1
            self.writer.send(
                (
                    wire.END,
                    call_id,
                    _EXHAUSTED,
                    "raftkv: too many calls in flight from this front end",
                )
            )
            return
        call = LinkedCall(call_id, self, path, method)
        deadline = None if timeout is None else time.monotonic() + timeout
        identity = self.identities.get(address)
        if identity is None or identity.cert_common_name != common_name:
            if len(self.identities) >= MAX_IDENTITIES:
                self.identities.clear()
            identity = self.identities[address] = ClientIdentity(address, common_name)
        # (the unpacker gives tuples of str: the metadata as the front end read it)
        call.context = RpcContext(identity, metadata, deadline, call)
        call.request = Requests(call) if method.kind == STREAM_STREAM else request
        self.calls[call_id] = call
        self.counts.started(path)
        self.calls_served += 1
        self.running += 1
        call.task = self.loop.create_task(self._serve(call))
        call.task.add_done_callback(self._ended)

    def _ended(self, _task: asyncio.Task[None]) -> None:
        self.running -= 1

    def _cancel(self, call: LinkedCall) -> None:
        if not call.done:
            call.done = True
            self.counts.handled(call.path, _CANCELLED)
        self.calls.pop(call.id, None)
        call.wake()
        if call.task is not None and not call.task.done():
            call.task.cancel()

    # --- running a call -------------------------------------------------------------------------

    async def _serve(self, call: LinkedCall) -> None:
        method = call.method
        context = call.context
        assert context is not None
        try:
            answer = await run_handler(method, context, call.request, call.write_message)
            if answer is None:
                self.finish(call, _OK)
            elif not call.done:
                call.done = True
                self.calls.pop(call.id, None)
                self.counts.handled(call.path, _OK)
                self.writer.send((wire.REPLY, call.id, answer))
                if stages.ON:
                    stages.mark("link.reply_out")
        except asyncio.CancelledError:
            if call.ended_with is not None:
                self.finish(call, *call.ended_with)
            # else the front end canceled it, or the link closed: nobody to answer
        except Exception as exc:
            self.finish(call, *error_status(method, exc))

    def finish(self, call: LinkedCall, code: int, details: str = "") -> None:
        if call.done:
            return
        call.done = True
        self.calls.pop(call.id, None)
        self.counts.handled(call.path, code)
        self.writer.send((wire.END, call.id, code, details))
        call.wake()
