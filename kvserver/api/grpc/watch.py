"""etcd's Watch service over gRPC (``etcdserverpb.Watch``): ``Watch(stream WatchRequest)
returns (stream WatchResponse)``, as etcd 3.4/3.5's v3rpc watch stream serves it.

One call is one ``kvserver.watch.hub.WatchStream``: the hub holds the semantics (several
watchers per stream, history replay from ``start_revision``, ``prev_kv``, ``NOPUT`` /
``NODELETE``, ``progress_notify``, fragments, compaction, bounded queues); this module moves
requests in and responses out, as the JSON dialect (``kvserver.api.http.watch``) does.

Requests, applied as they arrive: ``create_request`` (a client-chosen non-zero ``watch_id``
is used if free, else ``created`` + ``canceled`` with etcd's ``mvcc: duplicate watch ID
provided on the WatchStream``), ``cancel_request`` (an unknown id is ignored, as etcd) and
``progress_request``: a response with watch id -1 and only a header revision once every
watcher of the stream is synced (etcd 3.5's RequestProgressAll); while one is still catching
up, the request is deferred and answered after a later response (etcd's
``deferredProgress``). A request with nothing set is ignored. A client that half-closes keeps
its stream (as etcd: only its cancel or a server-side error ends the call).

Responses: the hub's, the header completed (``cluster_id``, ``member_id``, the hub's
revision, ``raft_term`` at send time). A response of more than ``ENCODE_STEP_EVENTS`` events
(a revision that deleted a million keys is one response, as in etcd, unless the client asked
for ``fragment``) is converted and serialized on the loop ``ENCODE_STEP_EVENTS`` events per
step, yielding between steps (the pieces concatenate into one valid message), and joined in
a worker thread; its events are then handed back to the hub (``WatchStream.release``) to be
dropped a slice at a time. So no response holds the loop for long; the hub already hands
out history in bounded chunks and big revisions in bounded steps.

Lifetime and back-pressure. A response is written once the transport took the previous one
(HTTP/2 flow control); meanwhile responses queue in the hub, bounded per watcher (a watcher
that would overflow is canceled, ``kvserver.watch.hub.MSG_WATCHER_TOO_SLOW``). Requests are
read only while fewer than ``MAX_QUEUED_RESPONSES`` responses wait, so a client that sends and
never reads fills its own window, not the server's memory (etcd's control channel holds 16).
The ``WatchStream`` is closed (its watchers leave the hub) whenever the call ends: the
client's cancel or disconnect (gRPC cancels the handler), the server's stop (gRPC cancels the
handler after its grace period; if the hub closes first, what it queued is sent and the call
ends Unavailable ``etcdserver: server stopped``), a message that is not a ``WatchRequest``
(Internal ``grpc: failed to unmarshal the received message: ...``, grpc-go's answer), or the
``hasleader`` check below. A restarted member opens the stream once it has re-applied its
log (``wait_recovered``), so old events are not reported as new.

``hasleader`` metadata (``clientv3.WithRequireLeader``; etcdctl's watch sends it). With
``hasleader: true``, a member that knows no leader refuses the call, Unavailable ``etcdserver:
no leader``; an open call ends with that status once the member has lost its leader
(``kvserver.api.grpc.leader_monitor``).

Auth. With auth enabled, a create request needs read permission on its range for the call's
user (``Calls.user``: the ``token`` metadata, else the client certificate's name). As etcd, a
refusal is a response, not a failed call: ``created`` + ``canceled``, watch id -1, and as
``cancel_reason`` the text of etcd's gRPC error, ``rpc error: code = PermissionDenied desc =
etcdserver: permission denied`` (``... code = InvalidArgument desc = etcdserver: user name is
empty`` without a token, ``... code = Unauthenticated desc = etcdserver: invalid auth token``
for a bad one). A from-key watch (``range_end`` ``\\0``) needs read permission on every key
from ``key`` on (etcd 3.4/3.5 check only ``key`` itself there). As the JSON dialect does, and
etcd does not, a change of auth state re-checks the call's watchers and cancels, with the
permission-denied reason, any whose range its user may no longer read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

from google.protobuf.message import DecodeError

from kvserver.auth.errors import PermissionDeniedError
from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb.errors import EtcdError, GrpcCode
from kvserver.kvpb.service_errors import ServiceError, no_leader, stopping
from kvserver.kvpb.watch import WatchCreateRequest, WatchFilter, WatchResponse
from kvserver.watch.hub import WatchStream
from raftpb.wire import encode_varint

from . import convert
from .calls import MSG_INTERNAL, Calls, requires_leader, service_handler
from .leader_monitor import LeaderMonitor
from .rpc import Method, RpcContext

log = logging.getLogger(__name__)

ENCODE_STEP_EVENTS = 1_000  # events converted per loop step
JOIN_IN_THREAD_BYTES = 1 << 20  # a bigger message's pieces are joined in a worker thread
MAX_QUEUED_RESPONSES = 1_024  # requests wait while this many responses are not yet written

MSG_WATCH_CANCELED = "etcdserver: watch canceled"  # etcd's ErrGRPCWatchCanceled
MSG_UNMARSHAL = "grpc: failed to unmarshal the received message"  # grpc-go's text


def go_status_text(code: GrpcCode, message: str) -> str:
    """What Go's ``status.Error(code, message).Error()`` prints: etcd's cancel reasons."""
    name = "Canceled" if code is GrpcCode.CANCELLED else code.name.title().replace("_", "")
    return f"rpc error: code = {name} desc = {message}"


REASON_PERMISSION_DENIED = go_status_text(
    GrpcCode.PERMISSION_DENIED, PermissionDeniedError.default_message
)


# --- conversion -------------------------------------------------------------------------------


def create_from_pb(m: rpc_pb2.WatchCreateRequest) -> WatchCreateRequest:
    filters: list[WatchFilter] = []
    for number in m.filters:
        try:
            f = WatchFilter(number)
        except ValueError:
            continue  # etcd ignores filter numbers it does not know
        if f not in filters:
            filters.append(f)
    return WatchCreateRequest(
        key=m.key,
        range_end=m.range_end,
        start_revision=m.start_revision,
        progress_notify=m.progress_notify,
        filters=tuple(filters),
        prev_kv=m.prev_kv,
        watch_id=m.watch_id,
        fragment=m.fragment,
    )


def encode_response(
    resp: WatchResponse,
    cluster_id: int,
    member_id: int,
    raft_term: int,
    step: int = ENCODE_STEP_EVENTS,
) -> bytes:
    """A serialized ``WatchResponse``, its events converted ``step`` at a time."""
    return b"".join(encode_response_pieces(resp, cluster_id, member_id, raft_term, step))


def encode_response_pieces(
    resp: WatchResponse,
    cluster_id: int,
    member_id: int,
    raft_term: int,
    step: int = ENCODE_STEP_EVENTS,
) -> Iterator[bytes]:
    """``encode_response`` in pieces, each with at most ``step`` events (protobuf messages
    concatenate: the pieces joined are one valid message). A consumer that yields to the loop
    between pieces never holds it for more than one piece's conversion."""
    yield rpc_pb2.WatchResponse(
        header=rpc_pb2.ResponseHeader(
            cluster_id=cluster_id,
            member_id=member_id,
            revision=resp.header.revision,
            raft_term=raft_term,
        ),
        watch_id=resp.watch_id,
        created=resp.created,
        canceled=resp.canceled,
        compact_revision=resp.compact_revision,
        cancel_reason=resp.cancel_reason,
        fragment=resp.fragment,
    ).SerializeToString()
    yield from event_fields_in_steps(resp, step)


