"""A front end's Watch streams: its clients' watchers fanned out from one member feed per
distinct watch, as etcd's grpc-proxy coalesces watchers.

A front end (``kvserver.api.grpc.frontend``) serves etcd's ``Watch`` calls itself. Each client
watcher is a *receiver* of a *feed*: a watcher of the member's hub that the member's end
(``kvserver.api.grpc.watch_feeds``) keeps for this front end and whose responses cross the
link once. Watchers with the same key, range end, filters, ``prev_kv`` and
``progress_notify`` that start at the next revision (``start_revision`` 0) share a feed;
one that asks for history (a start revision) or ``fragment`` gets a feed of its own. A
revision watched by 5,000 clients is then one event on the link and 5,000 small copies here:
the response's header and events are serialized once, and each receiver's copy only adds its
``watch_id``. The copies of one loop turn are written to each client stream at once.

What a client sees is a Watch call as the member serves it (``kvserver.api.grpc.watch``), with
these differences, both as grpc-proxy's:

- A watcher that joins a shared feed is ``created`` at the revision the feed has delivered up
  to, and receives every event after it. That revision may trail the member's by the link's
  latency; events between it and the member's revision are delivered, never skipped.
- A progress request (``WatchProgressRequest``) is answered once every feed of this front end
  is synced (the member's stream progress over all of them), which covers every watcher of
  the client's stream.

Requests are taken in order, one at a time, as the member takes them: a create waits for its
``created`` before the next request is read. Creates are checked as the member checks them
and answered with etcd's texts (compacted start revision, empty range, negative or duplicate
watch id, too many watchers per stream or per front end, then auth through the member). A
create that fails several checks gets the first of this order, where a Watch call on the
member checks auth first: the limits are checked here without asking the member. The
stream opens only once the member has checked it (learner, ``hasleader``, a restarted
member's replay), and ends when the member says so (``hasleader`` and no leader) or the link
goes (Unavailable).

Bounds. A client stream whose answers are not read holds at most ``max_buffered_bytes``
(the hub's per-watcher bound) queued here, and all the Watch streams of one connection
together at most its output budget (``--client-max-output-bytes``): past either, each of its watchers that gets a new response
is canceled with ``MSG_WATCHER_TOO_SLOW`` instead, as the hub cancels a slow watcher;
requests are not read while the stream has more than ``STREAM_HIGH_WATER`` unsent.
Receivers per front end are bounded by the hub's ``max_watchers``, per stream by
``max_watchers_per_stream``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol, cast

import grpc
from google.protobuf.message import DecodeError

from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb.errors import MSG_COMPACTED
from kvserver.watch.hub import (
    INVALID_WATCH_ID,
    MSG_DUPLICATE_WATCH_ID,
    MSG_EMPTY_WATCHER_RANGE,
    MSG_NEGATIVE_WATCH_ID,
    MSG_TOO_MANY_WATCHERS,
    MSG_WATCHER_TOO_SLOW,
)
from raftpb.wire import encode_varint

from . import frontend_wire as wire
from .h2 import U32
from .rpc import STREAM_STREAM, Method, RpcAbort, RpcContext, status_code
from .watch import MSG_UNMARSHAL

WATCH_PATH = "/etcdserverpb.Watch/Watch"
_U64 = (1 << 64) - 1
MSG_MEMBER_GONE = "raftkv: the member behind this front end went away"
_KNOWN_FILTERS = frozenset(rpc_pb2.WatchCreateRequest.FilterType.values())


def id_field(watch_id: int) -> bytes:
    """``watch_id`` as a serialized WatchResponse field (2, varint): fields concatenate."""
    return b"\x10" + encode_varint(watch_id & _U64)  # int64: a negative id in ten bytes


_NO_WATCH_ID = id_field(INVALID_WATCH_ID)


class AnswerSink(Protocol):
    """Where a client stream's answers go (its HTTP/2 stream, ``Stream``)."""

    outbound_bytes: int  # queued and not yet sent
    conn: Any  # its connection: the streams of one connection share its budget

    def send_framed(self, data: bytes) -> None: ...

    def end(self, code: int, details: str) -> None: ...

    async def drain(self) -> None: ...


