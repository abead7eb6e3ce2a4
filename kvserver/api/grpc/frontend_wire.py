"""The link between a member and one of its gRPC front-end processes: events and framing.

A front end (``kvserver.api.grpc.frontend``) terminates clients' HTTP/2 connections and
hands each gRPC call to its member over one Unix stream socket, the link. Both ends write
events: msgpack arrays, one after another on the stream (``msgpack.Unpacker`` splits them),
the events of one loop turn in one write, so the calls that arrive together reach the member's
raft step together.

From the front end to the member:

- ``(CALL, id, path, metadata, timeout, address, request, common_name)``: a call opens.
  ``metadata`` is a list of ``[name, value]`` pairs, ``timeout`` the seconds left to its
  deadline or None, ``address`` the client's ``host:port``. ``request`` is the serialized
  request of a unary or server-streaming call, or None for a bidirectional stream, whose
  requests follow. ``common_name`` is the CN of the client's verified certificate, or None.
- ``(MSG, id, bytes)``: a bidirectional call's next request.
- ``(HALF_CLOSE, id)``: the client sent its last request.
- ``(CANCEL, id)``: the client reset the call, its deadline passed, or its connection went.
- ``(PAUSE, id)`` / ``(RESUME, id)``: a streaming answer has too much unsent at the client;
  the member's handler waits in its ``write`` until the resume.
- ``(READY,)``: the front end is up and accepts connections.
- ``(STATS, budgets)``: how often its clients met each budget so far (``{name: count}``,
  ``kvserver.api.grpc.budgets``), sent about once a second while it changes.

From the member to the front end:

- ``(HELLO, methods, max_receive, keepalive_min_time, keepalive_interval,
  keepalive_timeout, limits, tls, watch_limits)``: the method table as ``{path: kind}``, the
  biggest request a client may send, keepalive, the connection budgets (``Http2Limits`` as a
  map), the TLS files (or None), and the hub's watch limits (``max_watchers``,
  ``max_watchers_per_stream``, ``max_buffered_bytes``; None: Watch calls are passed on
  like any other), then ``LINK_VERSION``: the first event of a link. A front end started
  from other code than its member's (the files changed under a running member, and a
  front end was restarted) finds another version there and exits: the member serves its
  clients itself meanwhile.
- ``(REPLY, id, bytes)``: a unary call's answer; the call ended with OK.
- ``(MSG, id, bytes)``: a streaming call's next answer.
- ``(END, id, code, details)``: the call ended with this status (RESOURCE_EXHAUSTED at once
  when the front end already has ``frontend_max_calls`` calls in flight here).

Watches (``kvserver.api.grpc.watch_fanout`` in the front end, ``kvserver.api.grpc.watch_feeds``
here) do not travel as calls: a front end keeps its clients' Watch streams itself and asks the
member for one *feed* per distinct watch, which it fans out to every client watcher of that
range. From the front end:

- ``(WOPEN, cid, metadata, address, common_name)``: a client opened a Watch stream; the member
  checks it as it checks a Watch call (``hasleader``, a restarted member's replay) and
  answers WOPENED, or WEND with the status that refuses it.
- ``(WAUTH, cid, rid, key, range_end)``: may the stream's user read this range (auth)?
  Answered by WAUTHED; the member keeps the range to re-check it when auth changes.
- ``(WFORGET, cid, rid)``: that watcher ended. ``(WCLOSE, cid)``: the stream ended.
- ``(FEED, fid, key, range_end, start_revision, filters, prev_kv, progress_notify,
  fragment)``: open a feed (a watcher of the member's hub, watch id ``fid``).
- ``(UNFEED, fid)``: no client watches that feed any more.
- ``(FEED_PROGRESS,)``: answer with a progress response once every feed is synced.

From the member:

- ``(WOPENED, cid, cluster_id, member_id, revision, raft_term)``: the stream may start (the
  member's header fields, for the answers the front end makes itself, such as a refusal);
  ``(WEND, cid, code, details)``: the stream is refused or must end (``hasleader`` and the
  member lost its leader).
- ``(WAUTHED, cid, rid, reason)``: ``reason`` is empty when permitted, else etcd's cancel
  reason. ``(WREVOKE, cid, rid, reason)``: auth changed and the user may no longer read it.
- ``(FED, fid, cluster_id, member_id, revision, raft_term, created, canceled,
  compact_revision, cancel_reason, fragment, events)``: a response of feed ``fid`` (or
  -1: the answer to FEED_PROGRESS), ``events`` the serialized ``events`` fields of a
  WatchResponse (``kvserver.api.grpc.watch.event_field``), encoded once for every client.

Call ids are the front end's, unique per link. An event about an id the receiver does not
know (a call that ended meanwhile) is ignored. Anything else malformed ends the link.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack

LINK_VERSION = 2  # of this list of events: changed whenever an event changes

CALL = 1
MSG = 2
HALF_CLOSE = 3
CANCEL = 4
PAUSE = 5
RESUME = 6
READY = 7
HELLO = 8
REPLY = 9
END = 10
STATS = 11
# watches (front end to member)
WOPEN = 20
WAUTH = 21
WFORGET = 22
WCLOSE = 23
FEED = 24
UNFEED = 25
FEED_PROGRESS = 26
# watches (member to front end)
WOPENED = 30
WEND = 31
WAUTHED = 32
WREVOKE = 33
FED = 34
WATCH_EVENTS_TO_MEMBER = frozenset({WOPEN, WAUTH, WFORGET, WCLOSE, FEED, UNFEED, FEED_PROGRESS})
WATCH_EVENTS_TO_FRONTEND = frozenset({WOPENED, WEND, WAUTHED, WREVOKE, FED})

# A unary answer travels whole in one event, and a member answers a range of any size (as
# etcd does); msgpack's own ceiling for one bin is 4 GiB, its Unpacker's default 100 MiB.
MAX_BUFFER_BYTES = 2**32 - 1


def unpacker() -> msgpack.Unpacker:
    """Splits a link's byte stream into events (feed it what arrives, iterate the events)."""
    return msgpack.Unpacker(
        use_list=False, raw=False, max_buffer_size=MAX_BUFFER_BYTES, strict_map_key=False
    )


class EventWriter:
    """Packs events and writes those of one loop turn in one go."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.packer = msgpack.Packer(use_bin_type=True, autoreset=False)
        self.transport: asyncio.WriteTransport | None = None
        self.scheduled = False

    def send(self, event: tuple[Any, ...]) -> None:
        self.packer.pack(event)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        data = self.packer.bytes()
        if not data:
            return
        self.packer.reset()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
