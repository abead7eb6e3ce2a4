"""The member's end of a front end's watches: one stream of *feeds* per link, and the checks
each client Watch stream gets.

A front end keeps its clients' Watch streams itself (``kvserver.api.grpc.watch_fanout``) and
asks its member for one feed per distinct watch: 5,000 clients watching one prefix through a
front end are one watcher in the member's hub, one event per revision on the link, and the
fan-out to 5,000 runs in the front end's process. That is etcd's grpc-proxy coalescing,
built into the link (``kvserver.api.grpc.frontend_wire`` lists the events).

``WatchFeeds`` serves one link:

- **Feeds.** Every feed is a watcher of one ``WatchStream`` of the hub, its watch id the front
  end's feed id, so the hub's semantics (history replay, ``prev_kv``, filters, fragments,
  progress notifications, compaction, bounded queues) are the same as for a Watch call. The
  stream may hold as many watchers as the hub does (``max_watchers``), since its watchers are
  a front end's whole population. A refused create comes back from the hub with watch id -1;
  refusals queue in request order, so the n-th refusal is the n-th refused feed id. Each
  response goes to the front end as FED: its header and flags, and its events serialized
  once (``event_field``). While the link's socket buffer is full, responses wait in the hub,
  within its per-watcher bounds.
- **Progress.** FEED_PROGRESS asks the hub for a stream progress response (every feed
  synced); while one is catching up, the request is retried after each response, as a Watch
  call defers it.
- **The checks of a Watch call, per client stream.** WOPEN: a learner refuses it,
  ``hasleader`` (refused without a
  leader, ended once the member has lost it, ``LeaderMonitor``) and a restarted member's
  replay (``wait_recovered``). WAUTH: with auth enabled, the user (token metadata, else the
  client certificate's name) must be allowed to read the range; the answer is etcd's cancel
  reason. The permitted ranges are kept, and when auth changes any the user may no longer
  read is revoked (WREVOKE), as a Watch call re-checks its watchers.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Protocol

import grpc

from kvserver.kvpb.errors import EtcdError, GrpcCode
from kvserver.kvpb.service_errors import MSG_NOT_FOR_LEARNER, ServiceError, no_leader
from kvserver.kvpb.watch import WatchCreateRequest, WatchFilter
from kvserver.server.service import serves_as_learner
from kvserver.watch.hub import INVALID_WATCH_ID, WatchStream

from . import frontend_wire as wire
from .calls import Calls, requires_leader, status_of
from .leader_monitor import LeaderMonitor
from .rpc import ClientIdentity, RpcContext, status_code
from .watch import (
    ENCODE_STEP_EVENTS,
    REASON_PERMISSION_DENIED,
    event_field,
    event_fields_in_steps,
    go_status_text,
    join_in_steps,
)

log = logging.getLogger(__name__)

MAX_CLIENT_STREAMS = 65_536  # per link: a front end keeps far fewer (its connection budgets)


class LinkEnd(Protocol):
    """What feeds need of the link: its writer and whether its socket buffer is full."""

    writer: wire.EventWriter
    write_paused: bool


class _NoAnswers:
    """The answer stream of a client stream's context here: nothing is answered through it."""

    async def write_message(self, data: bytes) -> None:
        raise RuntimeError("a front end's watch stream is answered through its feeds")

    def end(self, code: int, details: str) -> None:
        pass


_NO_ANSWERS = _NoAnswers()


class _ClientStream:
    """One client Watch stream a front end keeps: who it is, and what it may read."""

    __slots__ = ("feeds", "cid", "context", "user", "ranges", "opening")

    def __init__(self, feeds: WatchFeeds, cid: int, context: RpcContext):
        self.feeds = feeds
        self.cid = cid
        self.context = context
        self.user: str | None = None  # the user of the last permitted range (auth enabled)
        self.ranges: dict[int, tuple[bytes, bytes]] = {}  # permitted, by the front end's id
        self.opening: asyncio.Task[None] | None = None

    def fail(self, error: EtcdError) -> None:
        """Ends the client's stream with ``error`` (``LeaderMonitor``)."""
        self.feeds.end_client(self, status_code(status_of(error.grpc_code)), error.message)