# Encoded events, by the event object: a put on a prefix that 5,000 watchers watch is one
# Event object for all of them (the hub shares it, and shares one copy without prev_kv), so
# it is converted and serialized once, not 5,000 times. Bounded in bytes; big events are
# not kept. Keyed by id() with the object itself kept, so a reused id never matches.
_EVENT_FIELDS: dict[int, tuple[object, bytes]] = {}
_EVENT_FIELDS_BYTES = 0
EVENT_CACHE_BYTES = 16 * 1024 * 1024
EVENT_CACHE_MAX_EVENT = 64 * 1024
_EVENTS_FIELD_TAG = b"\x5a"  # WatchResponse.events: field 11, length-delimited


def event_field(ev: Any) -> bytes:
    """``ev`` as one ``events`` field of a serialized WatchResponse (tag, length, Event):
    protobuf fields concatenate, so a response is its other fields followed by these."""
    global _EVENT_FIELDS_BYTES
    hit = _EVENT_FIELDS.get(id(ev))
    if hit is not None and hit[0] is ev:
        return hit[1]
    data = convert.event_to_pb(ev).SerializeToString()
    field = _EVENTS_FIELD_TAG + encode_varint(len(data)) + data
    if len(field) <= EVENT_CACHE_MAX_EVENT:
        if _EVENT_FIELDS_BYTES + len(field) > EVENT_CACHE_BYTES:
            _EVENT_FIELDS.clear()
            _EVENT_FIELDS_BYTES = 0
        _EVENT_FIELDS[id(ev)] = (ev, field)
        _EVENT_FIELDS_BYTES += len(field)
    return field


