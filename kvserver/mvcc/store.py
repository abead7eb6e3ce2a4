"""The MVCC key-value store: raftkv's replicated state machine (etcd's mvcc semantics).

Contract
--------
A pure, deterministic, single-threaded object. The node driver feeds it committed log entries
in order through ``apply(request, client_id, request_id)`` (or ``apply_entry(bytes)``); every
replica that applies the same entries reaches the same state and returns the same results.
No I/O, clocks, randomness or asyncio here.

Revisions (etcd): the store starts at revision 1; each write transaction that changes
something gets the next main revision (the first write is revision 2). All changes of one
transaction share that revision (etcd also numbers them with a sub-revision: their order
inside ``events``). A write that changes nothing (deleting a missing key, a txn whose taken
branch only reads) does not advance the revision. Per key: ``create_revision`` (revision of
the put that created the current generation), ``mod_revision`` (last change), ``version``
(1 on creation, +1 per put, reset by a delete), ``lease``.

History and compaction: every change is kept until ``compact(C)``, which forgets, per key,
all versions older than the newest one at or below ``C`` and that one too if it is a deletion
(etcd's keyIndex.compact). Reads at any revision in ``[C, current]`` stay exact; reads below
``C`` raise ``CompactedError``, above the current revision ``FutureRevisionError``.
``compact(C)`` with ``C <= compact_revision`` raises ``CompactedError`` (etcd starts with a
compact revision of -1, so ``compact(0)`` once succeeds on a new store, as in etcd).

Compaction has a logical and a physical part. Applying it (the logical part, O(log N), the
same on every replica) sets the compact revision, moves the log start and notes the log
records below ``C`` as pending work; from then on every read behaves as after the whole
compaction. The physical part, ``compact_step(max_keys)``, cuts the histories of the keys
those records name, a batch at a time. ``MVCCStore()`` runs it to the end inside the apply;
``MVCCStore(compact_in_background=True)`` leaves it to the caller (RaftKV runs it in batches on
its event loop, as etcd's scheduled compaction does), so a compaction of a million keys
answers at once. Nothing a client can observe depends on its progress: reads pick versions
by revision, watch replay reads the log from its start, ``serialize`` writes the same bytes.
Only ``history_size``, ``db_size_bytes`` and memory lag until the work is done. A second
compaction while work is pending adds its records to it; every cut uses the current compact
revision.

Without history (``MVCCStore(keep_history=False)``) a write replaces the key's record instead
of adding a version, and the change log is not kept: memory ~ the keys ever written. Every
write still takes the same path: the same checks and errors, compares, revisions, per-key
fields, leases, request-id deduplication and events, so a replay of a member's log that only
needs the current records and the events (the changefeed's cold tier) reaches what the
member reached and changes what it changed. Reads at the current revision are exact; a read
at an older revision sees the current records; ``serialize`` and watch replay have no history
to give and raise ``ValueError``.

Errors raised by an operation leave the store unchanged. ``apply`` turns them into
``ApplyResult.error``; the direct methods (``put``, ``range``, ...) raise them.

Data layout (memory ~ live data + uncompacted history)
------------------------------------------------------
- ``_index``: ``KeyIndex`` (keyindex.py: a SortedDict whose hash part never rehashes every
  key at once) key -> history list of ``KeyValue`` records in revision order,
  tombstones included (``create_revision == 0``). invariant: a key has at most one record per
  main revision (validation rejects txns that write a key twice), and a key whose history is
  empty is not in the index. The current state of a key is ``history[-1]``.
- ``_log``: every record with ``mod_revision >= compact_revision`` in the order applied (a
  revision-ordered change log, shared objects with ``_index``), from ``_log_start`` on. It
  serves watch replay (``events_since``) and snapshots; compaction advances ``_log_start``.
  Tombstones at exactly the compact revision stay in ``_log`` but are not part of the state
  (etcd drops them at compaction); readers skip them.
- ``_live_keys``: the keys whose current record is not a tombstone, in order.
- Both ordered structures are properties over ``_histories`` / ``_live_sorted``: during
  ``defer_key_order`` (a restart's replay) keys new to the store wait in ``_new_histories`` /
  ``_new_live`` and are merged in by the first reader of ``_index`` / ``_live_keys``. A put
  (``_put_record``) looks its key up in both and needs no merge.
- ``_leases``: lease id -> set of live keys attached to it.
- ``_records`` / ``_size_bytes``: running totals over every record in ``_index`` (tombstones
  included) — the count and ``sum(record_size_bytes(kv))`` — kept up to date by put, delete,
  ``compact_step`` and restore, so ``db_size_bytes`` is O(1) (etcd's dbSize, which ``status``
  reports on every call, must not walk the keyspace). They count the versions still waiting
  for ``compact_step`` too, so the space quota sees the space freed as it is freed.
- ``_pending``: the physical compaction still to do, as slices of (a possibly replaced)
  ``_log``; while it is non-empty a history may hold versions below the compact revision that
  compaction will cut, and a key whose history is all dead may still be in ``_index``.

Immutability rules that let ``serialize`` stream a consistent point-in-time view while writes
continue: history lists and ``_log`` are only ever appended to; compaction replaces a key's
history list by a new list and rebuilds ``_log`` as a new list instead of editing in place.
"""

from __future__ import annotations

import gc
import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator, Iterable, Iterator
from itertools import compress, filterfalse, islice
from operator import attrgetter, is_not, itemgetter, not_
from typing import Any

from sortedcontainers import SortedList

from kvserver.kvpb.errors import (
    CodecError,
    CompactedError,
    EtcdError,
    FutureRevisionError,
    InvalidArgumentError,
    KeyNotFoundError,
    LeaseNotFoundError,
    SnapshotFormatError,
)
from kvserver.kvpb.kv import (
    ApplyResult,
    CompactionRequest,
    CompactionResponse,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    DeleteRangeResponse,
    Event,
    EventType,
    KeyValue,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    RequestOp,
    ResponseHeader,
    ResponseOp,
    SortOrder,
    SortTarget,
    TxnRequest,
    TxnResponse,
)
from kvserver.kvpb.quick import quick_constructor
from kvserver.mvcc.codec import decode_entry
from kvserver.mvcc.dedup import DEFAULT_IDS_PER_CLIENT, DEFAULT_MAX_CLIENTS, MISS, DedupTable
from kvserver.mvcc.keyindex import KeyIndex
from kvserver.mvcc.snapshot import (
    SnapshotLoader,
    SnapshotParts,
    SnapshotView,
    StreamLayout,
    serialize,
    serialize_after,
)
from kvserver.mvcc.validate import (
    DEFAULT_MAX_TXN_OPS,
    check_compaction,
    check_delete,
    check_put,
    check_range,
    check_txn,
)

_MOD = attrgetter("mod_revision")
_PUT = EventType.PUT
_DELETE = EventType.DELETE
# The per-key records of a write, built by quick constructors (``kvserver.kvpb.quick``).
_new_kv = quick_constructor(KeyValue)
_new_event = quick_constructor(Event)
_new_result = quick_constructor(ApplyResult)
_new_put_response = quick_constructor(PutResponse)
_new_header = quick_constructor(ResponseHeader)
_EMPTY_KV = KeyValue(b"")  # what a compare sees for a missing key (etcd: zero KeyValue)
_LOG_REBUILD_MIN = 4096  # rebuild _log once this many dead slots lead it and they are > half
_DEAD_LOG_STEP = 16_384  # references of a replaced log dropped per compact_step
_IMMEDIATE_STEP_KEYS = 1 << 30  # compact_step budget of a compaction applied in one go
# Keys made live while key order was deferred are merged by one sort once they are more than
# 1/_MERGE_AT_FRACTION of the live keys (fewer: inserted one by one, 2-3 us each at a million
# keys, so a merge never holds the loop much longer than a sort of the keys, ~0.1 s there).
_MERGE_AT_FRACTION = 64
# Bytes charged per stored record besides its key and value: roughly what etcd's bolt backend
# spends per revision (a 17-byte revision key, the KeyValue protobuf's tags and varints, page
# overhead). An estimate: the figure only has to grow and shrink with the data.
RECORD_OVERHEAD_BYTES = 64


