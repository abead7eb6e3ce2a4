"""A client front-end process: accepts a member's client connections, serves gRPC, passes calls.

etcd's grpc-proxy puts stateless processes between clients and a cluster; a raftkv member
starts such processes itself (``--client-frontends N|auto``, ``kvserver.api.grpc.frontends``).
Each one runs ``python -m kvserver.api.grpc.frontend --link-fd A --handoff-fd B --listen-fd
C:plain|tls ...`` with sockets from its member:

- the **listening sockets** of the member's client URLs: the front end accepts on them
  itself (the kernel shares the connections out among the front ends), terminates TLS on
  the https ones, and tells the dialects apart by the first bytes
  (``kvserver.api.grpc.mux``). gRPC connections are served here by the same HTTP/2
  protocol the member would use (``GrpcConnection``): frames, header blocks, flow control,
  keepalive and every budget of ``kvserver.api.grpc.budgets``;
- the **hand-off** socket takes HTTP/1.1 connections to the member, which serves HTTP
  (``kvserver.api.grpc.handoff``: the socket itself when plain, a relay of the plaintext
  when TLS);
- the **link** (``kvserver.api.grpc.frontend_wire``) carries each gRPC call to the member
  and its answers back. A request is passed on as the bytes the client sent; the member
  parses it and runs the servicer. Nothing about a call is decided here except what HTTP/2
  decides: the method table, the message-size limit, keepalive, the budgets and the TLS
  files come from the member's HELLO. Watch calls are the exception: this process keeps
  them and fans out one member feed per distinct watch to all its clients' watchers
  (``kvserver.api.grpc.watch_fanout``).

So the member's loop keeps raft, applying and the requests themselves, and the TLS and
HTTP/2 work runs on other cores (``docs/performance.md``, "gRPC front ends").

Lifetime: a front end serves until its link closes (the member stopped or died). Then it
stops accepting, sends every connection GOAWAY, lets running calls end for ``STOP_GRACE_S``
and exits. Its clients' calls in flight when the member goes end with UNAVAILABLE.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc

from kvserver import stages
from kvserver.server.event_loop import run_main
from kvserver.server.gc_pacer import collect_young_less_often
from kvserver.tls import TLSInfo, server_context

from . import frontend_wire as wire
from .budgets import Http2Limits
from .connection import GrpcConnection, ServerSettings
from .handoff import RelayedClient, hand_off_plain
from .mux import advertise_alpn, client_port_factory
from .rpc import (
    UNARY_UNARY,
    Answered,
    ClientIdentity,
    Method,
    RpcAbort,
    RpcContext,
    status_code,
)
from .stream import STREAM_HIGH_WATER
from .watch_fanout import WATCH_PATH, WatchFanout

log = logging.getLogger(__name__)

STOP_GRACE_S = 1.0
STATS_INTERVAL_S = 1.0
_STATUS = {status_code(code): code for code in grpc.StatusCode}
_OK = 0
_UNKNOWN = status_code(grpc.StatusCode.UNKNOWN)
_UNAVAILABLE = status_code(grpc.StatusCode.UNAVAILABLE)


class RawMessage:
    """A request passed on as the client sent it: the member parses it."""

    @staticmethod
    def FromString(data: bytes) -> bytes:  # noqa: N802 (the generated classes' name)
        return data


class ForwardedCall:
    """A call passed on to the member, as this process waits for its answers."""

    __slots__ = ("id", "answers", "queued_bytes", "paused", "waiter", "status")

    def __init__(self, call_id: int):
        self.id = call_id
        self.answers: deque[bytes] = deque()
        self.queued_bytes = 0
        self.paused = False  # PAUSE sent
        self.waiter: asyncio.Future[None] | None = None
        self.status: tuple[int, str] | None = None  # how the member ended it

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class PassedOnUnary:
    """A unary call passed on to the member, answered by a callback when its answer comes
    (``Method.start``): no task, no future, no wake-up of its own."""

    __slots__ = ("id", "link", "answered", "finished")

    def __init__(self, call_id: int, link: MemberLink, answered: Answered):
        self.id = call_id
        self.link = link
        self.answered = answered
        self.finished = False

    def end(self, answer: bytes | None, status: tuple[int, str] | None) -> None:
        """The member answered, ended the call, or went away."""
        if self.finished:
            return
        self.finished = True
        self.link.calls.pop(self.id, None)
        if status is not None and status[0] not in _STATUS:
            status = (_UNKNOWN, status[1])
        self.answered(answer, status)

    def cancel(self) -> None:
        """The client's side ended first (reset, deadline, the connection): the member
        cancels its side, and the connection hears of it on the next loop turn."""
        if self.finished:
            return
        self.finished = True
        if self.link.calls.pop(self.id, None) is not None:
            self.link.writer.send((wire.CANCEL, self.id))
        self.link.loop.call_soon(self.answered, None, None)

    def done(self) -> bool:
        return self.finished


async def _passed_on(request: bytes, context: RpcContext) -> bytes:
    """The handler of a passed-on unary call, which ``Method.start`` serves instead."""
    raise RpcAbort(grpc.StatusCode.INTERNAL, "raftkv: a passed-on call has no handler here")


class MemberLink(asyncio.Protocol):
    """This process's end of the link: passes calls on and routes the answers back."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.writer = wire.EventWriter(loop)
        self.unpacker = wire.unpacker()
        self.calls: dict[int, ForwardedCall | PassedOnUnary] = {}
        self.next_id = 0
        self.hello: asyncio.Future[tuple[Any, ...]] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.watches: WatchFanout | None = None  # this process's Watch streams

    # --- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.writer.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._events(data)
        except Exception:
            log.exception("gRPC front end: a malformed event from the member; closing the link")
            if self.writer.transport is not None:
                self.writer.transport.close()

    def _events(self, data: bytes) -> None:
        self.unpacker.feed(data)
        for event in self.unpacker:
            kind = event[0]
            if kind == wire.HELLO:
                if not self.hello.done():
                    self.hello.set_result(event[1:])
                continue
            if kind in wire.WATCH_EVENTS_TO_FRONTEND:
                if self.watches is not None:
                    self.watches.event(event)
                continue
            call = self.calls.get(event[1])
            if call is None:
                continue  # canceled here meanwhile
            if type(call) is PassedOnUnary:
                if kind == wire.REPLY:
                    if stages.ON:
                        stages.mark("fe.reply")
                    call.end(event[2], None)
                elif kind == wire.END:
                    call.end(None, (event[2], event[3]))
                continue  # (a unary call's answer is one REPLY: nothing else comes)
            assert type(call) is ForwardedCall
            if kind == wire.REPLY:
                if stages.ON:
                    stages.mark("fe.reply")
                call.answers.append(event[2])
                call.status = (_OK, "")
            elif kind == wire.MSG:
                call.answers.append(event[2])
                call.queued_bytes += len(event[2])
                if call.queued_bytes > STREAM_HIGH_WATER and not call.paused:
                    call.paused = True
                    self.writer.send((wire.PAUSE, call.id))
            elif kind == wire.END:
                call.status = (event[2], event[3])
            call.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.writer.transport = None
        if self.watches is not None:
            self.watches.link_lost()
        gone = (_UNAVAILABLE, "raftkv: the member behind this front end went away")
        for call in list(self.calls.values()):
            if type(call) is PassedOnUnary:
                call.end(None, gone)
                continue
            assert type(call) is ForwardedCall
            if call.status is None:
                call.status = gone
            call.wake()
        if not self.closed.done():
            self.closed.set_result(None)

    # --- the method table's handlers -------------------------------------------------------------

    def methods(self, kinds: dict[str, str]) -> dict[str, Method]:
        table = {}
        for path, kind in kinds.items():
            if kind == UNARY_UNARY:
                table[path] = Method(_passed_on, RawMessage, kind, start=self._unary(path))
            else:
                table[path] = Method(self._streaming(path), RawMessage, kind)
        return table

    def _unary(self, path: str) -> Callable[[bytes, RpcContext, Answered], PassedOnUnary]:
        def start(request: bytes, context: RpcContext, answered: Answered) -> PassedOnUnary:
            if stages.ON:
                stages.mark("fe.call")
            self.next_id += 1
            call = PassedOnUnary(self.next_id, self, answered)
            if self.writer.transport is None:
                self.loop.call_soon(call.end, None, (_UNAVAILABLE, "raftkv: the member went away"))
                return call
            self.calls[call.id] = call
            self._send_call(call.id, path, request, context)
            return call

        return start

    def _streaming(self, path: str) -> Any:
        async def forward(request: Any, context: RpcContext) -> Any:
            bidirectional = not isinstance(request, bytes)
            call = self._open(path, None if bidirectional else request, context)
            pump = self.loop.create_task(self._pump(call, request)) if bidirectional else None
            try:
                while True:
                    while call.answers:
                        data = call.answers.popleft()
                        call.queued_bytes -= len(data)
                        if call.paused and call.queued_bytes <= STREAM_HIGH_WATER // 4:
                            call.paused = False
                            self.writer.send((wire.RESUME, call.id))
                        yield data
                    if call.status is not None:
                        if call.status[0] != _OK:
                            raise self._abort(call)
                        return
                    await self._wait(call)
            finally:
                if pump is not None:
                    pump.cancel()
                self._close(call)

        return forward

    async def _pump(self, call: ForwardedCall, requests: Any) -> None:
        async for data in requests:
            if call.status is not None:
                return
            self.writer.send((wire.MSG, call.id, data))
        if call.status is None:
            self.writer.send((wire.HALF_CLOSE, call.id))

    def _open(self, path: str, request: bytes | None, context: RpcContext) -> ForwardedCall:
        if self.writer.transport is None:
            raise RpcAbort(grpc.StatusCode.UNAVAILABLE, "raftkv: the member went away")
        self.next_id += 1
        call = ForwardedCall(self.next_id)
        self.calls[call.id] = call
        self._send_call(call.id, path, request, context)
        return call

    def _send_call(
        self, call_id: int, path: str, request: bytes | None, context: RpcContext
    ) -> None:
        self.writer.send(
            (
                wire.CALL,
                call_id,
                path,
                context.invocation_metadata(),  # pairs: msgpack packs tuples as arrays
                context.time_remaining(),
                context.identity.address,
                request,
                context.identity.cert_common_name,
            )
        )

    async def _wait(self, call: ForwardedCall) -> None:
        if call.answers or call.status is not None:
            return
        call.waiter = self.loop.create_future()
        try:
            await call.waiter
        finally:
            call.waiter = None

    def _close(self, call: ForwardedCall) -> None:
        """The call ended here: if the member has not ended it, it is canceled there."""
        if self.calls.pop(call.id, None) is not None and call.status is None:
            self.writer.send((wire.CANCEL, call.id))

    @staticmethod
    def _abort(call: ForwardedCall) -> RpcAbort:
        code, details = call.status or (status_code(grpc.StatusCode.UNKNOWN), "")
        return RpcAbort(_STATUS.get(code, grpc.StatusCode.UNKNOWN), details)