class Feed:
    """A member-side watcher of this front end and the client watchers it feeds."""

    __slots__ = ("fid", "params", "created", "revision", "receivers", "ready")

    def __init__(self, fid: int, params: tuple[Any, ...] | None, ready: asyncio.Future[None]):
        self.fid = fid
        self.params = params  # the shared feeds' key; None: one watcher's own
        self.created = False
        self.revision = 0  # every event up to here has been given to the receivers
        self.receivers: dict[Receiver, None] = {}
        self.ready = ready  # done once created or refused


class Receiver:
    """One client watcher."""

    __slots__ = ("call", "watch_id", "id_field", "rid", "feed")

    def __init__(self, call: FanoutCall, watch_id: int, rid: int):
        self.call = call
        self.watch_id = watch_id
        self.id_field = id_field(watch_id)
        self.rid = rid  # the member's name for its permitted range
        self.feed: Feed | None = None


class FanoutCall:
    """One client's Watch stream."""

    __slots__ = ("cid", "stream", "receivers", "next_id", "opened", "auth", "out", "out_bytes")

    def __init__(self, cid: int, stream: AnswerSink, opened: asyncio.Future[None]):
        self.cid = cid
        self.stream = stream
        self.receivers: dict[int, Receiver] = {}  # by watch id
        self.next_id = 0
        self.opened = opened
        self.auth: dict[int, asyncio.Future[str]] = {}  # answers awaited, by range id
        self.out: list[bytes] = []  # framed answers of this loop turn
        self.out_bytes = 0


