"""Streaming read: the changefeed of a key range, read from the store's MVCC history.

Offsets are ``{"revision": R}``: every event of the watched range with ``mod_revision <= R``
has been delivered. Micro-batch ``(start, end]`` holds exactly the range's events with
``start < mod_revision <= end``, in revision order (events of one revision in the order the
store applied them), read in one task by a watch from ``start + 1`` that stops after the
events of revision ``end``. The answer depends only on ``(start, end)`` and the history, so
a replayed batch holds the same rows (unless that history was compacted meanwhile: then it
fails, or skips ahead with ``skipCompacted``).

Latest offset. The reader (one long-lived Python process per query, in the driver) keeps one
watch on the range, from the first batch's start + 1, in a background thread; the latest
offset is the revision of the newest event that watch has received (PUT or DELETE: a delete
is an event of the range although a range read cannot see it), or the start when there is
none. It is never a store-wide revision: writes outside the range (e.g. a sink writing into
the same store under another prefix, or the data source's markers) produce no event in the
range and no new offset, so they never wake the query with an empty batch. Every end offset
is therefore the revision of an event in the range, which is how a batch's watch knows it has
everything: once it has received revision ``end`` (a revision's events arrive together), what
it holds up to ``end`` is complete.

``startingRevision`` (the first batch's start; ``initialOffset``, the same answer on every
call of a reader):

- ``latest`` (default): the store's revision when the reader first answers: changes after it;
- ``earliest``: the store's compact revision - 1 (0 if never compacted): all history kept;
- ``N``: events with ``mod_revision >= N`` (offset N - 1).

Spark calls ``initialOffset`` again when it replays batch 0 after a restart; ``earliest`` and
``latest`` are resolved anew by a new process unless ``sourceName`` is set: then the first
resolution is stored put-if-absent under ``<markerPrefix>source/<sourceName>/
startingRevision`` and every process uses it.

Compaction: a batch whose start + 1 is below the store's compact revision fails with
``CompactedRevisionError`` naming the compact revision. With ``skipCompacted=true`` it reads
from the compact revision instead (the events in between are lost, and a warning is logged).

``Trigger.AvailableNow``: the target is the largest ``mod_revision`` of a key live in the
range when the query starts (deletes after it are left for the next run).

Columns: ``type`` (PUT or DELETE), ``key``, ``value`` (null for a DELETE), ``prev_value``
(only with ``prevValue=true``: the value before the event, null when there was none),
``create_revision``, ``mod_revision``, ``version``, ``lease`` (a DELETE has etcd's tombstone:
0, its revision, 0, 0). One partition per batch (the events keep their order); it holds the
batch's events in memory.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from kvserver.client import (
    AsyncClient,
    Cmp,
    Op,
    SortOrder,
    SortTarget,
    SyncWatch,
    Txn,
    WatchCompactedError,
)
from kvserver.kvpb.kv import EventType
from kvserver.spark.source.batch_read import decode_key, decode_value
from kvserver.spark.source.options import SourceOptions
from kvserver.spark.source.store import (
    CompactedRevisionError,
    current_compact_revision,
    open_client,
)
from kvserver.spark.txn_reads import range_kvs

log = logging.getLogger("raftkv.spark.changefeed")

READ_TIMEOUT_FLOOR_S = 60.0


def changefeed_schema(o: SourceOptions) -> str:
    value = "string" if o.value_string else "binary"
    prev = f", prev_value {value}" if o.prev_value else ""
    return (
        f"type string, key string, value {value}{prev}, create_revision long, "
        f"mod_revision long, version long, lease long"
    )


class ChangePartition(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


def _range_args(o: SourceOptions):
    return o.key, (o.range_end or None)


async def collect_events(o: SourceOptions, start: int, end: int) -> list:
    """The range's events with ``start < mod_revision <= end`` (see the module docstring)."""
    key, range_end = _range_args(o)
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
                        "restart the query from a newer checkpoint or startingRevision, or "
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