class FrontDoor:
    """What a front end does with each connection its listeners accept, once its first bytes
    say which dialect it speaks (``kvserver.api.grpc.mux.ClientPortProtocol``): gRPC is served
    here; HTTP/1.1 goes to the member (``kvserver.api.grpc.handoff``)."""

    def __init__(self, settings: ServerSettings, handoff: socket.socket):
        self.settings = settings
        self.handoff = handoff

    def connection(self, identity: ClientIdentity) -> GrpcConnection:
        return GrpcConnection(self.settings, identity)

    def hand_off_http(self, transport: asyncio.BaseTransport, first: bytes) -> bool:
        """A plain-TCP HTTP/1.1 connection goes to the member whole; a TLS one stays here
        and is relayed (``relayed_http``)."""
        if transport.get_extra_info("sslcontext") is not None:
            return False
        return hand_off_plain(self.handoff, transport, first)

    def relayed_http(self) -> asyncio.Protocol:
        return RelayedClient(self.handoff)


async def serve(link_fd: int, handoff_fd: int, listen: list[tuple[int, bool]]) -> None:
    loop = asyncio.get_running_loop()
    link_sock = socket.socket(fileno=link_fd)
    handoff_sock = socket.socket(fileno=handoff_fd)
    handoff_sock.setblocking(False)
    _, member = await loop.create_unix_connection(lambda: MemberLink(loop), sock=link_sock)
    hello = await member.hello
    if hello[-1:] != (wire.LINK_VERSION,):
        log.error(
            "gRPC front end: the member speaks another version of the link (its code changed "
            "on disk after it started?); exiting, restart the member"
        )
        raise SystemExit(2)
    kinds, max_receive, min_time, interval, timeout, limits, tls, watch_limits, _ = hello
    settings = ServerSettings(
        member.methods(dict(kinds)),
        max_receive=max_receive,
        keepalive_min_time=min_time,
        keepalive_interval=interval,
        keepalive_timeout=timeout,
        limits=Http2Limits(**limits),
    )
    if watch_limits is not None and WATCH_PATH in settings.methods:
        member.watches = WatchFanout(
            loop,
            member.writer.send,
            {**watch_limits, "max_output_bytes": settings.limits.max_output_bytes},
            settings.budgets,
        )
        settings.methods[WATCH_PATH] = member.watches.method()
    door = FrontDoor(settings, handoff_sock)
    context = advertise_alpn(server_context(TLSInfo(**tls))) if tls else None
    factory = client_port_factory(door.relayed_http, door, http_hand_off=door.hand_off_http)
    servers = []
    for fd, is_tls in listen:
        sock = socket.socket(fileno=fd)
        servers.append(
            await loop.create_server(factory, sock=sock, ssl=context if is_tls else None)
        )
    member.writer.send((wire.READY,))
    reporter = loop.create_task(_report_budgets(member, settings))
    await member.closed
    reporter.cancel()
    for server in servers:
        server.close()
    connections = list(settings.connections)
    for conn in connections:
        conn.go_away()
    deadline = time.monotonic() + STOP_GRACE_S
    while any(conn.streams for conn in connections) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    for conn in connections:
        conn.abort()


async def _report_budgets(member: MemberLink, settings: ServerSettings) -> None:
    """Sends the budget counts to the member once a second while they change."""
    sent: dict[str, int] = {}
    while True:
        await asyncio.sleep(STATS_INTERVAL_S)
        now = dict(settings.budgets)
        if now != sent:
            member.writer.send((wire.STATS, now))
            sent = now


def _listen_fd(text: str) -> tuple[int, bool]:
    fd, _, kind = text.partition(":")
    return int(fd), kind == "tls"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--handoff-fd", type=int, required=True)
    parser.add_argument("--listen-fd", type=_listen_fd, action="append", default=[])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s frontend %(message)s")
    collect_young_less_often()
    run_main(serve(args.link_fd, args.handoff_fd, args.listen_fd), f"frontend-{os.getpid()}")


if __name__ == "__main__":
    main()
