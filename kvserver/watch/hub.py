"""The watch hub: etcd's watchable store for raftkv (history replay + live events).

Modelled on etcd's ``server/storage/mvcc/watchable_store.go`` and the v3rpc watch stream
(semantics, not code). A *watcher* selects a key, a range ``[key, range_end)`` or every key
``>= key`` (``range_end == b"\\0"``), from a start revision; it receives every matching
event (PUT / DELETE with ``kv`` and, if asked, ``prev_kv``) with ``mod_revision >= start``,
in revision order, each exactly once, until it is canceled. A *stream* (one HTTP
``/v3/watch`` request, etcd's gRPC Watch stream) multiplexes watchers into one ordered
sequence of ``WatchResponse``s, shaped like etcd's (``header``, ``watch_id``, ``created``,
``canceled``, ``compact_revision``, ``cancel_reason``, ``fragment``, ``events``). The
messages (``WatchCreateRequest``, ``WatchResponse``, ``WatchFilter``) are the wire types of
``kvserver.kvpb.watch``, which the client shares.

Contract with the driver
------------------------
- ``WatchHub(source)``: ``source`` is the MVCC store (``revision``, ``compact_revision``,
  ``replay``). After the store applies an entry that produced events, and before
  anything else runs on the event loop, call ``hub.notify(result.revision, result.events)``
  (all events of one revision, in the store's order). ``notify`` is synchronous and returns
  at once when no watcher is synced.
- After a snapshot restore replaced the store, call ``hub.reset(new_store)``: every watcher
  then catches up from the new store's history (or is told it was compacted).
- ``hub.progress_tick()`` every progress interval (etcd: 10 min,
  ``--experimental-watch-progress-notify-interval``) sends progress notifications to
  ``progress_notify`` watchers that got no events since the previous tick.
- ``hub.close()`` at shutdown cancels every watcher.

States of a watcher, and why delivery is gapless and duplicate-free
-------------------------------------------------------------------
Each watcher keeps ``next_rev``: every event it must see with a lower revision has been
queued to its stream (invariant). Events of one revision are queued together (one
response, or consecutive fragments), so ``next_rev`` always sits at a revision boundary.

- *unsynced* (start revision in the past, or fallen behind): it is not in the live
  matching sets, so ``notify`` never queues for it. When its stream's consumer asks for the
  next response and the watcher has no events queued, the stream reads one chunk of history
  ``source.replay_part(next_rev, ..., max_events=replay_chunk_events,
  max_scanned=replay_chunk_scanned)`` — synchronously, a few chunks per loop turn,
  so no revision can be applied in the middle of a read. A chunk that reaches the store's
  current revision ``R`` sets ``next_rev = R + 1`` and makes the watcher *synced* in the
  same synchronous step; a truncated chunk sets ``next_rev`` past its last revision and
  stays unsynced. A chunk that stops inside a revision (one of more records than a chunk
  looks at) queues the events before it, keeps that revision's events so far in the
  watcher and sets ``next_rev`` to it; the next chunks continue inside it (``skip``), and
  its events are queued together once it is whole. The history is the buffer for events
  that happen during a replay: they are read by the next chunk, never queued twice.
- *synced*: ``notify(rev, events)`` queues the matching events iff ``rev >= next_rev``.
  That test is the de-duplication: a notification that arrives for a revision the replay
  already read (the store applied it, the driver has not called ``notify`` yet) is dropped.
  ``notify`` for a revision that skips one (a missed call) moves every synced watcher back
  to unsynced, to be replayed from history: a lost ``notify`` degrades to a replay, never
  to a gap.
- *done*: canceled; its last response says so (``canceled``, and ``cancel_reason`` or
  ``compact_revision``).

If history needed by an unsynced watcher has been compacted, the watcher gets etcd's
compacted response (``compact_revision`` set, ``canceled`` true) and is done. A negative
start revision is refused at creation (``created`` and ``canceled``, watch id -1, reason
``etcdserver: mvcc: required revision has been compacted``), as etcd 3.5.x does.

Bounds
------
Everything is bounded by ``WatchLimits``: watchers per hub and per stream, and per watcher
the events and bytes queued but not yet taken by the consumer. A synced watcher whose next
revision would overflow its queue (and whose queue is not empty: a single revision always
fits) is, with ``OverflowPolicy.CANCEL`` (the default), canceled with ``cancel_reason ==
MSG_WATCHER_TOO_SLOW`` after the responses already queued (the client resumes from the last
revision it received + 1); with ``OverflowPolicy.RESYNC`` it becomes unsynced instead and
later catches up from history (exact, no cancel, unless that history gets compacted first).
A replay chunk is read only when the watcher has nothing queued, so queues stay within one
chunk or the live bounds. etcd instead keeps slow watchers as "victims" with unbounded
batches and has no such cancel reason: this text is raftkv's.

Responses (etcd's rules)
------------------------
- create: ``created`` with the new ``watch_id`` and header revision = the store's current
  revision; refused creates: ``created`` + ``canceled`` + ``cancel_reason``, watch id -1
  (empty range ``mvcc: watcher range is empty``, duplicate id ``mvcc: duplicate watch ID
  provided on the WatchStream``, too many watchers, negative start revision).
- events: header revision = the revision of the events for live responses; for a replay
  chunk the store's current revision when the chunk reached it, else its last event's
  revision (never more than what the watcher has been given, unlike etcd's replay batches).
  Events all filtered out (``NOPUT``/``NODELETE``) send nothing. ``prev_kv`` is included
  only if asked for. ``fragment``: an events response over ``max_response_bytes`` with at
  least two events is split, every part but the last with ``fragment`` true (etcd's
  sendFragments).
- cancel (by the client): undelivered responses of that watcher are dropped, then
  ``canceled`` with the current revision. Compacted: ``compact_revision`` + ``canceled``
  with header revision 0 (etcd sends the compacted response without a revision).
- progress: a response with only a header revision (no events, not created/canceled)
  means "this watcher has received every event up to this revision". Per watcher from
  ``progress_tick`` (only synced ones); per stream from ``request_progress`` (watch id -1,
  only when every watcher of the stream is synced, queued after everything they have
  queued — etcd 3.5's RequestProgressAll).
- The header's cluster/member/term are left 0: the HTTP layer fills them.

Big revisions
-------------
A revision with more than ``BIG_REVISION_EVENTS`` events (a delete of a large prefix, a
revoke of a lease with many keys: up to millions of events, in key order) is not matched in
``notify``: that would hold the event loop for O(watchers x events). ``notify`` queues, in
O(1) per synced watcher, the watcher's share of the revision where its response belongs in
its stream (and moves ``next_rev`` past it); the stream's consumer then works on it when it
reaches the head of the queue, ``BIG_STEP_EVENTS`` events per ``poll``, returning None (and
``__anext__`` yielding to the loop) between steps. First the events are copied into the
hub's own list while their key order is checked (once per revision, shared by its
watchers); then each watcher's span is found by bisection (events in key order) or every
event is looked at (a large txn in request order); its events are filtered, stripped of
``prev_kv`` unless asked for, and sized. What the watcher receives is unchanged: one response
with every matching event of the revision, in the store's order (or consecutive fragments if
it asked for ``fragment``: each full part is delivered as soon as it is selected). Responses
queued behind it, of that watcher or another watcher of the stream, wait, so no later
revision overtakes it. The events a big revision or a big response held are dropped a slice
per loop turn (``_REAP_STEP``; a million objects freed at once take tens of ms): the hub's
own lists when done with them, and a response's events once its consumer calls
``stream.release(resp)`` before dropping it. While a share is being selected it counts as
one queued item, not as buffered events (the revision's events are the store's, already in
memory); later revisions queue behind it within the usual bounds.

Costs and known limits
----------------------
``notify`` costs one dict lookup per event for single-key watchers and a scan of all synced
range/prefix watchers per event (no interval tree yet), for revisions of at most
``BIG_REVISION_EVENTS`` events; for bigger ones O(1) per synced watcher (see above). A
history replay reads at most ``replay_chunk_scanned`` records or ``replay_chunk_events``
events per chunk, inside a revision too; a watcher inside a huge revision holds the
selected events of it read so far. A watcher from ``hub.create`` that is dropped without
``cancel()`` stays registered until its buffer overflows (CANCEL policy) or the hub closes;
the HTTP layer must ``close()`` streams of disconnected clients.

Consumer API (asyncio)
----------------------
``stream = hub.open_stream()`` → ``stream.create(WatchCreateRequest(...))``,
``stream.cancel(watch_id)``, ``stream.request_progress()``, ``async for resp in stream``
(ends after ``stream.close()``, ``hub.close()``, or once no watcher is live after
``stream.close_input()``); ``stream.poll()`` takes one response
without waiting (None if none, including while a big revision is being selected:
``_fill_pending()`` then says more polls will make progress); ``stream.release(resp)`` hands
a big response's events back to be dropped gradually. ``hub.create(key, ...)`` is a one-watcher convenience:
``async for resp in watcher`` ends after its canceled response.

Where it is wired
-----------------
- ``kvserver/server/replicated_kv.py``: ``RaftKV`` owns the hub (``watch_hub``); ``apply`` notifies it for
  every entry whose result has events (store writes and the lessor's revokes); ``restore``
  calls ``reset``; a task calls ``progress_tick`` every ``WATCH_PROGRESS_INTERVAL_S``;
  ``stop`` closes it. ``KVService.watch_stream()`` opens a stream.
- ``kvserver/api/http/watch.py``: ``POST /v3/watch`` (and ``/v3beta/watch``) feeds the request
  objects of the body to ``create`` / ``cancel`` / ``request_progress`` as they arrive,
  calls ``close_input`` when the body ends, writes each response as a ``{"result": ...}``
  line with the header's cluster/member/term filled in, and ``close()``s the stream when the
  client disconnects. Watches are served by any member from its local store (etcd does the
  same: a follower's watch lags by its apply delay).
- ``kvserver/client/watch.py``: the client's iterators, resuming from the last revision + 1.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from operator import le
from typing import Protocol

from kvserver.kvpb.errors import MSG_COMPACTED, CompactedError, EtcdError, GrpcCode
from kvserver.kvpb.kv import Event, EventType, ResponseHeader
from kvserver.kvpb.watch import WatchCreateRequest, WatchFilter, WatchResponse

__all__ = [
    "BIG_REVISION_EVENTS",
    "BIG_STEP_EVENTS",
    "MSG_DUPLICATE_WATCH_ID",
    "MSG_EMPTY_WATCHER_RANGE",
    "MSG_TOO_MANY_WATCHERS",
    "MSG_WATCHER_TOO_SLOW",
    "MSG_WATCH_STOPPED",
    "OverflowPolicy",
    "WatchCreateError",
    "WatchHub",
    "WatchLimits",
    "WatchSource",
    "WatchStream",
    "Watcher",
]

MSG_WATCHER_TOO_SLOW = "raftkv: watcher is too slow: its buffer is full"
MSG_EMPTY_WATCHER_RANGE = "mvcc: watcher range is empty"  # etcd's ErrEmptyWatcherRange
MSG_DUPLICATE_WATCH_ID = "mvcc: duplicate watch ID provided on the WatchStream"
MSG_TOO_MANY_WATCHERS = "raftkv: too many watchers"
MSG_NEGATIVE_WATCH_ID = "raftkv: watch_id must not be negative"
MSG_WATCH_STOPPED = "etcdserver: server stopped"

INVALID_WATCH_ID = -1  # etcd's clientv3.InvalidWatchID
# A revision with more events than this is matched to its watchers a step at a time, after
# ``notify`` returned (see "Big revisions" in the module docstring); the events looked at per
# step, per watcher, are ``BIG_STEP_EVENTS``.
BIG_REVISION_EVENTS = 4_096
BIG_STEP_EVENTS = 4_096
_REAP_STEP = 16_384  # references dropped from the graveyard per poll
_FILLS_PER_POLL = 4  # replay chunks read per poll() before yielding to the loop
_MAX_PENDING_STREAM_PROGRESS = 8
_EVENT_OVERHEAD_BYTES = 64  # rough per-event cost beyond key and value bytes
_KV_OVERHEAD_BYTES = 48

_PUT = EventType.PUT
_DELETE = EventType.DELETE

# Kinds of queued items.
_K_EVENTS = 0
_K_CREATED = 1
_K_PROGRESS = 2
_K_FINAL = 3  # the watcher's canceled/compacted response: delivered even if dropped
_K_CONTROL = 4  # stream-level, no watcher (refused create)
_K_PROGRESS_ALL = 5
_K_BIG = 6  # a watcher's share of a big revision, selected when it reaches the head


class OverflowPolicy(Enum):
    CANCEL = "cancel"  # cancel the slow watcher with MSG_WATCHER_TOO_SLOW
    RESYNC = "resync"  # drop it back to replaying from history


@dataclass(frozen=True, slots=True)
class WatchLimits:
    max_watchers: int = 10_000  # per hub
    max_watchers_per_stream: int = 1_000
    max_buffered_events: int = 4_096  # per watcher, queued and not yet taken
    max_buffered_bytes: int = 8 * 1024 * 1024  # per watcher (keys + values + overhead)
    replay_chunk_events: int = 1_000  # events read from history at a time
    # log records looked at per history read, matching or not (a chunk may hold no event)
    replay_chunk_scanned: int = 8_192
    max_response_bytes: int = 1536 * 1024  # fragmentation threshold (etcd's request limit)
    on_overflow: OverflowPolicy = OverflowPolicy.CANCEL

    def __post_init__(self) -> None:
        if (
            min(
                self.max_watchers,
                self.max_watchers_per_stream,
                self.max_buffered_events,
                self.max_buffered_bytes,
                self.replay_chunk_events,
                self.replay_chunk_scanned,
                self.max_response_bytes,
            )
            < 1
        ):
            raise ValueError("watch limits must be positive")
        if self.replay_chunk_events > self.max_buffered_events:
            raise ValueError("replay_chunk_events must not exceed max_buffered_events")


class WatchCreateError(EtcdError):
    """``WatchHub.create`` refused a watcher (the stream API answers with a response)."""

    grpc_code = GrpcCode.INVALID_ARGUMENT


class WatchSource(Protocol):
    """What the hub reads (``kvserver.mvcc.MVCCStore`` has it)."""

    @property
    def revision(self) -> int: ...

    @property
    def compact_revision(self) -> int: ...

    def replay_part(
        self,
        revision: int,
        key: bytes,
        range_end: bytes = b"",
        *,
        skip: int = 0,
        prev_kv: bool = False,
        max_events: int = 0,
        max_scanned: int = 0,
    ) -> tuple[list[Event], int, int]: ...


def _header(revision: int) -> ResponseHeader:
    return ResponseHeader(0, 0, revision, 0)


def _event_bytes(ev: Event) -> int:
    kv = ev.kv
    n = len(kv.key) + len(kv.value) + _EVENT_OVERHEAD_BYTES
    prev = ev.prev_kv
    if prev is not None:
        n += len(prev.key) + len(prev.value) + _KV_OVERHEAD_BYTES
    return n


class _State(Enum):
    UNSYNCED = 0
    SYNCED = 1
    DONE = 2


class Watcher:
    """One watch (see the module docstring). Public read-only attributes: ``watch_id``,
    ``key``, ``range_end``, ``prev_kv``, ``filters``, ``progress_notify``, ``fragment``,
    ``next_revision``, ``synced``, ``done``, ``buffered_events``, ``buffered_bytes``."""

    __slots__ = (
        "_hub",
        "_stream",
        "watch_id",
        "key",
        "range_end",
        "prev_kv",
        "filters",
        "progress_notify",
        "fragment",
        "_no_put",
        "_no_delete",
        "_single",
        "_open_ended",
        "_state",
        "_next_rev",
        "_buf_events",
        "_buf_bytes",
        "_buf_items",
        "_dropped",
        "_quiet",
        "_progress_pending",
        "_partial",
        "_partial_sizes",
        "_partial_skip",
    )

    def __init__(
        self,
        hub: WatchHub,
        stream: WatchStream,
        watch_id: int,
        key: bytes,
        range_end: bytes,
        req: WatchCreateRequest,
    ) -> None:
        self._hub = hub
        self._stream = stream
        self.watch_id = watch_id
        self.key = key
        self.range_end = range_end
        self.prev_kv = req.prev_kv
        self.filters = tuple(req.filters)
        self.progress_notify = req.progress_notify
        self.fragment = req.fragment
        self._no_put = WatchFilter.NOPUT in self.filters
        self._no_delete = WatchFilter.NODELETE in self.filters
        self._single = range_end == b""
        self._open_ended = range_end == b"\0"
        self._state = _State.UNSYNCED
        # invariant: every matching event with mod_revision < _next_rev has been queued
        self._next_rev = 0
        self._buf_events = 0  # events queued in the stream, not yet taken
        self._buf_bytes = 0
        self._buf_items = 0  # responses queued, of any kind
        self._dropped = False  # canceled by the client: queued responses are discarded
        self._quiet = True  # no events taken since the last progress tick
        self._progress_pending = False  # a progress response is queued
        # A history read that stopped inside revision _next_rev (a revision of more records
        # than a chunk): its selected events and their sizes so far, and how many of the
        # revision's records were read. Kept until the revision is whole, then queued.
        self._partial: list[Event] = []
        self._partial_sizes: list[int] = []
        self._partial_skip = 0

    # --- read-only views ----------------------------------------------------------------------

    @property
    def next_revision(self) -> int:
        return self._next_rev

    @property
    def synced(self) -> bool:
        return self._state is _State.SYNCED

    @property
    def done(self) -> bool:
        return self._state is _State.DONE

    @property
    def buffered_events(self) -> int:
        return self._buf_events

    @property
    def buffered_bytes(self) -> int:
        return self._buf_bytes

    def __repr__(self) -> str:
        return (
            f"Watcher(id={self.watch_id}, key={self.key!r}, range_end={self.range_end!r}, "
            f"state={self._state.name}, next_rev={self._next_rev})"
        )

    # --- consumer API of a one-watcher stream (WatchHub.create) -------------------------------

    def cancel(self) -> None:
        """Cancel: queued responses are dropped and a ``canceled`` response follows."""
        self._finish("", drop=True)

    def poll(self) -> WatchResponse | None:
        return self._own_stream().poll()

    def __aiter__(self) -> Watcher:
        self._own_stream()
        return self

    async def __anext__(self) -> WatchResponse:
        return await self._own_stream().__anext__()

    def _own_stream(self) -> WatchStream:
        if not self._stream._private:
            raise TypeError("this watcher belongs to a shared WatchStream: consume the stream")
        return self._stream

    # --- internals ------------------------------------------------------------------------------

    def matches(self, key: bytes) -> bool:
        if self._single:
            return key == self.key
        if key < self.key:
            return False
        return self._open_ended or key < self.range_end

    def _select(
        self, events: Sequence[Event], strip_cache: dict[int, Event] | None
    ) -> tuple[Event, ...]:
        """Apply the filters and drop ``prev_kv`` unless asked for."""
        no_put = self._no_put
        no_delete = self._no_delete
        keep_prev = self.prev_kv
        if keep_prev and not no_put and not no_delete:
            return tuple(events)
        out = []
        for ev in events:
            if ev.type is _PUT:
                if no_put:
                    continue
            elif no_delete:
                continue
            if not keep_prev and ev.prev_kv is not None:
                if strip_cache is None:
                    ev = Event(ev.type, ev.kv)
                else:
                    stripped = strip_cache.get(id(ev))
                    if stripped is None:
                        stripped = strip_cache[id(ev)] = Event(ev.type, ev.kv)
                    ev = stripped
            out.append(ev)
        return tuple(out)

    def _queue_events(self, header_rev: int, events: tuple[Event, ...], sizes: list[int]) -> None:
        """Queue one revision's (or one replay chunk's) events: one response, or fragments
        (etcd's sendFragments) when asked for and over ``max_response_bytes``."""
        header = _header(header_rev)
        push = self._stream._push
        limit = self._hub.limits.max_response_bytes
        total = sum(sizes)
        if not self.fragment or len(events) < 2 or total < limit:
            push(self, WatchResponse(header, self.watch_id, events=events), _K_EVENTS, total)
            return
        parts: list[tuple[int, int, int]] = []  # (start, stop, bytes)
        start = 0
        acc = 0
        for i, size in enumerate(sizes):
            if i > start and acc + size >= limit:
                parts.append((start, i, acc))
                start, acc = i, 0
            acc += size
        parts.append((start, len(events), acc))
        last = len(parts) - 1
        for n, (a, b, nbytes) in enumerate(parts):
            resp = WatchResponse(header, self.watch_id, fragment=n != last, events=events[a:b])
            push(self, resp, _K_EVENTS, nbytes)

    def _offer_live(
        self, revision: int, events: list[Event], strip_cache: dict[int, Event]
    ) -> None:
        """Queue the events of one revision (synced watcher, ``revision >= _next_rev``)."""
        selected = self._select(events, strip_cache)
        if not selected:
            return
        sizes = [_event_bytes(ev) for ev in selected]
        total = sum(sizes)
        limits = self._hub.limits
        if self._buf_events and (
            self._buf_events + len(selected) > limits.max_buffered_events
            or self._buf_bytes + total > limits.max_buffered_bytes
        ):
            self._hub._overflow(self, revision)
            return
        self._queue_events(revision, selected, sizes)

    def _fill(self) -> None:
        """Read one chunk of history (unsynced watcher with no events queued)."""
        hub = self._hub
        source = hub._source
        limits = hub.limits
        try:
            events, next_rev, next_skip = source.replay_part(
                self._next_rev,
                self.key,
                self.range_end,
                skip=self._partial_skip,
                prev_kv=self.prev_kv,
                max_events=limits.replay_chunk_events,
                max_scanned=limits.replay_chunk_scanned,
            )
        except CompactedError as err:
            hub.stats["compacted"] += 1
            self._finish("", compact_revision=err.compact_revision)  # drops any partial
            return
        hub.stats["replayed_events"] += len(events)
        resumed_rev = self._next_rev
        selected: Sequence[Event] = self._select(events, None)
        sizes = [_event_bytes(ev) for ev in selected]
        if self._partial and (next_rev != resumed_rev or not next_skip):
            # The revision an earlier read stopped inside is whole now: its events lead.
            selected = [*self._partial, *selected]
            sizes = self._partial_sizes + sizes
            self._partial, self._partial_sizes = [], []
        if next_skip:
            # Stopped inside revision next_rev: what came before it goes out now (every
            # event below _next_rev is queued); its own events wait until it is whole.
            cut = len(selected)
            while cut and selected[cut - 1].kv.mod_revision == next_rev:
                cut -= 1
            self._partial.extend(selected[cut:])
            self._partial_sizes.extend(sizes[cut:])
            self._partial_skip = next_skip
            self._next_rev = next_rev
            if cut:
                header_rev = selected[cut - 1].kv.mod_revision
                self._queue_events(header_rev, tuple(selected[:cut]), sizes[:cut])
            return
        self._partial_skip = 0
        current = source.revision
        truncated = next_rev <= current
        if truncated:
            header_rev = selected[-1].kv.mod_revision if selected else next_rev - 1
            self._next_rev = next_rev
        else:
            header_rev = current
            self._next_rev = max(self._next_rev, current + 1)
        if selected:
            self._queue_events(header_rev, tuple(selected), sizes)
        if not truncated:
            hub._set_synced(self)

    def _drop_partial(self) -> None:
        if self._partial:
            self._hub._bury(self._partial)
        self._partial, self._partial_sizes, self._partial_skip = [], [], 0

    def cancel_with_reason(self, reason: str) -> None:
        """Cancel this watcher from outside the hub (e.g. its user lost the permission to read
        its range): its last response, after the queued ones, says so with ``reason``."""
        self._finish(reason)

    def _finish(self, reason: str, *, compact_revision: int = 0, drop: bool = False) -> None:
        """Cancel: leave the hub, queue the final response (after the queued ones unless
        ``drop``)."""
        if self._state is _State.DONE:
            return
        self._drop_partial()
        hub = self._hub
        hub._remove(self)
        self._state = _State.DONE
        if drop:
            self._dropped = True
        # etcd sends the compacted response without a header revision.
        rev = 0 if compact_revision else hub._source.revision
        resp = WatchResponse(
            _header(rev),
            self.watch_id,
            canceled=True,
            compact_revision=compact_revision,
            cancel_reason=reason,
        )
        stream = self._stream
        stream._watchers.pop(self.watch_id, None)
        if stream._private:
            stream._closed = True
        stream._push(self, resp, _K_FINAL, 0)


def _key_of(ev: Event) -> bytes:
    return ev.kv.key


class _BigRevision:
    """The events of one big revision, shared by the deliveries of every watcher it was
    offered to. Prepared once, a step at a time, by whichever delivery is polled first: the
    events are copied into a list of the hub's own (so that dropping them later, from the
    hub's graveyard, is done a slice at a time, whoever else held them) while their key order
    is checked. Then each delivery locates and selects its share; events stripped of
    ``prev_kv`` are made once when several watchers need them."""

    __slots__ = (
        "hub",
        "revision",
        "events",
        "size",
        "in_key_order",
        "deliveries",
        "_own",
        "_ordered",
        "_stripped",
    )

    def __init__(
        self, hub: WatchHub, revision: int, events: Sequence[Event], share_stripped: bool
    ) -> None:
        self.hub = hub
        self.revision = revision
        self.events: Sequence[Event] = events  # the store's until copied: never changed
        self.size = len(events)
        self.in_key_order: bool | None = None  # known once prepared
        self.deliveries = 0  # not yet complete
        self._own: list[Event] = []
        self._ordered = True  # the events copied so far are in key order
        self._stripped: dict[int, list[Event | None]] | None = {} if share_stripped else None

    def prepare_step(self) -> None:
        """Copy (and check the key order of) ``BIG_STEP_EVENTS`` more events."""
        own = self._own
        a = len(own)
        b = min(self.size, a + BIG_STEP_EVENTS)
        own.extend(self.events[a:b])
        if self._ordered:
            lo = a - 1 if a else 0
            keys = [ev.kv.key for ev in own[lo:b]]
            self._ordered = all(map(le, keys, keys[1:]))
        if b >= self.size:
            self.events = own  # the store's sequence is no longer referenced from here
            self.in_key_order = self._ordered

    def stripped(self, i: int) -> Event:
        ev = self.events[i]
        cache = self._stripped
        if cache is None:
            return Event(ev.type, ev.kv)
        # one small list per step of events: no resize of a million-entry table in one step
        chunk = cache.get(i // BIG_STEP_EVENTS)
        if chunk is None:
            chunk = cache[i // BIG_STEP_EVENTS] = [None] * BIG_STEP_EVENTS
        out = chunk[i % BIG_STEP_EVENTS]
        if out is None:
            out = chunk[i % BIG_STEP_EVENTS] = Event(ev.type, ev.kv)
        return out

    def delivered(self) -> None:
        """One delivery is complete; after the last one, the events go to the graveyard."""
        self.deliveries -= 1
        if self.deliveries == 0:
            self.hub._bury(self._own)
            self._own = []
            self.events = ()
            self._stripped = None


class _BigDelivery:
    """One watcher's share of a big revision, queued in its stream where the revision's
    response belongs and selected there a step at a time (``step``), by the consumer's polls:
    the watcher's responses after it wait behind it, so nothing overtakes the revision."""

    __slots__ = ("big", "w", "pos", "end", "scan", "part", "part_bytes")

    def __init__(self, big: _BigRevision, w: Watcher) -> None:
        self.big = big
        self.w = w
        self.pos = -1  # the next event to look at; -1: the watcher's span is not located yet
        self.end = 0
        self.scan = False  # the events are not in key order: look at every one
        self.part: list[Event] = []  # selected, not yet delivered
        self.part_bytes = 0

    def _locate(self) -> bool:
        """Find the events the watcher may match: its span by bisection when the events are
        in key order, else all of them. False while the order is not known yet."""
        big = self.big
        if big.in_key_order is None:
            big.prepare_step()
            return False
        w = self.w
        if not big.in_key_order:
            self.pos, self.end, self.scan = 0, big.size, True
            return True
        events = big.events
        self.pos = bisect_left(events, w.key, key=_key_of)
        if w._single:
            self.end = bisect_right(events, w.key, lo=self.pos, key=_key_of)
        elif w._open_ended:
            self.end = big.size
        else:
            self.end = bisect_left(events, w.range_end, lo=self.pos, key=_key_of)
        return True

    def step(self) -> tuple[WatchResponse | None, bool]:
        """Look at up to ``BIG_STEP_EVENTS`` events: (a response to deliver now or None,
        whether the watcher's share of the revision is complete)."""
        if self.pos < 0 and not self._locate():
            return None, False
        big = self.big
        w = self.w
        events = big.events
        frag_limit = w._hub.limits.max_response_bytes if w.fragment else 0
        scan = self.scan
        no_put = w._no_put
        no_delete = w._no_delete
        keep_prev = w.prev_kv
        part = self.part
        nbytes = self.part_bytes
        stop = min(self.end, self.pos + BIG_STEP_EVENTS)
        for i in range(self.pos, stop):
            ev = events[i]
            if scan and not w.matches(ev.kv.key):
                continue
            if ev.type is _PUT:
                if no_put:
                    continue
            elif no_delete:
                continue
            if not keep_prev and ev.prev_kv is not None:
                ev = big.stripped(i)
            size = _event_bytes(ev)
            if frag_limit and part and nbytes + size >= frag_limit:
                # etcd's sendFragments: a full part goes out now, marked as not the last
                resp = WatchResponse(
                    _header(big.revision), w.watch_id, fragment=True, events=tuple(part)
                )
                w._hub._bury(part)
                self.part = [ev]
                self.part_bytes = size
                self.pos = i + 1
                return resp, False
            part.append(ev)
            nbytes += size
        self.part_bytes = nbytes
        self.pos = stop
        if stop < self.end:
            return None, False
        if not part:
            return None, True  # nothing of this revision for this watcher
        self.part = []
        resp = WatchResponse(_header(big.revision), w.watch_id, events=tuple(part))
        w._hub._bury(part)  # its references, dropped a slice at a time
        return resp, True


class WatchStream:
    """A multiplexed sequence of responses for several watchers (see the module docstring).
    One consumer; responses of one watcher keep their order."""

    __slots__ = (
        "_hub",
        "_private",
        "_fifo",
        "_watchers",
        "_unsynced",
        "_next_id",
        "_closed",
        "_wakeup",
        "_progress_pending",
        "_input_closed",
        "_max_watchers",
    )

    def __init__(
        self, hub: WatchHub, private: bool = False, max_watchers: int | None = None
    ) -> None:
        self._hub = hub
        self._private = private
        # watchers this stream may hold (the hub's per-stream limit unless given)
        self._max_watchers = (
            hub.limits.max_watchers_per_stream if max_watchers is None else max_watchers
        )
        # (watcher or None, response, kind, bytes)
        # (a _BigDelivery when the kind is _K_BIG)
        self._fifo: deque[tuple[Watcher | None, WatchResponse | _BigDelivery, int, int]] = deque()
        self._watchers: dict[int, Watcher] = {}  # live (not done) watchers by id
        self._unsynced: dict[Watcher, None] = {}  # ordered set
        self._next_id = 0
        self._closed = False
        self._wakeup: asyncio.Event | None = None
        self._progress_pending = 0
        self._input_closed = False  # no more requests will come (close_input)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def watchers(self) -> dict[int, Watcher]:
        """Live watchers by id (a copy)."""
        return dict(self._watchers)

    @property
    def queued(self) -> int:
        """Responses queued and not yet taken."""
        return len(self._fifo)

    # --- requests -----------------------------------------------------------------------------

    def create(self, req: WatchCreateRequest) -> Watcher | None:
        """etcd's create request: queue ``created`` (or a refusal: ``created`` + ``canceled``
        + reason, watch id -1, and return None) and start the watcher."""
        hub = self._hub
        current = hub._source.revision
        if self._closed or hub._closed:
            self._refuse(current, MSG_WATCH_STOPPED)
            return None
        key = req.key or b"\0"  # etcd: an empty key is the smallest key
        range_end = req.range_end
        if req.start_revision < 0:
            self._refuse(current, MSG_COMPACTED)
            return None
        if range_end not in (b"", b"\0") and key >= range_end:
            self._refuse(current, MSG_EMPTY_WATCHER_RANGE)
            return None
        watch_id = req.watch_id
        if watch_id < 0:
            self._refuse(current, MSG_NEGATIVE_WATCH_ID)
            return None
        if watch_id == 0:
            while self._next_id in self._watchers:
                self._next_id += 1
            watch_id = self._next_id
            self._next_id += 1
        elif watch_id in self._watchers:
            self._refuse(current, MSG_DUPLICATE_WATCH_ID)
            return None
        if (
            len(hub._watchers) >= hub.limits.max_watchers
            or len(self._watchers) >= self._max_watchers
        ):
            self._refuse(current, MSG_TOO_MANY_WATCHERS)
            return None
        w = Watcher(hub, self, watch_id, key, range_end, req)
        self._watchers[watch_id] = w
        hub._watchers[w] = None
        if w.progress_notify:
            hub._progress[w] = None
        self._push(w, WatchResponse(_header(current), watch_id, created=True), _K_CREATED, 0)
        start = req.start_revision
        if start == 0 or start > current:
            w._next_rev = max(start, current + 1)
            hub._set_synced(w)
        else:
            w._next_rev = start
            hub._set_unsynced(w, start)
        hub.stats["created"] += 1
        return w

    def cancel(self, watch_id: int) -> bool:
        """etcd's cancel request: False (and nothing queued) for an unknown id."""
        w = self._watchers.get(watch_id)
        if w is None:
            return False
        w._finish("", drop=True)
        return True

    def request_progress(self) -> bool:
        """etcd's progress request: if every watcher of the stream is synced, queue a
        progress response (watch id -1, the hub's revision) after everything they have
        queued; otherwise nothing (False)."""
        if self._closed or self._progress_pending >= _MAX_PENDING_STREAM_PROGRESS:
            return False
        if any(w._state is not _State.SYNCED for w in self._watchers.values()):
            return False
        self._progress_pending += 1
        resp = WatchResponse(_header(self._hub._rev), INVALID_WATCH_ID)
        self._push(None, resp, _K_PROGRESS_ALL, 0)
        return True

    def close(self) -> None:
        """The consumer is gone: remove every watcher silently, drop what is queued, end the
        iteration."""
        for w in list(self._watchers.values()):
            self._hub._remove(w)
            w._state = _State.DONE
            w._dropped = True
        self._watchers.clear()
        self._unsynced.clear()
        for _, item, kind, _ in self._fifo:
            if kind == _K_BIG:
                assert isinstance(item, _BigDelivery)
                item.big.delivered()  # its events go to the graveyard, not all at once
        self._fifo.clear()
        self._closed = True
        self._wake()

    def close_input(self) -> None:
        """No more requests will come (the client's request stream ended): the iteration
        ends once no watcher is live and everything queued has been taken."""
        self._input_closed = True
        self._wake()

    # --- consuming ----------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """Closed (or input closed and no live watcher) and everything queued taken."""
        return (self._closed or (self._input_closed and not self._watchers)) and not self._fifo

    def poll(self) -> WatchResponse | None:
        """The next response, or None if none is ready now (reads history for unsynced
        watchers as needed)."""
        if self._hub._graveyard:
            self._hub._reap()
        self._fill()
        fifo = self._fifo
        while fifo:
            if fifo[0][2] == _K_BIG:
                w, big, _, _ = fifo[0]
                assert isinstance(big, _BigDelivery) and w is not None
                if w._dropped:
                    resp_or_none: WatchResponse | None = None
                    done = True
                else:
                    resp_or_none, done = big.step()
                if done:
                    fifo.popleft()
                    w._buf_items -= 1
                    big.big.delivered()
                if resp_or_none is not None:
                    w._quiet = False
                    return resp_or_none
                if not done:
                    return None  # one step per poll: the consumer yields to the loop
                continue
            w, resp, kind, nbytes = fifo.popleft()
            assert isinstance(resp, WatchResponse)
            if w is None:
                if kind == _K_PROGRESS_ALL:
                    self._progress_pending -= 1
                return resp
            w._buf_items -= 1
            if kind == _K_EVENTS:
                w._buf_events -= len(resp.events)
                w._buf_bytes -= nbytes
            elif kind == _K_PROGRESS:
                w._progress_pending = False
            if w._dropped and kind != _K_FINAL:
                continue
            if kind == _K_EVENTS:
                w._quiet = False
            return resp
        return None

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> WatchResponse:
        while True:
            wakeup = self._wakeup
            if wakeup is None:
                wakeup = self._wakeup = asyncio.Event()
            wakeup.clear()
            resp = self.poll()
            if resp is not None:
                return resp
            if self.finished:
                raise StopAsyncIteration
            if self._fill_pending():
                await asyncio.sleep(0)  # a long replay: let the loop breathe between chunks
                continue
            await wakeup.wait()

    def release(self, resp: WatchResponse) -> None:
        """The consumer is done with ``resp`` and drops it next: if it holds many events,
        the hub keeps them and drops them a slice per poll, so that dropping the response
        frees no event (a million events freed at once hold the loop for tens of ms)."""
        if len(resp.events) > BIG_STEP_EVENTS:
            self._hub._bury(list(resp.events))

    def refuse_create(self, reason: str) -> None:
        """Refuse a create request before it reaches the hub (e.g. permission denied): a
        ``created`` + ``canceled`` response with watch id -1 and ``reason``, at the current
        revision, as etcd answers a watch it will not open."""
        self._refuse(self._hub._source.revision, reason)

    # --- internals ------------------------------------------------------------------------------

    def _refuse(self, current: int, reason: str) -> None:
        resp = WatchResponse(
            _header(current), INVALID_WATCH_ID, created=True, canceled=True, cancel_reason=reason
        )
        self._push(None, resp, _K_CONTROL, 0)
        self._hub.stats["refused"] += 1

    def _push(
        self, w: Watcher | None, resp: WatchResponse | _BigDelivery, kind: int, nbytes: int
    ) -> None:
        self._fifo.append((w, resp, kind, nbytes))
        if w is not None:
            w._buf_items += 1
            if kind == _K_EVENTS:
                assert isinstance(resp, WatchResponse)
                w._buf_events += len(resp.events)
                w._buf_bytes += nbytes
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    def _fill_pending(self) -> bool:
        """Work that ``poll`` does a step at a time is left: history to read, or a big
        revision at the head of the queue."""
        if (self._fifo and self._fifo[0][2] == _K_BIG) or self._hub._graveyard:
            return True
        return any(w._buf_events == 0 for w in self._unsynced)

    def _fill(self) -> None:
        if not self._unsynced:
            return
        budget = _FILLS_PER_POLL
        for w in list(self._unsynced):
            if budget == 0:
                return
            if w._buf_events == 0 and w._state is _State.UNSYNCED:
                w._fill()
                budget -= 1


class WatchHub:
    """All watchers of one member (see the module docstring)."""

    def __init__(self, source: WatchSource, limits: WatchLimits | None = None) -> None:
        self.limits = limits or WatchLimits()
        self._source = source
        self._rev = source.revision  # the last revision notified
        self._single: dict[bytes, dict[Watcher, None]] = {}  # synced single-key watchers
        self._ranges: dict[Watcher, None] = {}  # synced range watchers
        self._n_synced = 0
        self._watchers: dict[Watcher, None] = {}  # every live watcher
        self._progress: dict[Watcher, None] = {}  # live watchers with progress_notify
        # lists of events no longer needed, dropped a slice per poll (dropping a million
        # events at once frees a million objects in one step)
        self._graveyard: deque[list[Event]] = deque()
        self._reaping = False  # a loop callback reaps the graveyard
        self._closed = False
        self.stats = {
            "created": 0,
            "refused": 0,
            "canceled_slow": 0,
            "resynced_slow": 0,
            "compacted": 0,
            "gaps": 0,
            "replayed_events": 0,
            "progress_sent": 0,
            "big_revisions": 0,
        }

    # --- introspection ------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The last revision notified."""
        return self._rev

    @property
    def watcher_count(self) -> int:
        return len(self._watchers)

    @property
    def synced_count(self) -> int:
        return self._n_synced

    # --- the driver's side ----------------------------------------------------------------------

    def notify(self, revision: int, events: Sequence[Event]) -> None:
        """The store applied ``revision`` with ``events`` (see the module docstring)."""
        prev = self._rev
        if revision <= prev:
            return  # already notified (or replayed): nothing new
        self._rev = revision
        if not self._n_synced:
            return
        if revision != prev + 1:
            # A notify was missed: every synced watcher replays from where it was.
            self.stats["gaps"] += 1
            self._resync_all(prev + 1)
            return
        if len(events) > BIG_REVISION_EVENTS:
            self._notify_big(revision, events)
            return
        hits: dict[Watcher, list[Event]] = {}
        single = self._single
        if single:
            for ev in events:
                ws = single.get(ev.kv.key)
                if ws:
                    for w in ws:
                        got = hits.get(w)
                        if got is None:
                            hits[w] = [ev]
                        else:
                            got.append(ev)
        if self._ranges:
            # many watchers of one range (a prefix 5,000 clients watch) share one selection
            selected: dict[tuple[bytes, bytes, bool], list[Event]] = {}
            for w in self._ranges:
                start = w.key
                end = w.range_end
                open_ended = w._open_ended
                matched = selected.get((start, end, open_ended))
                if matched is None:
                    matched = selected[(start, end, open_ended)] = [
                        ev
                        for ev in events
                        if ev.kv.key >= start and (open_ended or ev.kv.key < end)
                    ]
                if matched:
                    hits[w] = matched
        if not hits:
            return
        strip_cache: dict[int, Event] = {}
        for w, evs in hits.items():
            if revision >= w._next_rev and w._state is _State.SYNCED:
                w._offer_live(revision, evs, strip_cache)

    def _notify_big(self, revision: int, events: Sequence[Event]) -> None:
        """A big revision: O(1) per synced watcher now; each one's events are selected by
        its stream's consumer, a step at a time (``_BigDelivery``)."""
        synced = [w for ws in self._single.values() for w in ws]
        synced.extend(self._ranges)
        offered = [w for w in synced if revision >= w._next_rev]
        if not offered:
            return
        strip = sum(1 for w in offered if not w.prev_kv)
        big = _BigRevision(self, revision, events, share_stripped=strip > 1)
        big.deliveries = len(offered)
        for w in offered:
            w._next_rev = revision + 1  # queued (a replay must not read it again)
            w._stream._push(w, _BigDelivery(big, w), _K_BIG, 0)
        self.stats["big_revisions"] += 1

    def _bury(self, events: list[Event]) -> None:
        """Drop ``events`` (the hub's own list) a slice at a time, not all at once: a slice
        per loop turn (a callback of its own), and a slice per poll."""
        if not events:
            return
        self._graveyard.append(events)
        if not self._reaping:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (a synchronous user): polls reap
            self._reaping = True
            loop.call_soon(self._reap_turn, loop)

    def _reap_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        self._reap()
        if self._graveyard:
            loop.call_soon(self._reap_turn, loop)
        else:
            self._reaping = False

    def _reap(self) -> None:
        """Drop up to ``_REAP_STEP`` references of the graveyard."""
        graveyard = self._graveyard
        budget = _REAP_STEP
        while graveyard and budget > 0:
            events = graveyard[0]
            n = min(budget, len(events))
            del events[len(events) - n :]
            budget -= n
            if not events:
                graveyard.popleft()

    def reset(self, source: WatchSource) -> None:
        """The store was replaced (snapshot restore): every watcher continues from its next
        revision by reading the new store's history.

        A watcher stopped inside a revision (``_partial``) reads that revision again from
        its first record: its position counted the old store's records, and a restored store
        may hold fewer of them (a snapshot leaves out the deletions at exactly the compact
        revision), so continuing at that position would skip the events after them. The
        held events were never sent, so nothing is delivered twice."""
        old = self._rev
        self._source = source
        for w in self._watchers:
            w._drop_partial()
        self._resync_all(old + 1)
        self._rev = source.revision

    def progress_tick(self) -> int:
        """Queue a progress response for each synced ``progress_notify`` watcher that took no
        events since the previous tick; return how many were queued."""
        n = 0
        for w in self._progress:
            if w._state is _State.SYNCED and w._quiet and not w._progress_pending:
                w._progress_pending = True
                w._stream._push(w, WatchResponse(_header(self._rev), w.watch_id), _K_PROGRESS, 0)
                n += 1
            w._quiet = True
        self.stats["progress_sent"] += n
        return n

    def close(self) -> None:
        """Shutdown: cancel every watcher (reason ``MSG_WATCH_STOPPED``) and end every
        stream after what is queued."""
        self._closed = True
        streams = {w._stream for w in self._watchers}
        for w in list(self._watchers):
            w._finish(MSG_WATCH_STOPPED)
        for stream in streams:
            stream._closed = True
            stream._wake()

    # --- consumers ------------------------------------------------------------------------------

    def open_stream(self, max_watchers: int | None = None) -> WatchStream:
        """A new stream; ``max_watchers`` overrides the per-stream limit (a front end's
        stream of feeds holds one watcher for each of its clients' distinct watches)."""
        return WatchStream(self, max_watchers=max_watchers)

    def create(
        self,
        key: bytes = b"",
        range_end: bytes = b"",
        start_revision: int = 0,
        *,
        prev_kv: bool = False,
        filters: Sequence[WatchFilter] = (),
        progress_notify: bool = False,
        fragment: bool = False,
    ) -> Watcher:
        """A watcher with its own stream: ``async for resp in watcher`` (the first response
        is ``created``). Raises ``WatchCreateError`` if refused."""
        stream = WatchStream(self, private=True)
        req = WatchCreateRequest(
            key, range_end, start_revision, progress_notify, tuple(filters), prev_kv, 0, fragment
        )
        w = stream.create(req)
        if w is None:
            refusal = stream.poll()
            raise WatchCreateError(refusal.cancel_reason if refusal else "refused")
        return w

    # --- internals ------------------------------------------------------------------------------

    def _set_synced(self, w: Watcher) -> None:
        if w._state is _State.SYNCED:
            return
        w._stream._unsynced.pop(w, None)
        w._state = _State.SYNCED
        if w._single:
            self._single.setdefault(w.key, {})[w] = None
        else:
            self._ranges[w] = None
        self._n_synced += 1

    def _set_unsynced(self, w: Watcher, next_rev: int) -> None:
        if w._state is _State.SYNCED:
            self._unlink_synced(w)
        w._state = _State.UNSYNCED
        w._next_rev = max(w._next_rev, next_rev)
        w._stream._unsynced[w] = None
        w._stream._wake()

    def _unlink_synced(self, w: Watcher) -> None:
        if w._single:
            ws = self._single.get(w.key)
            if ws is not None:
                ws.pop(w, None)
                if not ws:
                    del self._single[w.key]
        else:
            self._ranges.pop(w, None)
        self._n_synced -= 1

    def _remove(self, w: Watcher) -> None:
        if w._state is _State.SYNCED:
            self._unlink_synced(w)
        w._stream._unsynced.pop(w, None)
        self._watchers.pop(w, None)
        self._progress.pop(w, None)

    def _resync_all(self, next_rev: int) -> None:
        synced = [w for ws in self._single.values() for w in ws] + list(self._ranges)
        for w in synced:
            self._set_unsynced(w, next_rev)

    def _overflow(self, w: Watcher, revision: int) -> None:
        if self.limits.on_overflow is OverflowPolicy.RESYNC:
            self.stats["resynced_slow"] += 1
            self._set_unsynced(w, revision)  # this revision is read again from history
        else:
            self.stats["canceled_slow"] += 1
            w._finish(MSG_WATCHER_TOO_SLOW)