def record_size_bytes(kv: KeyValue) -> int:
    """The bytes one stored record counts for in ``MVCCStore.db_size_bytes``."""
    return len(kv.key) + len(kv.value) + RECORD_OVERHEAD_BYTES


_KEY = attrgetter("key")
_VALUE = attrgetter("value")
_CREATE = attrgetter("create_revision")
_LEASE = attrgetter("lease")
_LAST = itemgetter(-1)
_FIRST = itemgetter(0)
_SORT_KEYS: dict[int, Callable[[KeyValue], Any]] = {
    SortTarget.KEY: attrgetter("key"),
    SortTarget.VERSION: attrgetter("version"),
    SortTarget.CREATE: attrgetter("create_revision"),
    SortTarget.MOD: attrgetter("mod_revision"),
    SortTarget.VALUE: attrgetter("value"),
}

LeaseExists = Callable[[int], bool]
# A txn's taken path: (compares held, plans of the nested txns in the taken list, in order).
_Plan = tuple[bool, list["_Plan"]]


def _visible(hist: list[KeyValue], rev: int) -> KeyValue | None:
    """The key's live version at revision ``rev``, or None (absent or deleted)."""
    kv = hist[-1]
    if kv.mod_revision > rev:
        i = bisect_right(hist, rev, key=_MOD)
        if i == 0:
            return None
        kv = hist[i - 1]
    return None if kv.create_revision == 0 else kv


def _header(revision: int) -> ResponseHeader:
    return ResponseHeader(0, 0, revision, 0)


READ_STEP_KEYS = 2048  # keys a stepped read visits between two yields
BOUNDED_PAGE_KEYS = 10_000  # a page at the current revision up to this is read in one go
WRITE_STEP_KEYS = 2048  # keys a large delete tombstones between two yields


def _filtered(r: RangeRequest) -> bool:
    return bool(
        r.min_mod_revision or r.max_mod_revision or r.min_create_revision or r.max_create_revision
    )


def _prune(r: RangeRequest, kvs: list[KeyValue]) -> list[KeyValue]:
    """etcd's pruneKVs: drop the versions outside the request's revision bounds."""
    if r.max_mod_revision:
        kvs = [kv for kv in kvs if kv.mod_revision <= r.max_mod_revision]
    if r.min_mod_revision:
        kvs = [kv for kv in kvs if kv.mod_revision >= r.min_mod_revision]
    if r.max_create_revision:
        kvs = [kv for kv in kvs if kv.create_revision <= r.max_create_revision]
    if r.min_create_revision:
        kvs = [kv for kv in kvs if kv.create_revision >= r.min_create_revision]
    return kvs


def _sorting(r: RangeRequest) -> tuple[SortOrder, Callable[[KeyValue], Any]]:
    sort_order = r.sort_order
    if r.sort_target != SortTarget.KEY and sort_order == SortOrder.NONE:
        # etcd: results come key-ascending; any other target defaults to ASCEND
        sort_order = SortOrder.ASCEND
    return sort_order, _SORT_KEYS[r.sort_target]


def _key_only(kv: KeyValue) -> KeyValue:
    return KeyValue(kv.key, b"", kv.create_revision, kv.mod_revision, kv.version, kv.lease)


def _key_batches(index: KeyIndex, key: bytes, range_end: bytes, step: int) -> Iterator[list[bytes]]:
    """The index's keys in [key, range_end) (one key if range_end is empty), in lists of at
    most ``step``; a fresh ``irange`` per list, so keys added in between are
    harmless."""
    if not range_end:
        if key in index:
            yield [key]
        return
    if range_end != b"\0" and range_end <= key:
        return
    upper = None if range_end == b"\0" else range_end
    batch = list(islice(index.irange(key, upper, (True, False)), step))
    while batch:
        yield batch
        batch = list(islice(index.irange(batch[-1], upper, (False, False)), step))


def _sorted_in_steps(
    kvs: list[Any], key: Callable[[Any], Any] | None, reverse: bool, run: int
) -> Generator[None, None, list[Any]]:
    """``sorted(kvs, key=key, reverse=reverse)``, stable, without one long sort: runs of
    ``run`` are sorted a step each, then merged ``run`` at a time."""
    if len(kvs) <= run:
        return sorted(kvs, key=key, reverse=reverse)
    runs = []
    for i in range(0, len(kvs), run):
        runs.append(sorted(kvs[i : i + run], key=key, reverse=reverse))
        yield None
    out: list[Any] = []
    merged = heapq.merge(*runs, key=key, reverse=reverse)
    while True:
        step = list(islice(merged, run))
        if not step:
            return out
        out.extend(step)
        yield None


