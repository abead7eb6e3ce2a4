"""Streaming read: the changefeed of a key range, from the store's MVCC history and, below
its compact revision, from the continuous archive.

Offsets are ``{"revision": R}``: every event of the watched range with ``mod_revision <= R``
has been delivered. Micro-batch ``(start, end]`` holds exactly the range's events with
``start < mod_revision <= end``. The answer depends only on ``(start, end)`` and the history
(the store's, or the archive's replay of the same log), so a replayed batch holds the same
rows.

Latest offset, hot tier. The reader (one long-lived Python process per query, in the driver)
keeps one watch on the range in a background thread, from the first batch's start + 1, and
records each event's revision and key (``changefeed_plan.EventLedger``), and the decoded
event itself while those held take at most ``driverBufferBytes``. The latest offset
is the revision of the newest event that watch has received completely (PUT or DELETE: a
delete is an event of the range although a range read cannot see it), or the start when
there is none. It is never a store-wide revision: writes outside the range (a sink writing
into the same store under another prefix, the data source's markers) produce no event in
the range and no new offset, so they never wake the query with an empty batch.

Admission control (Spark's ``getDefaultReadLimit`` / ``latestOffset(start, limit)``):
``maxEventsPerTrigger`` N makes the default read limit ``ReadMaxRows(N)``; the end is then
the largest event revision such that the batch holds at most N events. A revision is never
split (offsets are revisions), so a batch whose first revision alone holds more than N
events (a txn of many puts, a delete of a prefix) holds that revision whole.
``maxRevisionsPerTrigger`` M caps ``end - start`` (again never below the first event's
revision). When Spark passes ``ReadAllAvailable`` although a maxEventsPerTrigger was set
(``Trigger.Once``), both caps are ignored, as the API asks.

Partitions, hot tier. The batch's events are cut into at most ``numPartitions`` key ranges
(default 4) of about equal event counts, at least ``MIN_EVENTS_PER_PARTITION`` events each
(a small batch is one task), from the keys the driver's watch recorded. When the driver holds
every event of a partition (and they take at most ``CARRY_MAX_BYTES``), the partition carries
them as an Arrow IPC stream and its task only hands them to Spark: each event is read from
the store and decoded once, by the driver. Otherwise the task watches its key range from
``start + 1`` and stops after the revision of its range's last event in the batch, then
checks it got the number of events the driver counted. Both give the same rows: the events
the store's history holds, in the order its watches send them. Every event of a key is in
one partition, in revision order (events of one revision in the order the store applied
them); Spark gives no order across partitions. A batch that this process did not watch (the
last batch replayed after a restart) is read as one partition of the whole range. A task
retried by Spark gets the same partition, so the same rows.

Cold tier (option ``archiveUrl``: what ``raftkv serve --archive-url`` writes). When the
batch's ``start + 1`` is at or below the store's compact revision C (a watch from C itself
would miss a delete made at C, so the cold tier takes C too), the batch is read from the
archive (``cold_history``): an executor downloads the newest archived snapshot at or below
``start`` and the WAL after it, replays the committed entries through the members' own state
machine, and keeps the range's events of ``(start, end]``, with the same revisions, versions,
leases and previous values the store gave its watchers. A cold batch ends at
``min(C, start + cap)`` where cap is ``maxRevisionsPerTrigger`` or ``maxEventsPerTrigger``
counted in revisions (the driver cannot count a cold batch's events before an executor
decodes them), else ``COLD_REVISIONS``; when capped it ends at an archived snapshot's revision
if one is in reach, so the next batch's replay starts there. It is one partition (the replay
is sequential; splitting it by keys would replay the log once per partition), unless
``coldPartitions`` N > 1: then it is cut at archived snapshots into up to N time slices,
each replayed from its own snapshot in parallel, and a key's events of that batch may be in
several partitions (each in revision order; ``mod_revision`` orders them across). A cold batch is
planned only once the archive has reached the raft index the store had when the compact
revision was read, so every revision up to C is archived; until then the offset stays put.
Once ``start >= C`` the hot tier takes over with a watch from ``start + 1`` (the store has
it): offsets stay one revision sequence across the switch, no event missing or repeated.
A hot batch whose history got compacted before its task ran is read the same way (archive up
to C, store after). When neither covers ``start + 1`` (the archive's oldest snapshot is newer
and its log is not archived from the beginning), the batch fails with ``ColdGapError``
naming the revision needed, the store's compact revision and what the archive holds.

``startingRevision`` (the first batch's start; ``initialOffset``, the same answer on every
call of a reader):

- ``latest`` (default): the store's revision when the reader first answers: changes after it;
- ``earliest``: the store's compact revision - 1 (0 if never compacted): all history kept;
  with ``archiveUrl``, the older of that and the archive's oldest revision - 1 (0 when a
  member's log is archived from its beginning);
- ``N``: events with ``mod_revision >= N`` (offset N - 1).

Spark calls ``initialOffset`` again when it replays batch 0 after a restart; ``earliest`` and
``latest`` are resolved anew by a new process unless ``sourceName`` is set: then the first
resolution is stored put-if-absent under ``<markerPrefix>source/<sourceName>/
startingRevision`` and every process uses it.

Compaction without ``archiveUrl``: a batch whose start + 1 is below the store's compact
revision fails with ``CompactedRevisionError`` naming the compact revision. With
``skipCompacted=true`` it reads from the compact revision instead (the events in between are
lost, and a warning is logged).

``Trigger.AvailableNow``: the target is the largest ``mod_revision`` of a key live in the
range when the query starts (deletes after it are left for the next run).

Columns: ``type`` (PUT or DELETE), ``key``, ``value`` (null for a DELETE), ``prev_value``
(only with ``prevValue=true``: the value before the event, null when there was none),
``create_revision``, ``mod_revision``, ``version``, ``lease`` (a DELETE has etcd's tombstone:
0, its revision, 0, 0). A task holds its partition's events in memory.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from kvserver.client import (
    AsyncClient,
    Cmp,
    Op,
    SortOrder,
    SortTarget,
    Txn,
    WatchCompactedError,
)
from kvserver.kvpb.kv import EventType
from kvserver.spark.source.batch_read import decode_key, decode_value
from kvserver.spark.source.changefeed_options import (
    COLD_REVISIONS,
    ChangefeedOptions,
    changefeed_options,
)
from kvserver.spark.source.changefeed_plan import EventLedger
from kvserver.spark.source.options import SourceOptions
from kvserver.spark.source.store import (
    CompactedRevisionError,
    current_compact_revision,
    open_client,
)
from kvserver.spark.txn_reads import range_kvs

log = logging.getLogger("raftkv.spark.changefeed")

READ_TIMEOUT_FLOOR_S = 60.0
MIN_EVENTS_PER_PARTITION = 2000  # below this a batch is one task: a task costs ~10 ms
ARCHIVE_WAIT_S = 10.0  # a trigger waits this long at most for the archive to catch up
ARCHIVE_POLL_S = 0.2
EVENT_OVERHEAD_BYTES = 400  # a decoded event's objects, besides its key and values
# A partition whose events take more than this is read by its task, not carried in it.
CARRY_MAX_BYTES = 32 << 20
IDLE_MARK_S = 0.01  # how often the driver's watch marks complete what it has received


def changefeed_schema(o: SourceOptions) -> str:
    value = "string" if o.value_string else "binary"
    prev = f", prev_value {value}" if o.prev_value else ""
    return (
        f"type string, key string, value {value}{prev}, create_revision long, "
        f"mod_revision long, version long, lease long"
    )


class ChangePartition(InputPartition):
    """Batch ``(start, end]`` of keys ``[lo, hi)`` (None: the watched range's bounds).

    Hot (``cold=False``): with ``arrow`` (an Arrow IPC stream of its ``count`` events, which
    the driver's watch received), read from it; else read by a watch from ``start + 1`` up to
    ``last``, the revision of the sub-range's last event in the batch (``count`` events; -1:
    not known, then ``last`` is ``end``, an event revision of the whole range). Cold: rebuilt
    from the archive of member ``member`` up to the store's compact revision, the rest (if
    any) by a watch."""

    def __init__(
        self,
        start: int,
        end: int,
        *,
        lo: bytes | None = None,
        hi: bytes | None = None,
        last: int | None = None,
        count: int = -1,
        cold: bool = False,
        member: int | None = None,
        arrow: bytes | None = None,
    ) -> None:
        super().__init__((start, end, lo, hi))
        self.start = start
        self.end = end
        self.lo = lo
        self.hi = hi
        self.last = end if last is None else last
        self.count = count
        self.cold = cold
        self.member = member
        self.arrow = arrow


def _range_args(o: SourceOptions, lo: bytes | None = None, hi: bytes | None = None):
    key = o.key if lo is None else lo
    range_end = o.range_end if hi is None else hi
    return key, (range_end or None)


async def collect_events(
    o: SourceOptions, start: int, end: int, lo: bytes | None = None, hi: bytes | None = None
) -> list:
    """The events of ``[lo, hi)`` with ``start < mod_revision <= end``, where ``end`` is the
    revision of an event of that range (see the module docstring)."""
    key, range_end = _range_args(o, lo, hi)
    async with AsyncClient(list(o.endpoints), **o.client_options()) as client:
        first = start + 1
        while True:
            try:
                return await _collect(client, key, range_end, first, end, o.prev_value)
            except WatchCompactedError as err:
                if not o.skip_compacted or err.compact_revision <= first:
                    raise CompactedRevisionError(
                        "raftkv changefeed",
                        first,
                        err.compact_revision,
                        "restart the query from a newer checkpoint or startingRevision, "
                        "give option archiveUrl to read older history from the archive, or "
                        "set skipCompacted=true to skip the lost history",
                    ) from None
                log.warning(
                    "raftkv changefeed: history %d..%d compacted; skipping to %d",
                    first,
                    err.compact_revision - 1,
                    err.compact_revision,
                )
                first = err.compact_revision


async def _collect(
    client: AsyncClient, key, range_end, first: int, end: int, prev_kv: bool
) -> list:
    watch = client.watch(key, range_end, start_revision=first, prev_kv=prev_kv)
    out: list = []
    try:
        while True:
            if watch.next_revision > end:
                # Everything below next_revision has arrived; what is left up to ``end`` is
                # queued in the watch. Take queued events without waiting for the network:
                # a queued event is returned in the probe's first step.
                probe = asyncio.ensure_future(watch.__anext__())
                await asyncio.sleep(0)
                if not probe.done():
                    probe.cancel()
                    await asyncio.gather(probe, return_exceptions=True)
                    return out
                event = probe.result()
            else:
                event = await watch.__anext__()
            if event.revision > end:
                return out
            out.append(event)
    finally:
        await watch.close()


ARROW_BATCH_EVENTS = 8192


def event_batches(o: SourceOptions, events: list):
    """The events as Arrow record batches of ``changefeed_schema``'s columns (Spark takes
    them without a Python object per value; about twice as fast as tuples)."""
    import pyarrow as pa

    value_type = pa.string() if o.value_string else pa.binary()
    names = ["type", "key", "value"] + (["prev_value"] if o.prev_value else [])
    names += ["create_revision", "mod_revision", "version", "lease"]
    put = EventType.PUT
    for i in range(0, len(events), ARROW_BATCH_EVENTS):
        chunk = events[i : i + ARROW_BATCH_EVENTS]
        kvs = [ev.kv for ev in chunk]
        puts = [ev.type is put for ev in chunk]
        if o.value_string:
            values = [
                decode_value(kv.key, kv.value, True) if p else None
                for kv, p in zip(kvs, puts, strict=True)
            ]
        else:
            values = [kv.value if p else None for kv, p in zip(kvs, puts, strict=True)]
        cols = [
            pa.array(["PUT" if p else "DELETE" for p in puts], pa.string()),
            pa.array([decode_key(kv.key) for kv in kvs], pa.string()),
            pa.array(values, value_type),
        ]
        if o.prev_value:
            prevs = [ev.prev_kv for ev in chunk]
            cols.append(
                pa.array(
                    [
                        None if pv is None else decode_value(pv.key, pv.value, o.value_string)
                        for pv in prevs
                    ],
                    value_type,
                )
            )
        cols += [
            pa.array([kv.create_revision for kv in kvs], pa.int64()),
            pa.array([kv.mod_revision for kv in kvs], pa.int64()),
            pa.array([kv.version for kv in kvs], pa.int64()),
            pa.array([kv.lease for kv in kvs], pa.int64()),
        ]
        yield pa.RecordBatch.from_arrays(cols, names=names)


async def _mark_when_idle(watch, ledger: EventLedger) -> None:
    """Every ``IDLE_MARK_S``, mark complete what the watch has received.

    This task runs only while the reading task is suspended, and that task suspends only in
    the watch, waiting on the network with nothing queued: every event below
    ``watch.next_revision`` has then been added to the ledger. (A timeout around each event
    would say the same at a cost of several microseconds per event.)"""
    while True:
        await asyncio.sleep(IDLE_MARK_S)
        ledger.mark_complete(watch.next_revision - 1)


def event_size(event) -> int:
    """What holding a decoded event costs the driver, about (its bytes and objects)."""
    size = EVENT_OVERHEAD_BYTES + len(event.kv.key) + len(event.kv.value)
    prev = event.prev_kv
    return size if prev is None else size + EVENT_OVERHEAD_BYTES + len(prev.value)


def arrow_ipc(o: SourceOptions, events: list) -> bytes:
    """The events as one Arrow IPC stream of ``changefeed_schema``'s columns."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    writer = None
    for batch in event_batches(o, events):
        if writer is None:
            writer = pa.ipc.new_stream(sink, batch.schema)
        writer.write_batch(batch)
    if writer is None:
        return b""
    writer.close()
    return sink.getvalue().to_pybytes()