def event_rows(o: SourceOptions, events: list):
    rows = []
    for ev in events:
        kv = ev.kv
        is_put = ev.type is EventType.PUT
        value = decode_value(kv.key, kv.value, o.value_string) if is_put else None
        row = ["PUT" if is_put else "DELETE", decode_key(kv.key), value]
        if o.prev_value:
            prev = ev.prev_kv
            row.append(None if prev is None else decode_value(prev.key, prev.value, o.value_string))
        row += [kv.create_revision, kv.mod_revision, kv.version, kv.lease]
        rows.append(tuple(row))
    return rows


class _RangeWatcher:
    """A background watch of the range that remembers the newest event revision received."""

    def __init__(self, o: SourceOptions, first: int) -> None:
        self.first = first
        self.latest = first - 1
        self.error: BaseException | None = None
        self._o = o
        self._client = open_client(o)
        self._watch: SyncWatch | None = None  # the current one, for stop()
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="raftkv-changefeed-watch", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        key, range_end = _range_args(self._o)
        first = self.first
        try:
            while not self._stopped.is_set():
                try:
                    self._watch = watch = self._client.watch(key, range_end, start_revision=first)
                    for event in watch:
                        self.latest = max(self.latest, event.revision)
                    return
                except WatchCompactedError as err:
                    if not self._o.skip_compacted or err.compact_revision <= first:
                        raise CompactedRevisionError(
                            "raftkv changefeed",
                            first,
                            err.compact_revision,
                            "set skipCompacted=true to skip the lost history",
                        ) from None
                    first = err.compact_revision
        except BaseException as exc:  # reported by the next latestOffset call
            if not self._stopped.is_set():
                self.error = exc

    def stop(self) -> None:
        self._stopped.set()
        watch = self._watch
        if watch is not None:
            watch.close()
        self._client.close()
        self._thread.join(10.0)


class RaftKVStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, o: SourceOptions) -> None:
        self.o = o
        self._initial: int | None = None
        self._watcher: _RangeWatcher | None = None
        self._target: int | None = None

    # -- offsets -------------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        if self._initial is None:
            self._initial = self._resolve_start()
        return {"revision": self._initial}

    def _resolve_start(self) -> int:
        s = self.o.starting_revision
        with open_client(self.o) as client:
            if s == "earliest":
                resolved = max(current_compact_revision(client, self.o.key) - 1, 0)
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

    def latestOffset(self, start: dict, limit) -> dict:
        begin = int(start["revision"])
        if self._watcher is None or self._watcher.first > begin + 1:
            if self._watcher is not None:
                self._watcher.stop()
            self._watcher = _RangeWatcher(self.o, begin + 1)
        if self._watcher.error is not None:
            raise self._watcher.error
        latest = max(begin, self._watcher.latest)
        if self._target is not None:
            latest = max(begin, min(latest, self._target))
        return {"revision": latest}

    def reportLatestOffset(self):
        if self._watcher is None:
            return None
        return {"revision": self._watcher.latest}

    def prepareForTriggerAvailableNow(self) -> None:
        with open_client(self.o) as client:
            res = client.range(
                self.o.key,
                self.o.range_end or None,
                limit=1,
                keys_only=True,
                sort_order=SortOrder.DESCEND,
                sort_target=SortTarget.MOD,
            )
        self._target = res.kvs[0].mod_revision if res.kvs else 0

    # -- batches -------------------------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> list[ChangePartition]:
        s, e = int(start["revision"]), int(end["revision"])
        return [ChangePartition(s, e)] if e > s else []

    def read(self, partition: InputPartition):
        assert isinstance(partition, ChangePartition)  # Spark hands back partitions()'s own
        timeout_s = max(READ_TIMEOUT_FLOOR_S, 4 * self.o.timeout_s)

        async def bounded():
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel
            # that arrives as the awaited call completes (CPython gh-86296).
            async with asyncio.timeout(timeout_s):
                return await collect_events(self.o, partition.start, partition.end)

        try:
            events = asyncio.run(bounded())
        except TimeoutError:
            raise TimeoutError(
                f"raftkv changefeed: the events of revisions "
                f"{partition.start + 1}..{partition.end} did not all arrive "
                f"within {timeout_s:g} s"
            ) from None
        return iter(event_rows(self.o, events))

    def commit(self, end: dict) -> None:
        return None

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def __getstate__(self):
        return {"o": self.o, "_initial": self._initial, "_watcher": None, "_target": None}