class MVCCStore:
    """etcd-compatible multi-version key-value state machine (see the module docstring)."""

    __slots__ = (
        "_histories",
        "_rev",
        "_compact_rev",
        "_log",
        "_log_start",
        "_leases",
        "_live_sorted",
        "_new_histories",
        "_new_live",
        "_defer_order",
        "_records",
        "_size_bytes",
        "_pending",
        "_pending_records",
        "_dead_logs",
        "_compact_in_background",
        "_open_streams",
        "_wevents",
        "_dedup",
        "_keep_history",
        "lease_exists",
        "max_txn_ops",
    )

    def __init__(
        self,
        *,
        lease_exists: LeaseExists | None = None,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
        dedup_ids_per_client: int = DEFAULT_IDS_PER_CLIENT,
        dedup_max_clients: int = DEFAULT_MAX_CLIENTS,
        compact_in_background: bool = False,
        keep_history: bool = True,
    ) -> None:
        self._histories = KeyIndex()  # read through _index (see there)
        self._rev = 1  # etcd: a new store is at revision 1
        self._compact_rev = -1  # etcd: compactMainRev of a never-compacted store
        self._log: list[KeyValue] = []
        self._log_start = 0  # invariant: _log[_log_start:] are the records >= compact rev
        self._leases: dict[int, set[bytes]] = {}
        # The keys whose current record is not a tombstone, in order: an order-statistics
        # index, so a range at the current revision counts in O(log N) and pages in
        # O(log N + limit) (etcd's count with a limit).
        self._live_sorted: SortedList = SortedList()  # read through _live_keys
        # While key order is deferred (defer_key_order): the histories of keys new to the
        # store, and the keys that became live, not yet in the two ordered structures.
        self._new_histories: dict[bytes, list[KeyValue]] = {}
        self._new_live: list[bytes] = []
        self._defer_order = False
        self._records = 0  # invariant: == sum(len(h) for h in _index.values())
        self._size_bytes = 0  # invariant: == sum of record_size_bytes over those records
        # Physical compaction still to do: (log list, lo, hi) slices of log records below the
        # compact revision whose keys compact_step has yet to visit, oldest first.
        self._pending: list[tuple[list[KeyValue], int, int]] = []
        self._pending_records = 0  # invariant: == sum(hi - lo) over _pending
        # Replaced log lists that compact_step is done with. They may be the last holders of
        # a million cut versions, so they are emptied _DEAD_LOG_STEP references per step:
        # dropped at once, the versions would all be freed in one event-loop turn.
        self._dead_logs: list[list[KeyValue]] = []
        # False: a compaction cuts the old versions before apply returns. True: the caller
        # runs compact_step until it returns False (RaftKV does, on its event loop).
        self._compact_in_background = compact_in_background
        # Snapshot streams being read (serialize): physical compaction waits until none is,
        # because it is the one change that would alter what a stream reads.
        self._open_streams = 0
        self._wevents: list[Event] | None = None  # events of the open write txn
        self._dedup = DedupTable(dedup_ids_per_client, dedup_max_clients)
        # False: a write replaces the key's record, and _log stays empty (module docstring).
        self._keep_history = keep_history
        # Hook of the lease manager: does this lease exist? None accepts every lease id.
        self.lease_exists = lease_exists
        self.max_txn_ops = max_txn_ops

    # -----------------------------------------------------------------------------------------
    # Key order, and deferring it during a bulk apply

    @property
    def _index(self) -> KeyIndex:
        """The history index, in key order (see the module docstring): keys put while key
        order was deferred are merged in first, so every reader sees a whole, ordered index."""
        if self._new_histories:
            self._merge_new_histories()
        return self._histories

    @_index.setter
    def _index(self, index: KeyIndex) -> None:
        self._histories = index
        self._new_histories = {}

    @property
    def _live_keys(self) -> SortedList:
        """The live keys in order; keys made live while key order was deferred merged in."""
        if self._new_live:
            self._merge_new_live()
        return self._live_sorted

    @_live_keys.setter
    def _live_keys(self, live: SortedList) -> None:
        self._live_sorted = live
        self._new_live = []

    def defer_key_order(self) -> None:
        """Keep keys new to the store out of the two ordered structures until something reads
        them in order, or until ``settle_key_order``.

        For a bulk apply nobody reads while it runs, a member replaying its log after a
        restart: an ordered insert costs a bisection of the whole index per new key, twice
        (the history index and the live keys), an eighth of replaying a load of new keys
        (measured); one merge at the end costs about 0.1 s at a million keys. A put looks
        its key up by hash and finds the new keys at once; everything else reads through
        ``_index`` / ``_live_keys``, which merge them first (a range, a compare, a delete,
        a compaction, a snapshot), so what every read returns is unchanged."""
        self._defer_order = True

    def settle_key_order(self) -> None:
        """End ``defer_key_order``: merge what it kept out (one sort of the keys, O(N) at
        most) and insert new keys in order again from now on."""
        self._defer_order = False
        if self._new_histories:
            self._merge_new_histories()
        if self._new_live:
            self._merge_new_live()

    def _merge_new_histories(self) -> None:
        new = self._new_histories
        self._new_histories = {}
        # KeyIndex.update inserts a few keys one by one, and folds many (a tenth of the
        # index or more) into its base with one re-sort of its keys.
        self._histories.update(new)

    def _merge_new_live(self) -> None:
        new = self._new_live
        self._new_live = []
        live = self._live_sorted
        if len(new) * _MERGE_AT_FRACTION < len(live):
            live.update(new)  # few: one ordered insert each
            return
        merged = list(live)
        merged += new
        live.clear()
        live.update(merged)  # sorts them: timsort merges the sorted run with the new keys

    # -----------------------------------------------------------------------------------------
    # Introspection

    @property
    def revision(self) -> int:
        """The current (main) revision: 1 for an empty store, +1 per changing write."""
        return self._rev

    @property
    def compact_revision(self) -> int:
        """The last compaction's revision, -1 before the first one (etcd's compactMainRev)."""
        return self._compact_rev

    @property
    def key_count(self) -> int:
        """Number of live keys at the current revision."""
        return len(self._live_sorted) + len(self._new_live)

    @property
    def history_size(self) -> int:
        """Number of stored versions (records) across all keys, tombstones included; O(1)."""
        return self._records

    @property
    def db_size_bytes(self) -> int:
        """Approximate bytes of everything stored (every record's key and value plus
        ``RECORD_OVERHEAD_BYTES``), tombstones and uncompacted history included; O(1)."""
        return self._size_bytes

    @property
    def dedup(self) -> DedupTable:
        return self._dedup

    # -----------------------------------------------------------------------------------------
    # The state-machine entry point

    def apply(self, request: Any, client_id: int = 0, request_id: int = 0) -> ApplyResult:
        """Apply one committed request; never raises for a bad request (see ApplyResult).

        With ``client_id != 0`` a write is deduplicated on ``(client_id, request_id)``: a pair
        seen before returns the first outcome with ``duplicate=True`` and changes nothing.
        """
        events: tuple[Event, ...] | None
        if client_id == 0 or type(request) is RangeRequest:
            try:
                response, events = self._execute(request)
            except EtcdError as err:
                return _new_result(None, err, (), False, self._rev)
            return _new_result(response, None, events, False, self._rev)
        seen = self._seen(client_id, request_id)
        if seen is not None:
            return seen
        try:
            response, events = self._execute(request)
        except EtcdError as err:
            response, events = err, None
        return self._remember(client_id, request_id, response, events)

    def _seen(self, client_id: int, request_id: int) -> ApplyResult | None:
        """The first outcome of a write already applied under this pair, or None."""
        seen = self._dedup.client_ids(client_id).get(request_id, MISS)
        if seen is MISS:
            return None
        if isinstance(seen, EtcdError):
            return _new_result(None, seen, (), True, self._rev)
        return _new_result(seen, None, (), True, self._rev)

    def _remember(
        self, client_id: int, request_id: int, response: Any, events: tuple[Event, ...] | None
    ) -> ApplyResult:
        """Record a write's outcome under its pair (``events`` None: ``response`` is the
        error it failed with) and return its result."""
        ids = self._dedup.client_ids(client_id)
        ids[request_id] = response
        if len(ids) > self._dedup.ids_per_client:
            ids.popitem(last=False)
        if events is None:
            return _new_result(None, response, (), False, self._rev)
        return _new_result(response, None, events, False, self._rev)

    # -----------------------------------------------------------------------------------------
    # Large writes in steps (a caller on an event loop runs other work between them)

    def write_is_large(self, request: Any) -> bool:
        """Whether ``request`` is a delete of more than ``WRITE_STEP_KEYS`` live keys (known
        in O(log N)): apply it with ``apply_in_steps``."""
        if type(request) is not DeleteRangeRequest or not request.range_end:
            return False
        lo, hi = self._live_span(request.key, request.range_end)
        return hi - lo > WRITE_STEP_KEYS

    def _live_span(self, key: bytes, range_end: bytes) -> tuple[int, int]:
        """Positions [lo, hi) in ``_live_keys`` of the live keys in [key, range_end)
        (``range_end`` not empty; ``b"\\0"``: to the end), two bisects."""
        live = self._live_keys
        lo = live.bisect_left(key)
        return lo, len(live) if range_end == b"\0" else live.bisect_left(range_end)

    def key_ranks(
        self, key: bytes, range_end: bytes, ranks: Iterable[int]
    ) -> tuple[int, list[bytes | None]]:
        """The live keys at the current revision at 0-based positions ``ranks`` of the range
        (in key order; etcd's ``range_end`` convention: empty = just ``key``, ``b"\\0"`` = every
        key >= ``key``), and the number of live keys in the range: ``(count, keys)``, None for
        a rank >= count. O(log N) per rank, from the order-statistics index of live keys.
        While a write in steps is open, the keys it has written so far count."""
        if not range_end:
            count = 1 if key in self._live_keys else 0
            return count, [key if r < count else None for r in ranks]
        if range_end != b"\0" and range_end <= key:
            return 0, [None for _ in ranks]
        lo, hi = self._live_span(key, range_end)
        live = self._live_keys
        out: list[bytes | None] = []
        for r in ranks:
            if r < 0:
                raise ValueError(f"rank {r} is negative")
            out.append(live[lo + r] if lo + r < hi else None)
        return hi - lo, out

    def apply_in_steps(
        self, request: DeleteRangeRequest, client_id: int = 0, request_id: int = 0
    ) -> Generator[None, None, ApplyResult]:
        """``apply(request, client_id, request_id)`` for a large delete, ``WRITE_STEP_KEYS``
        keys per step: yields None between steps and returns the ``ApplyResult``.

        The delete is still one revision, applied atomically as far as any reader can tell:
        until the last step the store's revision stays where it was, a read at it picks
        versions by revision (``range_is_bounded`` is false while the write is open, so
        readers use ``range_in_steps``, which does), the watch log and snapshot streams stop
        at it, and the events go out together at the end. The caller must apply nothing else
        before the generator is done (the node's apply task is sequential)."""
        if client_id:
            seen = self._seen(client_id, request_id)
            if seen is not None:
                return seen
        try:
            check_delete(request)
        except EtcdError as err:
            if client_id:
                return self._remember(client_id, request_id, err, None)
            return _new_result(None, err, (), False, self._rev)
        lo, hi = self._live_span(request.key, request.range_end)
        keys = list(self._live_keys.islice(lo, hi))
        prev_kvs, events = yield from self._delete_in_steps(keys, request.prev_kv)
        response = DeleteRangeResponse(_header(self._rev), len(keys), prev_kvs)
        if client_id:
            return self._remember(client_id, request_id, response, events)
        return _new_result(response, None, events, False, self._rev)

    def _delete_in_steps(
        self, keys: list[bytes], want_prev: bool
    ) -> Generator[None, None, tuple[tuple[KeyValue, ...], tuple[Event, ...]]]:
        """Tombstone ``keys`` (live, sorted) in one write, ``WRITE_STEP_KEYS`` per step;
        ``(prev_kvs or (), events)``."""
        index = self._index
        prev_kvs: list[KeyValue] = []
        self._wevents = []
        try:
            for i in range(0, len(keys), WRITE_STEP_KEYS):
                batch = keys[i : i + WRITE_STEP_KEYS]
                if want_prev:
                    prev_kvs.extend(index[k][-1] for k in batch)
                self._delete_keys(batch)
                yield None
        finally:
            events = self._end_write()
        return tuple(prev_kvs), events

    def apply_entry(self, data: bytes) -> ApplyResult:
        """Decode a log entry made by ``codec.encode_entry`` and apply it.

        An undecodable entry (a bug or a format-version mismatch; the WAL's CRCs catch disk
        corruption) is an ``InvalidArgumentError`` result on every replica alike, not a crash.
        """
        try:
            client_id, request_id, request = decode_entry(data)
        except CodecError as err:
            error = InvalidArgumentError(f"raftkv: undecodable log entry: {err}")
            return ApplyResult(None, error, (), False, self._rev)
        return self.apply(request, client_id, request_id)

    def _execute(self, request: Any) -> tuple[Any, tuple[Event, ...]]:
        kind = type(request)
        if kind is PutRequest:  # the hot path: one put, at most one event
            check_put(request)
            if request.lease:
                self._check_lease(request.lease)
            put_events: list[Event] = []
            self._wevents = put_events
            try:
                put_response = self._put(request)
            finally:
                self._wevents = None
                if put_events:
                    self._rev += 1
            return put_response, (put_events[0],)
        if kind is RangeRequest:
            check_range(request)
            return self._range(request, self._rev), ()
        if kind is DeleteRangeRequest:
            check_delete(request)
            self._wevents = []
            try:
                delete_response = self._delete_range(request)
            finally:
                delete_events = self._end_write()
            return delete_response, delete_events
        if kind is TxnRequest:
            check_txn(request, self.max_txn_ops)
            return self._txn(request)
        if kind is CompactionRequest:
            check_compaction(request)
            return self._compact(request.revision), ()
        raise InvalidArgumentError(f"raftkv: unknown request type {kind.__name__}")

    # -----------------------------------------------------------------------------------------
    # Direct API (raises EtcdError; events are returned only by apply)

    def put(
        self,
        key: bytes,
        value: bytes = b"",
        lease: int = 0,
        prev_kv: bool = False,
        ignore_value: bool = False,
        ignore_lease: bool = False,
    ) -> PutResponse:
        return self._run(PutRequest(key, value, lease, prev_kv, ignore_value, ignore_lease))

    def range(
        self,
        key: bytes,
        range_end: bytes = b"",
        *,
        revision: int = 0,
        limit: int = 0,
        sort_order: SortOrder = SortOrder.NONE,
        sort_target: SortTarget = SortTarget.KEY,
        serializable: bool = False,
        keys_only: bool = False,
        count_only: bool = False,
        min_mod_revision: int = 0,
        max_mod_revision: int = 0,
        min_create_revision: int = 0,
        max_create_revision: int = 0,
    ) -> RangeResponse:
        req = RangeRequest(
            key,
            range_end,
            limit,
            revision,
            sort_order,
            sort_target,
            serializable,
            keys_only,
            count_only,
            min_mod_revision,
            max_mod_revision,
            min_create_revision,
            max_create_revision,
        )
        return self._run(req)

    def get(self, key: bytes, revision: int = 0) -> KeyValue | None:
        """Convenience: the live KeyValue of ``key`` at ``revision`` (0 = current) or None."""
        kvs = self.range(key, revision=revision).kvs
        return kvs[0] if kvs else None

    def delete_range(
        self, key: bytes, range_end: bytes = b"", prev_kv: bool = False
    ) -> DeleteRangeResponse:
        return self._run(DeleteRangeRequest(key, range_end, prev_kv))

    def txn(
        self,
        compare: Iterable[Compare] = (),
        success: Iterable[Any] = (),
        failure: Iterable[Any] = (),
    ) -> TxnResponse:
        """``success``/``failure`` items may be ``RequestOp``s or bare requests."""

        def ops(items: Iterable[Any]) -> tuple[RequestOp, ...]:
            return tuple(x if type(x) is RequestOp else RequestOp.of(x) for x in items)

        return self._run(TxnRequest(tuple(compare), ops(success), ops(failure)))

    def compact(self, revision: int) -> CompactionResponse:
        return self._run(CompactionRequest(revision))

    def _run(self, request: Any) -> Any:
        return self._execute(request)[0]

    # -----------------------------------------------------------------------------------------
    # Write transactions

    def _end_write(self) -> tuple[Event, ...]:
        events = self._wevents
        self._wevents = None
        if not events:
            return ()
        self._rev += 1
        return tuple(events)

    def _check_lease(self, lease: int) -> None:
        exists = self.lease_exists
        if exists is not None and not exists(lease):
            raise LeaseNotFoundError()

    def _attach(self, lease: int, key: bytes) -> None:
        keys = self._leases.get(lease)
        if keys is None:
            self._leases[lease] = {key}
        else:
            keys.add(key)

    def _detach(self, lease: int, key: bytes) -> None:
        keys = self._leases.get(lease)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._leases[lease]

    def _put(self, r: PutRequest) -> PutResponse:
        """One put inside the open write txn; checks before changing anything."""
        prev = self._put_record(r)
        header = _new_header(0, 0, self._rev + 1, 0)
        return _new_put_response(header, prev if r.prev_kv else None)

    def _put_record(self, r: PutRequest) -> KeyValue | None:
        """``_put`` without its response: the key's previous live version (or None)."""
        wrev = self._rev + 1
        key = r.key
        hist = self._histories.get(key)
        if hist is None and self._new_histories:
            hist = self._new_histories.get(key)
        prev = None
        if hist is not None:
            last = hist[-1]
            # invariant: a key is written at most once per revision
            assert last.mod_revision < wrev, "key written twice in one revision"
            if last.create_revision != 0:
                prev = last
            key = last.key  # share one bytes object per key
        value = r.value
        lease = r.lease
        if r.ignore_value or r.ignore_lease:
            if prev is None:
                raise KeyNotFoundError()
            if r.ignore_value:
                value = prev.value
            if r.ignore_lease:
                lease = prev.lease
        if prev is None:
            kv = _new_kv(key, value, wrev, wrev, 1, lease)
            if hist is None:
                if self._defer_order:
                    self._new_histories[key] = [kv]
                else:
                    self._histories[key] = [kv]
            elif self._keep_history:
                hist.append(kv)
            else:
                self._replace(hist, kv)
            if self._defer_order:
                self._new_live.append(key)
            else:
                self._live_sorted.add(key)
        else:
            kv = _new_kv(key, value, prev.create_revision, wrev, prev.version + 1, lease)
            if self._keep_history:
                hist.append(kv)  # type: ignore[union-attr]
            else:
                self._replace(hist, kv)  # type: ignore[arg-type]
            if prev.lease and prev.lease != lease:
                self._detach(prev.lease, key)
        if lease and (prev is None or prev.lease != lease):
            self._attach(lease, key)
        if self._keep_history:
            self._log.append(kv)
        self._records += 1
        self._size_bytes += len(key) + len(value) + RECORD_OVERHEAD_BYTES
        self._wevents.append(_new_event(_PUT, kv, prev))  # type: ignore[union-attr]
        return prev

    def _replace(self, hist: list[KeyValue], kv: KeyValue) -> None:
        """Without history: ``kv`` takes the place of the key's one record."""
        old = hist[-1]
        hist[-1] = kv
        self._records -= 1
        self._size_bytes -= record_size_bytes(old)

    def _delete_keys(self, keys: list[bytes]) -> int:
        """Tombstone the given live keys (sorted) inside the open write txn."""
        wrev = self._rev + 1
        index = self._index
        log = self._log
        events = self._wevents
        size = 0
        for k in keys:
            hist = index[k]
            prev = hist[-1]
            assert prev.mod_revision < wrev and prev.create_revision != 0
            tomb = _new_kv(prev.key, b"", 0, wrev, 0, 0)
            if self._keep_history:
                hist.append(tomb)
                log.append(tomb)
            else:
                self._replace(hist, tomb)
            size += len(prev.key) + RECORD_OVERHEAD_BYTES
            events.append(_new_event(_DELETE, tomb, prev))  # type: ignore[union-attr]
            if prev.lease:
                self._detach(prev.lease, prev.key)
        live_keys = self._live_keys
        for k in keys:
            live_keys.remove(k)
        self._records += len(keys)
        self._size_bytes += size
        return len(keys)

    def _delete_range(self, r: DeleteRangeRequest) -> DeleteRangeResponse:
        # Sees the txn's own earlier writes, like etcd's storeTxnWrite.
        read_rev = self._rev + 1 if self._wevents else self._rev
        kvs, _ = self._collect(r.key, r.range_end, read_rev, 0, False)
        n = self._delete_keys([kv.key for kv in kvs])
        rev = self._rev + 1 if (n or self._wevents) else self._rev
        return DeleteRangeResponse(_header(rev), n, tuple(kvs) if r.prev_kv else ())

    # -----------------------------------------------------------------------------------------
    # Reads

    def _collect(
        self, key: bytes, range_end: bytes, rev: int, limit: int, count_only: bool
    ) -> tuple[list[KeyValue], int]:
        """Live versions at ``rev`` of the keys in the range, in key order: (first ``limit``
        of them (all if limit <= 0; none if count_only), total count)."""
        index = self._index
        if not range_end:
            hist = index.get(key)
            if hist is None:
                return [], 0
            kv = _visible(hist, rev)
            if kv is None:
                return [], 0
            return ([] if count_only else [kv]), 1
        if range_end != b"\0" and range_end <= key:
            return [], 0
        if rev == (self._rev + 1 if self._wevents else self._rev):
            return self._collect_current(key, range_end, limit, count_only)
        if range_end == b"\0":
            keys = index.irange(minimum=key)
        else:
            keys = index.irange(key, range_end, inclusive=(True, False))
        kvs: list[KeyValue] = []
        count = 0
        want = 0 if count_only else (limit if limit > 0 else -1)
        for k in keys:
            hist = index[k]
            kv = hist[-1]
            if kv.mod_revision > rev:
                kv = _visible(hist, rev)
                if kv is None:
                    continue
            elif kv.create_revision == 0:
                continue
            count += 1
            if want:
                kvs.append(kv)
                want -= 1
        return kvs, count

    def _collect_current(
        self, key: bytes, range_end: bytes, limit: int, count_only: bool
    ) -> tuple[list[KeyValue], int]:
        """``_collect`` at the revision the store (with an open txn's writes) is at now:
        ``_live_keys`` is exactly the set of visible keys there, so the count is two bisects
        and only the returned keys are touched."""
        lo, hi = self._live_span(key, range_end)
        count = hi - lo
        if count_only or count == 0:
            return [], count
        stop = hi if limit <= 0 else min(hi, lo + limit)
        hists = self._index.values_of(list(self._live_keys.islice(lo, stop)))
        return list(map(_LAST, hists)), count

    def _range(self, r: RangeRequest, cur_rev: int) -> RangeResponse:
        """etcd's applierV3backend.Range + mvcc rangeKeys, at read revision ``cur_rev``."""
        rev = self._read_revision(r, cur_rev)
        limit = r.limit
        if r.sort_order != SortOrder.NONE or _filtered(r):
            limit = 0  # fetch everything; sort and truncate afterwards
        if limit > 0:
            limit += 1  # one extra for `more`
        kvs, count = self._collect(r.key, r.range_end, rev, limit, r.count_only)
        kvs = _prune(r, kvs)
        sort_order, sort_key = _sorting(r)
        if sort_order != SortOrder.NONE and len(kvs) > 1:
            # Stable sort; etcd's sort.Sort is stable only for small inputs (see report).
            kvs.sort(key=sort_key, reverse=sort_order == SortOrder.DESCEND)
        more = False
        if r.limit > 0 and len(kvs) > r.limit:
            kvs = kvs[: r.limit]
            more = True
        if r.keys_only:
            kvs = [_key_only(kv) for kv in kvs]
        return RangeResponse(_header(cur_rev), tuple(kvs), more, count)

    def _read_revision(self, r: RangeRequest, cur_rev: int) -> int:
        rev = r.revision
        if rev > cur_rev:
            raise FutureRevisionError()
        if rev <= 0:
            rev = cur_rev
        if rev < self._compact_rev:
            raise CompactedError(compact_revision=self._compact_rev)
        return rev

    # -----------------------------------------------------------------------------------------
    # Reads in steps (a caller on an event loop runs other work between them)

    def range_is_bounded(self, r: RangeRequest) -> bool:
        """Whether ``apply(r)`` costs O(log N + BOUNDED_PAGE_KEYS) at most: one key, or a
        count or a page of at most ``BOUNDED_PAGE_KEYS`` at the current revision, unsorted and
        unfiltered, while no write is open. Any other range may touch every key in it: use
        ``range_in_steps``."""
        if not r.range_end:
            return True
        if self._wevents is not None:
            return False  # a write in steps is open: only reads by revision see it right
        if r.revision > 0 and r.revision != self._rev:
            return False
        if r.sort_order != SortOrder.NONE or r.sort_target != SortTarget.KEY or _filtered(r):
            return False
        return r.count_only or 0 < r.limit <= BOUNDED_PAGE_KEYS

    def range_in_steps(
        self, r: RangeRequest, step_keys: int = READ_STEP_KEYS
    ) -> Generator[RangeResponse | None, None, None]:
        """The answer ``apply(r)`` gives, computed ``step_keys`` keys at a time: yields
        None after each step, then the ``RangeResponse``; errors (compacted, future revision)
        are raised by the first ``next``. The store may apply writes between steps: the read
        revision is fixed by the first step (a revision of 0 reads the one current then), a
        key's versions at or below it never change, and cutting old versions is held off
        until the generator is done (closed, exhausted or collected), as for a snapshot
        stream. The response's header revision is the store's revision at the first step."""
        cur_rev = self._rev
        rev = self._read_revision(r, cur_rev)
        self._open_streams += 1
        try:
            want = not r.count_only
            keep = r.limit + 1 if r.limit > 0 and not _filtered(r) else 0
            if r.sort_order != SortOrder.NONE:
                keep = 0
            kvs: list[KeyValue] = []
            count = 0
            index = self._index
            for batch in _key_batches(index, r.key, r.range_end, step_keys):
                for hist in index.values_of(batch):
                    kv = _visible(hist, rev)
                    if kv is None:
                        continue
                    count += 1
                    if want and (not keep or len(kvs) < keep):
                        kvs.append(kv)
                yield None
            kvs = _prune(r, kvs)
            sort_order, sort_key = _sorting(r)
            if sort_order != SortOrder.NONE and len(kvs) > 1:
                descend = sort_order == SortOrder.DESCEND
                kvs = yield from _sorted_in_steps(kvs, sort_key, descend, step_keys)
            more = False
            if r.limit > 0 and len(kvs) > r.limit:
                del kvs[r.limit :]
                more = True
            if r.keys_only:
                out: list[KeyValue] = []
                for i in range(0, len(kvs), step_keys):
                    out.extend(map(_key_only, kvs[i : i + step_keys]))
                    yield None
                kvs = out
            yield RangeResponse(_header(cur_rev), tuple(kvs), more, count)
        finally:
            self._stream_closed()

    # -----------------------------------------------------------------------------------------
    # Transactions

    def _compare(self, c: Compare, rev: int) -> bool:
        """etcd's applyCompare: holds iff it holds for every key in the range; a missing key
        compares as a zero KeyValue, except that a VALUE compare on no key always fails."""
        kvs, _ = self._collect(c.key, c.range_end, rev, 0, False)
        if not kvs:
            if c.target == CompareTarget.VALUE:
                return False
            kvs = [_EMPTY_KV]
        target = c.target
        result = c.result
        a: Any  # both bytes (VALUE) or both int (the others)
        b: Any
        for kv in kvs:
            if target == CompareTarget.VALUE:
                a, b = kv.value, c.value
            elif target == CompareTarget.VERSION:
                a, b = kv.version, c.version
            elif target == CompareTarget.CREATE:
                a, b = kv.create_revision, c.create_revision
            elif target == CompareTarget.MOD:
                a, b = kv.mod_revision, c.mod_revision
            else:
                a, b = kv.lease, c.lease
            if result == CompareResult.EQUAL:
                ok = a == b
            elif result == CompareResult.NOT_EQUAL:
                ok = a != b
            elif result == CompareResult.GREATER:
                ok = a > b
            else:
                ok = a < b
            if not ok:
                return False
        return True

    def _plan(self, t: TxnRequest, rev: int) -> _Plan:
        """etcd's compareToPath: every compare, nested ones included, sees the state before
        the txn."""
        ok = all(self._compare(c, rev) for c in t.compare)
        ops = t.success if ok else t.failure
        return ok, [self._plan(op.request_txn, rev) for op in ops if op.request_txn is not None]

    def _check_plan(self, t: TxnRequest, plan: _Plan, puts: bool) -> None:
        """etcd's checkRequests over the taken path, before anything is written: puts
        (ignore_* needs an existing key, a lease must exist) or ranges (revision bounds)."""
        ok, subs = plan
        nested = iter(subs)
        for op in t.success if ok else t.failure:
            if op.request_txn is not None:
                self._check_plan(op.request_txn, next(nested), puts)
            elif puts and op.request_put is not None:
                p = op.request_put
                if p.ignore_value or p.ignore_lease:
                    if _visible_now(self._index, p.key) is None:
                        raise KeyNotFoundError()
                if p.lease:
                    self._check_lease(p.lease)
            elif not puts and op.request_range is not None:
                rr = op.request_range
                if rr.revision != 0:
                    if rr.revision > self._rev:
                        raise FutureRevisionError()
                    if rr.revision < self._compact_rev:
                        raise CompactedError(compact_revision=self._compact_rev)

    def _txn(self, t: TxnRequest) -> tuple[TxnResponse, tuple[Event, ...]]:
        plan = self._plan(t, self._rev)
        self._check_plan(t, plan, True)
        self._check_plan(t, plan, False)
        self._wevents = []
        try:
            succeeded, responses = self._apply_ops(t, plan)
        finally:
            events = self._end_write()
        return TxnResponse(_header(self._rev), succeeded, responses), events

    def _apply_ops(self, t: TxnRequest, plan: _Plan) -> tuple[bool, tuple[ResponseOp, ...]]:
        ok, subs = plan
        nested = iter(subs)
        out = []
        # Every put of the txn without prev_kv answers the same (frozen) response: one object
        # for all of them instead of three per put, a fifth of applying a txn of puts.
        bare_put = None
        for op in t.success if ok else t.failure:
            if op.request_put is not None:
                put = op.request_put
                prev = self._put_record(put)
                if put.prev_kv and prev is not None:
                    header = ResponseHeader(0, 0, self._rev + 1, 0)
                    out.append(ResponseOp(response_put=PutResponse(header, prev)))
                else:
                    if bare_put is None:
                        header = ResponseHeader(0, 0, self._rev + 1, 0)
                        bare_put = ResponseOp(response_put=PutResponse(header, None))
                    out.append(bare_put)
            elif op.request_range is not None:
                read_rev = self._rev + 1 if self._wevents else self._rev
                out.append(ResponseOp(response_range=self._range(op.request_range, read_rev)))
            elif op.request_delete_range is not None:
                resp = self._delete_range(op.request_delete_range)
                out.append(ResponseOp(response_delete_range=resp))
            else:
                sub_ok, sub_resps = self._apply_ops(op.request_txn, next(nested))  # type: ignore[arg-type]
                # etcd leaves a nested txn's header revision at 0
                out.append(ResponseOp(response_txn=TxnResponse(_header(0), sub_ok, sub_resps)))
        return ok, tuple(out)

    # -----------------------------------------------------------------------------------------
    # Compaction

    def _compact(self, rev: int) -> CompactionResponse:
        """The logical compaction, O(log N): from now on reads below ``rev`` fail and the log
        starts at ``rev``. The old versions are cut by ``compact_step``: at once in the
        default mode, in batches the caller runs in the background otherwise."""
        if rev <= self._compact_rev:
            raise CompactedError(compact_revision=self._compact_rev)
        if rev > self._rev:
            raise FutureRevisionError()
        self._compact_rev = rev
        log = self._log
        start = self._log_start
        # Keys with a change at or below rev are the only ones whose history can shrink: the
        # log records in [start, stop) name them (a key once per version).
        stop = bisect_right(log, rev, lo=start, key=_MOD)
        if stop > start:
            # The list object is kept, not copied: _log is only appended to or replaced.
            self._pending.append((log, start, stop))
            self._pending_records += stop - start
        # The log keeps records >= rev (a retained put at exactly rev is still an event).
        self._log_start = bisect_left(log, rev, lo=start, hi=stop, key=_MOD)
        if self._log_start >= _LOG_REBUILD_MIN and self._log_start * 2 > len(log):
            self._log = log[self._log_start :]
            self._log_start = 0
        if not self._compact_in_background and not self._open_streams:
            while self.compact_step(_IMMEDIATE_STEP_KEYS):
                pass
        return CompactionResponse(_header(self._rev))

    @property
    def compaction_pending(self) -> bool:
        """Whether old versions below the compact revision still wait for ``compact_step``."""
        return bool(self._pending or self._dead_logs)

    @property
    def compaction_backlog(self) -> int:
        """Versions below the compact revision whose keys ``compact_step`` has yet to visit
        (an upper bound of the records still to drop); 0 when no work is pending."""
        return self._pending_records

    def compact_step(self, max_keys: int = 1000) -> bool:
        """The physical compaction of up to ``max_keys`` pending key visits: cut each visited
        key's history below the compact revision (etcd's keyIndex.compact), drop keys left
        with nothing, update ``history_size`` and ``db_size_bytes``. Returns whether work
        remains. Invisible to readers: every read at or above the compact revision picks its
        version by revision, so the versions still waiting here are never seen.

        A visit is one log record below the compact revision, so a key with several old
        versions is visited once per version; after its first visit the others find nothing
        to cut. The cut always uses the current compact revision, so work left by an earlier
        compaction is done to the later one's revision.

        A log list the store has replaced is emptied ``_DEAD_LOG_STEP`` references per call
        once no pending work reads it, so the versions it alone kept are freed a slice at a
        time. While a snapshot stream is open nothing is cut (it returns whether work waits)."""
        pending = self._pending
        if not pending and not self._dead_logs:
            return False
        if self._open_streams:
            return True
        rev = self._compact_rev
        index = self._index
        budget = max(1, max_keys)
        dropped = dropped_bytes = 0
        while pending and budget:
            log, lo, hi = pending[0]
            end = min(hi, lo + budget)
            for i in range(lo, end):
                k = log[i].key
                hist = index.get(k)
                if hist is None or hist[0].mod_revision > rev:
                    continue
                j = bisect_right(hist, rev, key=_MOD)  # versions at or below rev: hist[:j]
                cut = j if hist[j - 1].create_revision == 0 else j - 1
                if cut == 0:
                    continue
                dropped += cut
                dropped_bytes += cut * (len(k) + RECORD_OVERHEAD_BYTES)
                for m in range(cut):
                    dropped_bytes += len(hist[m].value)
                if cut == len(hist):
                    del index[k]
                else:
                    index[k] = hist[cut:]  # a new list: a running serialize() keeps the old one
            budget -= end - lo
            self._pending_records -= end - lo
            if end == hi:
                pending.pop(0)
                if log is not self._log and all(p[0] is not log for p in pending):
                    self._dead_logs.append(log)
            else:
                pending[0] = (log, end, hi)
        self._records -= dropped
        self._size_bytes -= dropped_bytes
        self._empty_dead_logs()
        return bool(pending or self._dead_logs)

    def _empty_dead_logs(self) -> None:
        dead_logs = self._dead_logs
        budget = _DEAD_LOG_STEP
        while dead_logs and budget:
            dead = dead_logs[-1]
            n = min(budget, len(dead))
            del dead[len(dead) - n :]  # from the end: nothing left to move
            budget -= n
            if not dead:
                dead_logs.pop()

    # -----------------------------------------------------------------------------------------
    # Watch support

    def events_since(
        self,
        revision: int,
        key: bytes,
        range_end: bytes = b"",
        *,
        prev_kv: bool = False,
        max_events: int = 0,
    ) -> list[Event]:
        """The events with ``mod_revision >= revision`` on keys in (key, range_end), in
        revision order, as etcd's watch replays them from history.

        Raises ``CompactedError`` (with ``compact_revision``) if ``revision`` is below the
        compact revision. At exactly the compact revision only the surviving puts are
        replayed (deletions there were compacted), as in etcd. ``prev_kv`` adds each event's
        previous version (the key at ``mod_revision - 1``) when it is not compacted. With
        ``max_events > 0`` the list stops after that many events, but never inside one
        revision; continue from ``events[-1].kv.mod_revision + 1``.
        """
        return self.replay(revision, key, range_end, prev_kv=prev_kv, max_events=max_events)[0]

    def replay(
        self,
        revision: int,
        key: bytes,
        range_end: bytes = b"",
        *,
        prev_kv: bool = False,
        max_events: int = 0,
        max_scanned: int = 0,
    ) -> tuple[list[Event], int]:
        """``events_since``, and the revision to continue from: the store's revision + 1 when
        the read reached the end of the history, else the first revision it did not read.
        With ``max_scanned > 0`` it also stops (at a revision boundary) once it has looked
        at that many log records, matching or not: a watcher of one key replaying from an
        old revision then costs bounded work per call, not a walk of the whole log."""
        events, next_rev, _ = self.replay_part(
            revision,
            key,
            range_end,
            prev_kv=prev_kv,
            max_events=max_events,
            max_scanned=max_scanned,
            split=False,
        )
        return events, next_rev

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
        split: bool = True,
    ) -> tuple[list[Event], int, int]:
        """``replay``, able to stop inside a revision: ``(events, next_rev, next_skip)``.

        It starts ``skip`` records into ``revision``'s records in the log. With ``split``
        it stops after ``max_scanned`` records, or ``max_events`` events, even inside a
        revision (one delete of a million keys is a million records of one revision):
        ``next_skip > 0`` then says it read the first ``next_skip`` records of ``next_rev``,
        and the next call continues with ``revision=next_rev, skip=next_skip``. The events
        of that revision are then split between calls, so a caller that must hand a
        revision out whole (a watcher) keeps them until the revision is complete. Otherwise
        ``next_skip`` is 0 and the call is ``replay``."""
        self._check_history("a watch replay")
        compact_rev = self._compact_rev
        if revision < compact_rev:
            raise CompactedError(compact_revision=compact_rev)
        log = self._log
        single = not range_end
        open_ended = range_end == b"\0"
        out: list[Event] = []
        last_rev = -1
        # A write in steps may have put records of the next revision in the log already.
        end = len(log) if self._wevents is None else bisect_right(log, self._rev, key=_MOD)
        start = bisect_left(log, revision, lo=self._log_start, key=_MOD)
        if skip:  # never past the records of ``revision`` itself
            start = min(start + skip, bisect_right(log, revision, lo=start, hi=end, key=_MOD))
        scan_end = end if max_scanned <= 0 else min(end, start + max_scanned)
        i = start
        while i < end:
            kv = log[i]
            rev = kv.mod_revision
            if i >= scan_end:  # (i > start: log[i - 1] was read by this call)
                if rev != log[i - 1].mod_revision:
                    return out, rev, 0
                if split:
                    return out, rev, i - bisect_left(log, rev, lo=self._log_start, key=_MOD)
            i += 1
            k = kv.key
            if single:
                if k != key:
                    continue
            elif k < key or (not open_ended and k >= range_end):
                continue
            if max_events and len(out) >= max_events:
                if rev != last_rev:
                    return out, rev, 0
                if split:  # log[i - 1] is the first record not read
                    return out, rev, i - 1 - bisect_left(log, rev, lo=self._log_start, key=_MOD)
            tomb = kv.create_revision == 0
            if tomb and rev == compact_rev:
                continue  # compacted away
            prev = None
            if prev_kv and kv.version != 1 and rev - 1 >= compact_rev:
                hist = self._index.get(k)
                if hist is not None:
                    prev = _visible(hist, rev - 1)
            out.append(Event(_DELETE if tomb else _PUT, kv, prev))
            last_rev = rev
        return out, self._rev + 1, 0

    # -----------------------------------------------------------------------------------------
    # Lease hooks (the lease manager lives elsewhere)

    def keys_with_lease(self, lease_id: int) -> list[bytes]:
        """The live keys attached to ``lease_id``, sorted."""
        return sorted(self._leases.get(lease_id, ()))

    def lease_ids(self) -> list[int]:
        """Lease ids that have at least one live key attached, sorted."""
        return sorted(self._leases)

    def lease_key_count(self, lease_id: int) -> int:
        """How many live keys are attached to ``lease_id``, O(1)."""
        return len(self._leases.get(lease_id, ()))

    def delete_keys_of_lease_in_steps(self, lease_id: int) -> Generator[None, None, ApplyResult]:
        """``delete_keys_of_lease`` for a lease with many keys: the keys are sorted in runs
        merged in steps, then tombstoned ``WRITE_STEP_KEYS`` per step. Still one revision,
        invisible until the last step (what readers see meanwhile: ``apply_in_steps``); the
        caller applies nothing else before it is done."""
        keys = yield from _sorted_in_steps(
            list(self._leases.get(lease_id, ())), None, False, WRITE_STEP_KEYS
        )
        prev_kvs, events = yield from self._delete_in_steps(keys, True)
        return ApplyResult(
            DeleteRangeResponse(_header(self._rev), len(keys), prev_kvs),
            None,
            events,
            False,
            self._rev,
        )

    def delete_keys_of_lease(self, lease_id: int) -> ApplyResult:
        """Delete every key attached to ``lease_id`` in one revision, in key order (etcd's
        lessor.Revoke). No keys: nothing changes and the revision stays."""
        keys = self.keys_with_lease(lease_id)
        self._wevents = []
        try:
            prev_kvs = tuple(self._index[k][-1] for k in keys)
            n = self._delete_keys(keys)
        finally:
            events = self._end_write()
        return ApplyResult(
            DeleteRangeResponse(_header(self._rev), n, prev_kvs), None, events, False, self._rev
        )

    # -----------------------------------------------------------------------------------------
    # Snapshots (encoding lives in kvserver.mvcc.snapshot)

    def serialize(self, chunk_size_bytes: int = 64 * 1024) -> Iterator[bytes]:
        """The snapshot as msgpack chunks of about ``chunk_size_bytes`` (see snapshot.py),
        of the state now; the store may keep applying while the chunks are consumed. Until
        the stream is exhausted or closed, old versions are not cut (``compact_step``): in
        the default mode a compaction applied meanwhile cuts them when the stream ends."""
        return _SnapshotStream(self, serialize(self._snapshot_view(), chunk_size_bytes))

    def serialize_after(
        self,
        prev_stream: bytes | memoryview,
        prev: StreamLayout,
        chunk_size_bytes: int = 64 * 1024,
        on_layout: Callable[[StreamLayout], None] | None = None,
    ) -> Iterator[bytes | memoryview] | None:
        """``serialize`` as a continuation of ``prev_stream``, an earlier snapshot of this
        store's history with layout ``prev`` (``snapshot.serialize_after``: its cost is
        that of the versions applied since; ``on_layout`` gets the new stream's layout after
        its last chunk). None when that cannot be: a compaction since changed the base
        section (the caller then serializes the whole store)."""
        if prev.compact_revision != self._compact_rev or prev.revision > self._rev:
            return None
        chunks = serialize_after(
            self._snapshot_view(), prev_stream, prev, chunk_size_bytes, on_layout
        )
        return _SnapshotStream(self, chunks)

    def _snapshot_view(self) -> SnapshotView:
        self._check_history("a snapshot")
        return SnapshotView(
            revision=self._rev,
            compact_revision=self._compact_rev,
            index=self._index,
            log=self._log,
            log_start=self._log_start,
            # a write in steps may have put records of the next revision in the log already
            log_end=bisect_right(self._log, self._rev, lo=self._log_start, key=_MOD),
            dedup=self._dedup.export(),
        )

    def _check_history(self, what: str) -> None:
        if not self._keep_history:
            raise ValueError(f"raftkv: {what} needs the history this store does not keep")

    def _stream_closed(self) -> None:
        self._open_streams -= 1
        if not self._open_streams and not self._compact_in_background:
            while self.compact_step(_IMMEDIATE_STEP_KEYS):
                pass

    @classmethod
    def restore(cls, chunks: Iterable[bytes], **options: Any) -> MVCCStore:
        """Rebuild a store from ``serialize`` chunks; ``options`` are constructor options.

        The cyclic GC is paused meanwhile: a million keys are millions of new objects, none in
        a cycle, and the collections they would trigger walk all of them again and again
        (half of the time of a restore). If the collector was on, the new objects are handed
        to the permanent generation (``gc.freeze``) before it is turned back on, or its first
        pass would walk them all once more; a restored store lives long, and its callers
        freeze it anyway. (A caller that paused the collector itself freezes when it is done.)
        """
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            loader = SnapshotLoader()
            for chunk in chunks:
                loader.feed(chunk)
            return cls.from_parts(loader.finish(), **options)
        finally:
            if was_enabled:
                gc.freeze()
                gc.enable()

    @classmethod
    def from_parts(cls, parts: SnapshotParts, **options: Any) -> MVCCStore:
        """Build a store from a decoded snapshot: ``parts.base`` holds each key's retained
        version below the compact revision, ``parts.log`` every record from the compact
        revision on. Raises ``SnapshotFormatError`` if a key's history is out of order."""
        revision, compact_revision = parts.revision, parts.compact_revision
        base, log, dedup = parts.base, parts.log, parts.dedup
        store = cls(**options)
        if not store._keep_history and log:
            # each key's last record: its current one (a tombstone for a deleted key)
            latest = dict(zip(map(_KEY, base), base, strict=True))
            latest.update(zip(map(_KEY, log), log, strict=True))
            base, log = list(latest.values()), []
        # Built with C loops (map, zip, compress, filterfalse): a Python statement per record
        # is seconds at a million. Every key first gets a history of its one record (the last
        # one, for a key with several); the keys with several records are then rebuilt.
        log_keys = list(map(_KEY, log))
        histories: dict[bytes, list[KeyValue]] = dict(
            zip(map(_KEY, base), map(list, zip(base)), strict=True)
        )
        # the base records of the keys the log has too (an intersection in C), before the
        # log's records replace their histories below; none to look for when either is empty
        # (a snapshot of a store never compacted has a log of every record and no base)
        in_base = (
            {k: histories[k][0] for k in histories.keys() & set(log_keys)} if base and log else {}
        )
        histories.update(zip(log_keys, map(list, zip(log)), strict=True))
        if len(histories) != len(base) + len(log):
            _rebuild_shared_histories(histories, in_base, log, log_keys)
            if sum(map(len, histories.values())) != len(base) + len(log):  # a record twice
                raise SnapshotFormatError("snapshot history out of order")
        # One sort of the keys (the KeyIndex's), whose order the live keys then take. The
        # histories are otherwise read in the dict's own order (a lookup per key in key order
        # would visit a million hash slots at random), and the totals are summed in C.
        index = store._index = KeyIndex(histories)
        store._rev = revision
        store._compact_rev = compact_revision
        store._log = log
        store._log_start = 0
        records = [*base, *log]
        store._records = len(records)
        store._size_bytes = (
            sum(map(len, map(_KEY, records)))
            + sum(map(len, map(_VALUE, records)))
            + len(records) * RECORD_OVERHEAD_BYTES
        )
        current = list(map(_LAST, histories.values()))
        dead = set(compress(histories, map(not_, map(_CREATE, current))))
        store._live_keys = SortedList(filterfalse(dead.__contains__, index) if dead else index)
        leases = store._leases
        for kv in compress(current, map(_LEASE, current)):
            if kv.create_revision != 0:
                leases.setdefault(kv.lease, set()).add(kv.key)
        store._dedup = DedupTable.from_export(
            dedup, store._dedup.ids_per_client, store._dedup.max_clients
        )
        return store