def ipc_batches(data: bytes):
    import pyarrow as pa

    if data:
        yield from pa.ipc.open_stream(data)


class _RangeWatcher:
    """A background watch of the range from ``first``, recording every event's revision and
    key in an ``EventLedger`` and, within ``hold_bytes``, the decoded event itself (on its
    own thread and event loop)."""

    def __init__(self, o: SourceOptions, first: int, cold_tier: bool, hold_bytes: int) -> None:
        self.first = first
        self.ledger = EventLedger(first, hold_bytes=hold_bytes)
        self.error: BaseException | None = None
        self._o = o
        self._cold_tier = cold_tier  # compaction is a reason to go cold, not to fail
        self._loop = asyncio.new_event_loop()
        self._stopped = threading.Event()
        self._task: asyncio.Task | None = None
        self._thread = threading.Thread(
            target=self._run, name="raftkv-changefeed-watch", daemon=True
        )
        self._thread.start()

    @property
    def latest(self) -> int:
        return self.ledger.latest()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._task = self._loop.create_task(self._watch())
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # reported by the next latestOffset call
            if not self._stopped.is_set():
                self.error = exc
        finally:
            self.ledger.close()  # wakes a latestOffset waiting on the record
            self._loop.close()

    async def _watch(self) -> None:
        o = self._o
        key, range_end = _range_args(o)
        first = self.first
        ledger = self.ledger
        hold = ledger.hold_bytes > 0
        async with AsyncClient(list(o.endpoints), **o.client_options()) as client:
            while not self._stopped.is_set():
                watch = client.watch(
                    key, range_end, start_revision=first, prev_kv=o.prev_value and hold
                )
                marker = asyncio.ensure_future(_mark_when_idle(watch, ledger))
                try:
                    while not self._stopped.is_set():
                        try:
                            event = await watch.__anext__()
                        except StopAsyncIteration:
                            return
                        if hold:
                            ledger.add(event.revision, event.kv.key, event, event_size(event))
                        else:
                            ledger.add(event.revision, event.kv.key)
                    return
                except WatchCompactedError as err:
                    if self._cold_tier or not o.skip_compacted or err.compact_revision <= first:
                        raise CompactedRevisionError(
                            "raftkv changefeed",
                            first,
                            err.compact_revision,
                            "give option archiveUrl to read older history from the archive, "
                            "or set skipCompacted=true to skip the lost history",
                        ) from None
                    first = err.compact_revision
                finally:
                    marker.cancel()
                    await asyncio.gather(marker, return_exceptions=True)
                    await watch.close()

    def stop(self) -> None:
        self._stopped.set()
        self.ledger.close()
        task = self._task
        if task is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:
                pass  # the loop closed meanwhile
        self._thread.join(10.0)