class WatchFanout:
    """This front end's watches (see the module docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[tuple[Any, ...]], None],
        limits: dict[str, int],
        budgets: Counter[str] | None = None,
    ):
        self.loop = loop
        self.send = send  # an event to the member
        self.budgets = budgets if budgets is not None else Counter()  # limits clients met
        self.max_watchers = int(limits["max_watchers"])
        self.max_per_stream = int(limits["max_watchers_per_stream"])
        self.max_backlog = int(limits["max_buffered_bytes"])
        # a connection's watch answers not yet sent, all its streams together
        self.max_connection_backlog = int(limits.get("max_output_bytes", self.max_backlog))
        self.calls: dict[int, FanoutCall] = {}
        self.by_connection: dict[Any, dict[FanoutCall, None]] = {}
        self.feeds: dict[int, Feed] = {}
        self.shared: dict[tuple[Any, ...], Feed] = {}
        self.receivers = 0
        self.last_ids = 0  # call, feed and range ids: one counter, never reused
        self.header = (0, 0, 0)  # cluster id, member id, raft term: the last the member sent
        self.revision = 0  # the highest revision the member has sent
        self.progress_waiting: dict[FanoutCall, None] = {}
        self.progress_asked = False
        self.dirty: dict[FanoutCall, None] = {}
        self.connected = True
        self.feeds_opened = 0

    def method(self) -> Method:
        return Method(self.serve, rpc_pb2.WatchRequest, STREAM_STREAM)

    def _id(self) -> int:
        self.last_ids += 1
        return self.last_ids

    # --- a client's stream ---------------------------------------------------------------------

    async def serve(self, requests: Any, context: RpcContext) -> None:
        if not self.connected:
            raise RpcAbort(grpc.StatusCode.UNAVAILABLE, MSG_MEMBER_GONE)
        stream = cast(AnswerSink, context.answer_stream)
        call = FanoutCall(self._id(), stream, self.loop.create_future())
        self.calls[call.cid] = call
        self.by_connection.setdefault(stream.conn, {})[call] = None
        who = context.identity
        metadata = [list(pair) for pair in context.invocation_metadata()]
        self.send((wire.WOPEN, call.cid, metadata, who.address, who.cert_common_name))
        try:
            await call.opened  # a refusal ends the call (``end``) while it waits here
            try:
                async for req in requests:
                    await self._request(call, req)
                    await stream.drain()
            except DecodeError as exc:  # grpc-go's answer to a message it cannot decode
                raise RpcAbort(grpc.StatusCode.INTERNAL, f"{MSG_UNMARSHAL}: {exc}") from None
            # Half-closed: the stream lives on until the client cancels it or the member
            # ends it, as etcd keeps it.
            await self.loop.create_future()
        finally:
            self._close(call)

    async def _request(self, call: FanoutCall, req: Any) -> None:
        which = req.WhichOneof("request_union")
        if which == "create_request":
            await self._create(call, req.create_request)
        elif which == "cancel_request":
            receiver = call.receivers.get(req.cancel_request.watch_id)
            if receiver is not None:  # an unknown id is ignored, as etcd
                self._end_receiver(receiver, self._head(self.revision, canceled=True))
        elif which == "progress_request":
            self.progress_waiting[call] = None
            if not self.progress_asked:
                self.progress_asked = True
                self.send((wire.FEED_PROGRESS,))

    async def _create(self, call: FanoutCall, m: Any) -> None:
        if m.start_revision < 0:
            return self._refuse(call, MSG_COMPACTED)
        key = m.key or b"\0"  # etcd: an empty key is the smallest key
        range_end = m.range_end
        # What this process can refuse it refuses before asking the member anything, so a
        # client that floods creates costs the member nothing past the limits.
        reason = self._check(call, key, range_end, m.watch_id)
        if reason:
            if reason is MSG_TOO_MANY_WATCHERS:
                self.budgets["watchers"] += 1
            return self._refuse(call, reason)
        rid = self._id()
        answer: asyncio.Future[str] = self.loop.create_future()
        call.auth[rid] = answer
        self.send((wire.WAUTH, call.cid, rid, m.key, range_end))
        try:
            reason = await answer
        finally:
            call.auth.pop(rid, None)
        if reason:
            return self._refuse(call, reason)
        watch_id = m.watch_id
        if watch_id == 0:
            while call.next_id in call.receivers:
                call.next_id += 1
            watch_id = call.next_id
            call.next_id += 1
        receiver = Receiver(call, watch_id, rid)
        call.receivers[watch_id] = receiver
        self.receivers += 1
        filters: list[int] = []
        for number in m.filters:
            if number in _KNOWN_FILTERS and number not in filters:
                filters.append(number)  # etcd ignores filter numbers it does not know
        params = (key, range_end, tuple(filters), m.prev_kv, m.progress_notify)
        shareable = m.start_revision == 0 and not m.fragment
        feed = self.shared.get(params) if shareable else None
        if feed is not None and feed.created:
            feed.receivers[receiver] = None
            receiver.feed = feed
            self._queue(call, self._head(feed.revision, created=True), receiver.id_field, b"")
            return None
        if feed is None:
            feed = Feed(self._id(), params if shareable else None, self.loop.create_future())
            self.feeds[feed.fid] = feed
            if shareable:
                self.shared[params] = feed
            self.feeds_opened += 1
            self.send(
                (
                    wire.FEED,
                    feed.fid,
                    key,
                    range_end,
                    m.start_revision,
                    filters,
                    m.prev_kv,
                    m.progress_notify,
                    m.fragment,
                )
            )
        feed.receivers[receiver] = None
        receiver.feed = feed
        # The next request is taken once this watcher is created (or refused), as the
        # member takes them.
        await asyncio.shield(feed.ready)
        return None

    def _check(self, call: FanoutCall, key: bytes, range_end: bytes, watch_id: int) -> str:
        """The hub's refusals of a create, in the hub's order ('' if none)."""
        if range_end not in (b"", b"\0") and key >= range_end:
            return MSG_EMPTY_WATCHER_RANGE
        if watch_id < 0:
            return MSG_NEGATIVE_WATCH_ID
        if watch_id != 0 and watch_id in call.receivers:  # 0: the stream picks one
            return MSG_DUPLICATE_WATCH_ID
        if self.receivers >= self.max_watchers or len(call.receivers) >= self.max_per_stream:
            return MSG_TOO_MANY_WATCHERS
        return ""

    def _refuse(self, call: FanoutCall, reason: str) -> None:
        head = self._head(self.revision, created=True, canceled=True, cancel_reason=reason)
        self._queue(call, head, _NO_WATCH_ID, b"")

    def _end_receiver(self, receiver: Receiver, head: bytes, events: bytes = b"") -> None:
        """``receiver``'s last response, then it is gone (and its feed, if it was the last)."""
        call = receiver.call
        self._queue(call, head, receiver.id_field, events)
        self._detach(receiver)

    def _detach(self, receiver: Receiver) -> None:
        call = receiver.call
        if call.receivers.pop(receiver.watch_id, None) is not receiver:
            return
        self.receivers -= 1
        self.send((wire.WFORGET, call.cid, receiver.rid))
        feed = receiver.feed
        receiver.feed = None
        if feed is not None:
            feed.receivers.pop(receiver, None)
            if not feed.receivers and self.feeds.get(feed.fid) is feed:
                self._drop_feed(feed)
                self.send((wire.UNFEED, feed.fid))

    def _drop_feed(self, feed: Feed) -> None:
        del self.feeds[feed.fid]
        if feed.params is not None and self.shared.get(feed.params) is feed:
            del self.shared[feed.params]
        if not feed.ready.done():
            feed.ready.set_result(None)

    def _close(self, call: FanoutCall) -> None:
        """The client's stream ended: its watchers leave their feeds."""
        if self.calls.pop(call.cid, None) is None:
            return
        siblings = self.by_connection.get(call.stream.conn)
        if siblings is not None:
            siblings.pop(call, None)
            if not siblings:
                del self.by_connection[call.stream.conn]
        for receiver in list(call.receivers.values()):
            self._detach(receiver)
        self.progress_waiting.pop(call, None)
        self.dirty.pop(call, None)
        self.send((wire.WCLOSE, call.cid))

    # --- answers -------------------------------------------------------------------------------

    def _head(
        self,
        revision: int,
        *,
        created: bool = False,
        canceled: bool = False,
        compact_revision: int = 0,
        cancel_reason: str = "",
        fragment: bool = False,
    ) -> bytes:
        """A WatchResponse's fields but its watch id and events, serialized."""
        cluster_id, member_id, term = self.header
        return rpc_pb2.WatchResponse(
            header=rpc_pb2.ResponseHeader(
                cluster_id=cluster_id, member_id=member_id, revision=revision, raft_term=term
            ),
            created=created,
            canceled=canceled,
            compact_revision=compact_revision,
            cancel_reason=cancel_reason,
            fragment=fragment,
        ).SerializeToString()

    def _queue(self, call: FanoutCall, head: bytes, watch_id: bytes, events: bytes) -> int:
        """One framed answer for ``call``, written with the others of this loop turn; the
        bytes it queued."""
        size = len(head) + len(watch_id) + len(events)
        call.out.append(b"\x00" + U32.pack(size) + head + watch_id + events)
        call.out_bytes += size + 5
        if not self.dirty:
            self.loop.call_soon(self._flush)
        self.dirty[call] = None
        return size + 5

    def _flush(self) -> None:
        dirty = self.dirty
        self.dirty = {}
        for call in dirty:
            data = b"".join(call.out)
            call.out.clear()
            call.out_bytes = 0
            call.stream.send_framed(data)

    # --- events from the member ----------------------------------------------------------------

    def event(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == wire.FED:
            self._fed(*event[1:])
            return
        call = self.calls.get(event[1])
        if call is None:
            return  # ended meanwhile
        if kind == wire.WOPENED:
            _, _, cluster_id, member_id, revision, term = event
            self.header = (cluster_id, member_id, term)
            self.revision = max(self.revision, revision)
            if not call.opened.done():
                call.opened.set_result(None)
        elif kind == wire.WEND:
            call.stream.end(int(event[2]), str(event[3]))
        elif kind == wire.WAUTHED:
            answer = call.auth.get(event[2])
            if answer is not None and not answer.done():
                answer.set_result(str(event[3]))
        elif kind == wire.WREVOKE:
            for receiver in list(call.receivers.values()):
                if receiver.rid == event[2]:
                    head = self._head(self.revision, canceled=True, cancel_reason=str(event[3]))
                    self._end_receiver(receiver, head)

    def _fed(
        self,
        fid: int,
        cluster_id: int,
        member_id: int,
        revision: int,
        term: int,
        created: bool,
        canceled: bool,
        compact_revision: int,
        cancel_reason: str,
        fragment: bool,
        events: bytes,
    ) -> None:
        self.header = (cluster_id, member_id, term)
        if revision > self.revision:
            self.revision = revision
        if fid == INVALID_WATCH_ID and not created:  # the answer to FEED_PROGRESS
            self.progress_asked = False
            head = self._head(revision)
            waiting = self.progress_waiting
            self.progress_waiting = {}
            for call in waiting:
                self._queue(call, head, _NO_WATCH_ID, b"")
            return
        feed = self.feeds.get(fid)
        if feed is None:
            return  # nobody watches it any more
        head = self._head(
            revision,
            created=created,
            canceled=canceled,
            compact_revision=compact_revision,
            cancel_reason=cancel_reason,
            fragment=fragment,
        )
        if created and canceled:  # the hub refused it: so are its receivers
            self._drop_feed(feed)
            for receiver in list(feed.receivers):
                call = receiver.call
                self._queue(call, head, _NO_WATCH_ID, b"")
                receiver.feed = None
                self._detach(receiver)
            return
        if canceled:  # compacted, too slow, the member stopping
            self._drop_feed(feed)
            for receiver in list(feed.receivers):
                receiver.feed = None
                self._end_receiver(receiver, head, events)
            return
        if created:
            feed.created = True
            feed.revision = revision
            if not feed.ready.done():
                feed.ready.set_result(None)
        elif not fragment and revision > feed.revision:
            feed.revision = revision
        limit, connection_limit = self.max_backlog, self.max_connection_backlog
        backlogs: dict[Any, int] = {}  # by connection, as this revision adds to them
        slow = []
        for receiver in feed.receivers:
            call = receiver.call
            stream = call.stream
            conn = stream.conn
            backlog = backlogs.get(conn)
            if backlog is None:
                backlog = backlogs[conn] = self._connection_backlog(conn)
            if stream.outbound_bytes + call.out_bytes > limit or backlog > connection_limit:
                slow.append(receiver)
                continue
            backlogs[conn] = backlog + self._queue(call, head, receiver.id_field, events)
        for receiver in slow:
            self.budgets["watch_backlog"] += 1
            slow_head = self._head(self.revision, canceled=True, cancel_reason=MSG_WATCHER_TOO_SLOW)
            self._end_receiver(receiver, slow_head)

    def _connection_backlog(self, conn: Any) -> int:
        """Watch answers of ``conn``'s streams not yet sent (other answers do not count: a
        big Range answer on the same connection must not cancel its watchers)."""
        return sum(c.stream.outbound_bytes + c.out_bytes for c in self.by_connection.get(conn, ()))

    def link_lost(self) -> None:
        """The member went away: every client stream ends Unavailable."""
        self.connected = False
        for feed in list(self.feeds.values()):
            self._drop_feed(feed)
        for call in list(self.calls.values()):
            call.stream.end(status_code(grpc.StatusCode.UNAVAILABLE), MSG_MEMBER_GONE)