def _rebuild_shared_histories(
    histories: dict[bytes, list[KeyValue]],
    base: dict[bytes, KeyValue],
    log: list[KeyValue],
    log_keys: list[bytes],
) -> None:
    """Rebuild the history of each key that has more than one record (one in the base and
    some in the log, or several in the log): the base record, then the log's in log order,
    checked to be in revision order. ``histories`` holds each key's last record alone, so a
    log record that is not the one its key's history holds names a shared key, and so does
    a key in both the base and the log (``base`` holds the base records of at least those
    keys); only those keys' records are visited in Python."""
    held = map(_FIRST, map(histories.__getitem__, log_keys))
    shared = set(compress(log_keys, map(is_not, log, held)))
    if base:
        shared.update(base.keys() & set(log_keys))  # visits the smaller of the two
    for k in shared:
        kv = base.get(k)
        histories[k] = [] if kv is None else [kv]
    for kv in compress(log, map(shared.__contains__, log_keys)):
        hist = histories[kv.key]
        if hist and hist[-1].mod_revision >= kv.mod_revision:
            raise SnapshotFormatError("snapshot history out of order")
        hist.append(kv)


class _SnapshotStream(Iterator[Any]):
    """The chunks of one ``MVCCStore.serialize`` or ``serialize_after``; holds physical
    compaction off from its creation until it is exhausted, closed or collected."""

    def __init__(self, store: MVCCStore, chunks: Iterator[Any]) -> None:
        self._store: MVCCStore | None = store
        self._chunks = chunks
        store._open_streams += 1

    def __next__(self) -> Any:
        try:
            return next(self._chunks)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store._stream_closed()

    def __del__(self) -> None:
        self.close()


def _visible_now(index: KeyIndex, key: bytes) -> KeyValue | None:
    hist = index.get(key)
    if hist is None:
        return None
    kv = hist[-1]
    return None if kv.create_revision == 0 else kv