def _max_applied_index(o: SourceOptions, client) -> int:
    """The highest raft index any endpoint reports: at or past every entry applied anywhere."""
    best = 0
    for st in client.statuses():
        if st.status is not None:
            best = max(best, st.status.raft_index, st.status.raft_applied_index)
    return best


class RaftKVStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, o: SourceOptions) -> None:
        self.o = o
        self.cf: ChangefeedOptions = changefeed_options(o)
        self._initial: int | None = None
        self._watcher: _RangeWatcher | None = None
        self._target: int | None = None
        self._member: int | None = None  # the archived member the cold tier reads

    # -- offsets -------------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        if self._initial is None:
            self._initial = self._resolve_start()
        return {"revision": self._initial}

    def _resolve_start(self) -> int:
        s = self.o.starting_revision
        with open_client(self.o) as client:
            if s == "earliest":
                compact = current_compact_revision(client, self.o.key)
                resolved = max(compact - 1, 0)
                if self.cf.archive_url and compact:
                    from kvserver.spark.source.cold_history import ArchiveView

                    oldest = ArchiveView.load(self.cf.archive_url, self.cf.archive_options).oldest
                    resolved = min(resolved, max(oldest - 1, 0))
            elif s == "latest":
                resolved = client.range(self.o.key, limit=1, keys_only=True).revision
            else:
                resolved = int(s) - 1
            if not self.o.source_name:
                return resolved
            # Stored once: every process (a replay of batch 0 after a restart) resolves alike.
            key = self.o.marker_prefix + f"source/{self.o.source_name}/startingRevision".encode()
            res = client.txn(
                Txn()
                .when(Cmp.version(key) == 0)
                .then(Op.put(key, str(resolved)))
                .otherwise(Op.get(key))
            )
            if res.succeeded:
                return resolved
            return int(range_kvs(res, 0)[0].value)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.cf.max_events:
            return ReadMaxRows(self.cf.max_events)
        return ReadAllAvailable()

    def _caps(self, limit) -> tuple[int, int]:
        """(max events, max revisions) for this call: Spark's limit, or none when Spark asks
        for everything although a maxEventsPerTrigger was configured (Trigger.Once)."""
        if isinstance(limit, ReadMaxRows):
            return int(limit.max_rows), self.cf.max_revisions
        if self.cf.max_events:
            return 0, 0  # the engine overrides the configured limit
        return 0, self.cf.max_revisions

    def latestOffset(self, start: dict, limit=None) -> dict:
        begin = int(start["revision"])
        max_events, max_revisions = self._caps(limit)
        if self.cf.archive_url:
            cold = self._cold_end(begin, max_events, max_revisions)
            if cold is not None:
                return {"revision": cold}
        w = self._watcher
        if w is not None and w.error is not None:
            error = w.error
            w.stop()
            self._watcher = w = None
            if not (self.cf.archive_url and isinstance(error, CompactedRevisionError)):
                raise error
            # Compacted under the watch: the cold tier takes over if begin + 1 is gone.
            cold = self._cold_end(begin, max_events, max_revisions)
            if cold is not None:
                return {"revision": cold}
        if w is None or w.first > begin + 1 or w.ledger.floor > begin:
            if w is not None:
                w.stop()
            self._watcher = w = _RangeWatcher(
                self.o, begin + 1, bool(self.cf.archive_url), self.cf.driver_buffer_bytes
            )
            # A new watch has recorded nothing yet, and an answer equal to the start ends a
            # Trigger.Once or AvailableNow run: let it catch up with what the range holds now
            # (its newest live key; a newer delete waits for the next trigger).
            catch_up = self._target if self._target is not None else self._newest_live()
            if catch_up > begin:
                w.ledger.wait_complete(catch_up, max(READ_TIMEOUT_FLOOR_S, 4 * self.o.timeout_s))
        elif self._target is not None and begin < self._target:
            w.ledger.wait_complete(self._target, max(READ_TIMEOUT_FLOOR_S, 4 * self.o.timeout_s))
        if w.error is not None:  # it failed while we waited: report it, or go cold
            return self.latestOffset(start, limit)
        latest = w.ledger.end_within(begin, max_events, max_revisions)
        if self._target is not None:
            latest = max(begin, min(latest, self._target))
        return {"revision": latest}

    def _cold_end(self, begin: int, max_events: int, max_revisions: int) -> int | None:
        """The end of a cold batch from ``begin``, or None when the store still has
        ``begin + 1`` (the hot tier reads it). A watch from the compact revision itself would
        miss a delete made at it, so the cold tier covers up to the compact revision."""
        from kvserver.spark.source.cold_history import ArchiveView

        with open_client(self.o) as client:
            compact = current_compact_revision(client, self.o.key)
            if begin >= compact:
                return None
            index = _max_applied_index(self.o, client)
        view = ArchiveView.load(self.cf.archive_url, self.cf.archive_options)
        view.check_covers(begin + 1, compact)
        deadline = time.monotonic() + ARCHIVE_WAIT_S
        while not view.reaches(index):  # the archive lags its member by one pass or so
            if time.monotonic() > deadline:
                log.warning(
                    "raftkv changefeed: the archive %s has reached index %d, not %d yet: "
                    "no cold batch this trigger",
                    self.cf.archive_url,
                    view.manifest.commit,
                    index,
                )
                return begin
            time.sleep(ARCHIVE_POLL_S)
            view = ArchiveView.load(self.cf.archive_url, self.cf.archive_options)
        self._member = view.member_id
        target = compact if self._target is None else min(compact, self._target)
        caps = [c for c in (max_events, max_revisions) if c] or [COLD_REVISIONS]
        end = min(target, begin + min(caps))
        if end < target:  # end at a snapshot when one is near: the next batch starts there
            snaps = [r for r in view.snapshot_revisions() if begin < r <= end]
            if snaps:
                end = snaps[-1]
        return max(begin, end)

    def reportLatestOffset(self):
        if self._watcher is None:
            return None
        return {"revision": self._watcher.latest}

    def _newest_live(self) -> int:
        """The largest ``mod_revision`` of a key live in the range (0: none)."""
        with open_client(self.o) as client:
            res = client.range(
                self.o.key,
                self.o.range_end or None,
                limit=1,
                keys_only=True,
                sort_order=SortOrder.DESCEND,
                sort_target=SortTarget.MOD,
            )
        return res.kvs[0].mod_revision if res.kvs else 0

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._newest_live()

    # -- batches -------------------------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> list[ChangePartition]:
        s, e = int(start["revision"]), int(end["revision"])
        if e <= s:
            return []
        if self.cf.archive_url:
            with open_client(self.o) as client:
                compact = current_compact_revision(client, self.o.key)
            if s < compact:
                return self._cold_partitions(s, e, compact)
        w = self._watcher
        if w is not None and w.error is None and w.ledger.covers(s, e):
            slices = w.ledger.split(s, e, self.o.num_partitions, MIN_EVENTS_PER_PARTITION)
            held: list[list | None] = [None] * len(slices)
            if w.ledger.hold_bytes:
                held = w.ledger.held(s, e, slices, CARRY_MAX_BYTES)
            return [
                ChangePartition(
                    s,
                    e,
                    lo=sl.lo,
                    hi=sl.hi,
                    last=sl.last,
                    count=sl.count,
                    arrow=None if events is None else arrow_ipc(self.o, events),
                )
                for sl, events in zip(slices, held, strict=True)
            ]
        # A batch this process did not watch (a replay after a restart): one task, the
        # whole range (``end`` is the revision of an event of the range).
        return [ChangePartition(s, e)]

    def _cold_partitions(self, s: int, e: int, compact: int) -> list[ChangePartition]:
        """One partition; with ``coldPartitions`` N > 1, up to N time slices cut at archived
        snapshots (each replays from its own snapshot, in parallel)."""
        from kvserver.spark.source.cold_history import ArchiveView

        view = ArchiveView.load(
            self.cf.archive_url, self.cf.archive_options, member_id=self._member
        )
        self._member = view.member_id
        bounds = [s]
        n = self.cf.cold_partitions
        if n > 1:
            cuts = [r for r in view.snapshot_revisions() if s < r < min(e, compact)]
            for i in range(1, n):
                aim = s + (min(e, compact) - s) * i // n
                near = [r for r in cuts if r > bounds[-1]]
                if near:
                    bounds.append(min(near, key=lambda r: abs(r - aim)))
        bounds.append(e)
        return [
            ChangePartition(a, b, cold=True, member=self._member)
            for a, b in zip(bounds, bounds[1:], strict=False)
            if b > a
        ]

    def read(self, partition: InputPartition):
        assert isinstance(partition, ChangePartition)  # Spark hands back partitions()'s own
        p = partition
        if p.arrow is not None:
            return ipc_batches(p.arrow)  # the events the driver's watch received
        if p.cold:
            events = self._read_tiered(p)
        else:
            try:
                events = self._read_hot(p, p.start, p.last)
            except CompactedRevisionError:
                if not self.cf.archive_url:
                    raise
                events = self._read_tiered(p)  # compacted since it was planned
            if p.count >= 0 and len(events) != p.count and not self.o.skip_compacted:
                raise RuntimeError(
                    f"raftkv changefeed: the batch of revisions {p.start + 1}..{p.end} "
                    f"should hold {p.count} events of keys [{p.lo!r}, {p.hi!r}), the store "
                    f"gave {len(events)}"
                )
        return event_batches(self.o, events)

    def _read_hot(self, p: ChangePartition, start: int, last: int) -> list:
        timeout_s = max(READ_TIMEOUT_FLOOR_S, 4 * self.o.timeout_s)

        async def bounded():
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel
            # that arrives as the awaited call completes (CPython gh-86296).
            async with asyncio.timeout(timeout_s):
                return await collect_events(self.o, start, last, p.lo, p.hi)

        try:
            return asyncio.run(bounded())
        except TimeoutError:
            raise TimeoutError(
                f"raftkv changefeed: the events of revisions "
                f"{start + 1}..{last} did not all arrive "
                f"within {timeout_s:g} s"
            ) from None

    def _read_tiered(self, p: ChangePartition) -> list:
        """Up to the store's compact revision from the archive, the rest from the store."""
        from kvserver.spark.source.cold_history import ArchiveView, cold_events

        with open_client(self.o) as client:
            compact = current_compact_revision(client, self.o.key)
        cold_end = min(p.end, compact)
        events: list = []
        if cold_end > p.start:
            member = p.member
            if member is None:
                member = ArchiveView.load(self.cf.archive_url, self.cf.archive_options).member_id
            key, range_end = _range_args(self.o, p.lo, p.hi)
            events = cold_events(
                self.cf.archive_url,
                self.cf.archive_options,
                member,
                p.start,
                cold_end,
                key,
                range_end or b"",
            )
        if p.last > cold_end:
            events += self._read_hot(p, max(p.start, cold_end), p.last)
        return events

    def commit(self, end: dict) -> None:
        if self._watcher is not None:
            self._watcher.ledger.trim(int(end["revision"]))

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def __getstate__(self):
        return {
            "o": self.o,
            "cf": self.cf,
            "_initial": self._initial,
            "_watcher": None,
            "_target": None,
            "_member": self._member,
        }