async def encode_response_in_steps(
    resp: WatchResponse, cluster_id: int, member_id: int, raft_term: int
) -> bytes:
    """``encode_response`` for a response of many events, yielding to the loop between
    pieces; the pieces are joined in a worker thread (a join that large releases the GIL)."""
    return await join_in_steps(encode_response_pieces(resp, cluster_id, member_id, raft_term))


def event_fields_in_steps(resp: WatchResponse, step: int = ENCODE_STEP_EVENTS) -> Iterator[bytes]:
    """The ``events`` fields of ``resp``, serialized ``step`` events at a time."""
    events = resp.events
    for start in range(0, len(events), step):
        yield b"".join([event_field(ev) for ev in events[start : start + step]])


async def join_in_steps(pieces: Iterator[bytes]) -> bytes:
    """The pieces joined, each made between two turns of the loop; a big join runs in a
    worker thread (a join that large releases the GIL)."""
    parts = []
    size = 0
    for piece in pieces:
        parts.append(piece)
        size += len(piece)
        await asyncio.sleep(0)
    if size < JOIN_IN_THREAD_BYTES:
        return b"".join(parts)
    return await asyncio.to_thread(b"".join, parts)


# --- one call ---------------------------------------------------------------------------------


class _Call:
    """One Watch call being served: its stream, its tasks, and why it must end early."""

    __slots__ = ("stream", "user", "error", "sender", "deferred_progress", "room")

    def __init__(self, stream: WatchStream) -> None:
        self.stream = stream
        self.user: str | None = None  # the user of the last permitted create (auth enabled)
        self.error: EtcdError | None = None  # the status the call ends with
        self.sender: asyncio.Task | None = None
        self.deferred_progress = False
        self.room = asyncio.Event()  # set when requests may be read again

    def fail(self, error: EtcdError) -> None:
        """End the call with this error's status (queued responses are dropped)."""
        if self.error is None:
            self.error = error
        self.stream.close()
        if self.sender is not None and not self.sender.done():
            self.sender.cancel()  # it may be waiting for a client that does not read