class WatchFeeds:
    def __init__(self, service: Any, calls: Calls, link: LinkEnd):
        self.service = service
        self.calls = calls
        self.link = link
        self.loop = asyncio.get_running_loop()
        self.stream: WatchStream | None = None
        self.sender: asyncio.Task[None] | None = None
        self.refused: deque[int] = deque()  # feed ids the hub refused, in request order
        self.progress_deferred = False
        self.resumed = asyncio.Event()
        self.clients: dict[int, _ClientStream] = {}
        self.leader_monitor = LeaderMonitor(service, "grpc-watch-feeds-leader-monitor")
        auth = calls.auth
        self.unsubscribe = auth.on_change(self._recheck) if auth is not None else None
        self.closed = False

    # --- events from the front end -------------------------------------------------------------

    def event(self, event: tuple[Any, ...]) -> None:
        """One watch event of the link (malformed ones raise: the link closes)."""
        kind = event[0]
        if kind == wire.FEED:
            self._feed(*event[1:])
        elif kind == wire.UNFEED:
            if self.stream is not None:
                self.stream.cancel(_int(event[1]))
        elif kind == wire.FEED_PROGRESS:
            self._progress()
        elif kind == wire.WOPEN:
            self._open(*event[1:])
        elif kind == wire.WAUTH:
            self._authorize(*event[1:])
        elif kind == wire.WFORGET:
            client = self.clients.get(event[1])
            if client is not None:
                client.ranges.pop(event[2], None)
        elif kind == wire.WCLOSE:
            client = self.clients.pop(event[1], None)
            if client is not None:
                self._drop(client)
        else:
            raise ValueError(f"unknown watch event {kind!r}")

    def _feed(
        self,
        fid: int,
        key: bytes,
        range_end: bytes,
        start_revision: int,
        filters: tuple[int, ...],
        prev_kv: bool,
        progress_notify: bool,
        fragment: bool,
    ) -> None:
        if type(key) is not bytes or type(range_end) is not bytes or _int(fid) <= 0:
            raise ValueError("a feed with a bad key, range end or id")
        stream = self._stream()
        req = WatchCreateRequest(
            key=key,
            range_end=range_end,
            start_revision=_int(start_revision),
            progress_notify=bool(progress_notify),
            filters=tuple(WatchFilter(_int(f)) for f in filters),
            prev_kv=bool(prev_kv),
            watch_id=fid,
            fragment=bool(fragment),
        )
        if stream.create(req) is None:
            self.refused.append(fid)

    def _progress(self) -> None:
        stream = self._stream()
        if not self.progress_deferred and not stream.request_progress():
            self.progress_deferred = True

    def _stream(self) -> WatchStream:
        if self.stream is None:
            limits = getattr(getattr(self.service, "watch_hub", None), "limits", None)
            most = limits.max_watchers if limits is not None else None
            self.stream = self.service.watch_stream(most)
            self.sender = self.loop.create_task(self._send(self.stream))
        return self.stream

    # --- the feeds' responses ------------------------------------------------------------------

    async def _send(self, stream: WatchStream) -> None:
        service = self.service
        link = self.link
        try:
            async for resp in stream:
                fid = resp.watch_id
                if fid == INVALID_WATCH_ID and resp.created and self.refused:
                    fid = self.refused.popleft()
                if len(resp.events) > ENCODE_STEP_EVENTS:
                    try:
                        events = await join_in_steps(event_fields_in_steps(resp))
                    finally:
                        stream.release(resp)
                else:
                    events = b"".join([event_field(ev) for ev in resp.events])
                link.writer.send(
                    (
                        wire.FED,
                        fid,
                        service.cluster_id,
                        service.member_id,
                        resp.header.revision,
                        service.raft_term,
                        resp.created,
                        resp.canceled,
                        resp.compact_revision,
                        resp.cancel_reason,
                        resp.fragment,
                        events,
                    )
                )
                del resp
                if self.progress_deferred and stream.request_progress():
                    self.progress_deferred = False
                while link.write_paused and not self.closed:
                    self.resumed.clear()
                    await self.resumed.wait()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("watch feeds: sending a response failed; closing the feeds")
            stream.close()

    def resume(self) -> None:
        """The link's socket buffer has room again."""
        self.resumed.set()

    # --- client streams ------------------------------------------------------------------------

    def _open(
        self, cid: int, metadata: tuple[tuple[str, str], ...], address: str, cn: str | None
    ) -> None:
        if cid in self.clients or type(metadata) is not tuple or type(address) is not str:
            raise ValueError("a watch stream with a reused id or bad metadata")
        if len(self.clients) >= MAX_CLIENT_STREAMS:
            self._answer_end(
                cid, grpc.StatusCode.RESOURCE_EXHAUSTED, "raftkv: too many watch streams"
            )
            return
        context = RpcContext(ClientIdentity(address, cn), metadata, None, _NO_ANSWERS)
        client = self.clients[cid] = _ClientStream(self, cid, context)
        client.opening = self.loop.create_task(self._check_open(client))

    async def _check_open(self, client: _ClientStream) -> None:
        try:
            self.calls.caller(client.context)
            if serves_as_learner(self.service):
                raise ServiceError(GrpcCode.UNAVAILABLE, MSG_NOT_FOR_LEARNER)
            if requires_leader(client.context):
                if self.service.status().leader == 0:
                    raise no_leader()
                self.leader_monitor.add(client)
            # A restarted member replaying its log would report those old events as new ones.
            await self.service.wait_recovered()
        except EtcdError as exc:
            client.fail(exc)
            return
        if self.clients.get(client.cid) is client:
            service = self.service
            self.link.writer.send(
                (
                    wire.WOPENED,
                    client.cid,
                    service.cluster_id,
                    service.member_id,
                    service.store.revision,
                    service.raft_term,
                )
            )

    def _authorize(self, cid: int, rid: int, key: bytes, range_end: bytes) -> None:
        client = self.clients.get(cid)
        if client is None:
            return  # ended meanwhile
        if type(key) is not bytes or type(range_end) is not bytes:
            raise ValueError("a range to authorize that is not bytes")
        reason = ""
        auth = self.calls.auth
        if auth is not None and auth.enabled:
            try:
                user = self.calls.user(client.context)
            except EtcdError as exc:
                reason = go_status_text(GrpcCode(exc.grpc_code), exc.message)
            else:
                if auth.can_read(user, key or b"\0", range_end):
                    client.user = user
                    client.ranges[rid] = (key or b"\0", range_end)
                else:
                    reason = REASON_PERMISSION_DENIED
        self.link.writer.send((wire.WAUTHED, cid, rid, reason))

    def _recheck(self) -> None:
        """Auth changed: revoke the ranges their streams' users may no longer read."""
        auth = self.calls.auth
        if auth is None:
            return
        for client in self.clients.values():
            if client.user is None:
                continue
            for rid, (key, range_end) in list(client.ranges.items()):
                if not auth.can_read(client.user, key, range_end):
                    del client.ranges[rid]
                    self.link.writer.send((wire.WREVOKE, client.cid, rid, REASON_PERMISSION_DENIED))

    def end_client(self, client: _ClientStream, code: int, details: str) -> None:
        if self.clients.pop(client.cid, None) is client:
            self._drop(client)
            self.link.writer.send((wire.WEND, client.cid, code, details))

    def _answer_end(self, cid: int, code: grpc.StatusCode, details: str) -> None:
        self.link.writer.send((wire.WEND, cid, status_code(code), details))

    def _drop(self, client: _ClientStream) -> None:
        self.leader_monitor.discard(client)
        if client.opening is not None and not client.opening.done():
            client.opening.cancel()

    def close(self) -> None:
        """The link closed: every feed leaves the hub, every check stops."""
        self.closed = True
        self.resumed.set()
        if self.unsubscribe is not None:
            self.unsubscribe()
        for client in list(self.clients.values()):
            self._drop(client)
        self.clients.clear()
        if self.stream is not None:
            self.stream.close()
        if self.sender is not None:
            self.sender.cancel()


def _int(value: Any) -> int:
    if type(value) is not int:
        raise ValueError(f"not an integer: {value!r}")
    return value