class WatchServicer:
    def __init__(self, service: Any, calls: Calls):
        self.service = service
        self.calls = calls
        self.leader_monitor = LeaderMonitor(service, "grpc-watch-leader-monitor")

    def methods(self) -> dict[str, Method]:
        return service_handler(
            "etcdserverpb.Watch", {"Watch": (self.Watch, rpc_pb2.WatchRequest, "stream_stream")}
        )

    async def Watch(self, requests: Any, context: RpcContext) -> None:
        try:
            self.calls.caller(context)
        except EtcdError as exc:
            await self.calls.abort(context, exc)
        require_leader = requires_leader(context)
        if require_leader and self.service.status().leader == 0:
            await self.calls.abort(context, no_leader())
        # A restarted member replaying its log would report those old events as new ones.
        await self.calls.run(context, self.service.wait_recovered())
        call = _Call(self.service.watch_stream())
        auth = self.calls.auth
        unsubscribe = auth.on_change(lambda: self._recheck(call)) if auth is not None else None
        if require_leader:
            self.leader_monitor.add(call)
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read(requests, context, call))
        call.sender = sender = loop.create_task(self._send(context, call))
        try:
            try:
                await sender
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if call.error is None or (current is not None and current.cancelling()):
                    raise  # this call was canceled (client gone, server stopping)
            except Exception:
                log.exception("watch: serving a stream failed")
                call.fail(ServiceError(GrpcCode.INTERNAL, MSG_INTERNAL))
            # The stream ended without an error: the hub closed, the member is stopping.
            await self.calls.abort(context, call.error or stopping())
        finally:
            self.leader_monitor.discard(call)
            if unsubscribe is not None:
                unsubscribe()
            call.stream.close()  # every watcher of this call leaves the hub
            for task in (reader, sender):
                task.cancel()
            await asyncio.gather(reader, sender, return_exceptions=True)

    # --- requests -------------------------------------------------------------------------------

    async def _read(self, requests: Any, context: RpcContext, call: _Call) -> None:
        stream = call.stream
        try:
            async for req in requests:
                self._apply(context, call, req)
                while stream.queued >= MAX_QUEUED_RESPONSES and not stream.closed:
                    call.room.clear()
                    await call.room.wait()
        except asyncio.CancelledError:
            raise
        except DecodeError as exc:  # grpc-go's answer to a message it cannot decode
            call.fail(ServiceError(GrpcCode.INTERNAL, f"{MSG_UNMARSHAL}: {exc}"))
        except Exception as exc:  # the client's side of the call broke
            log.debug("watch: reading requests failed: %r", exc)
            call.fail(ServiceError(GrpcCode.CANCELLED, MSG_WATCH_CANCELED))

    def _apply(self, context: RpcContext, call: _Call, req: Any) -> None:
        which = req.WhichOneof("request_union")
        stream = call.stream
        if which == "create_request":
            self._create(context, call, create_from_pb(req.create_request))
        elif which == "cancel_request":
            stream.cancel(req.cancel_request.watch_id)
        elif which == "progress_request":
            if not call.deferred_progress and not stream.request_progress():
                call.deferred_progress = True

    def _create(self, context: RpcContext, call: _Call, req: WatchCreateRequest) -> None:
        auth = self.calls.auth
        # A negative start revision is refused by the hub first, as etcd does.
        if auth is not None and auth.enabled and req.start_revision >= 0:
            try:
                user = self.calls.user(context)
            except EtcdError as exc:
                call.stream.refuse_create(go_status_text(GrpcCode(exc.grpc_code), exc.message))
                return
            if not auth.can_read(user, req.key or b"\0", req.range_end):
                call.stream.refuse_create(REASON_PERMISSION_DENIED)
                return
            call.user = user
        call.stream.create(req)

    def _recheck(self, call: _Call) -> None:
        """Auth state changed: cancel the watchers whose range the user may no longer read."""
        auth = self.calls.auth
        if call.user is None or auth is None:
            return
        for w in call.stream.watchers.values():
            if not auth.can_read(call.user, w.key, w.range_end):
                w.cancel_with_reason(REASON_PERMISSION_DENIED)

    # --- responses ------------------------------------------------------------------------------

    async def _send(self, context: RpcContext, call: _Call) -> None:
        stream = call.stream
        service = self.service
        cluster_id, member_id = service.cluster_id, service.member_id
        async for resp in stream:
            term = service.raft_term
            if len(resp.events) > ENCODE_STEP_EVENTS:
                try:
                    data = await encode_response_in_steps(resp, cluster_id, member_id, term)
                finally:
                    stream.release(resp)  # its events are dropped a slice at a time
                    del resp
            else:
                data = encode_response(resp, cluster_id, member_id, term)
            await context.write(data)
            if call.deferred_progress and stream.request_progress():
                call.deferred_progress = False
            if stream.queued < MAX_QUEUED_RESPONSES:
                call.room.set()
