"""Streaming write (``writeStream.format("raftkv")``): exactly once per micro-batch.

Each task writes its rows with ``kvserver.spark.source.chunks.write_chunks`` under the scope
``stream/<query id>/<batch id, 20 digits>``: the query id is the one Spark keeps in the
checkpoint (the same across restarts), the batch id is the micro-batch's; both reach the
task as Spark's local properties (``sql.streaming.queryId``, ``streaming.sql.batchId``). A
micro-batch that Spark replays after a crash (its offsets are in the checkpoint's offset log,
its commit is not) recomputes the same rows from the same offsets; every chunk whose marker
exists is skipped, so each chunk of the batch is applied once. This needs the query to give
each task the same set of rows on replay (deterministic sources such as the raftkv changefeed
or files, and deterministic transformations); Spark's own exactly-once sinks need the same.

Markers live under ``<markerPrefix>stream/<query id>/``, outside any watched data range (the
changefeed refuses a range that overlaps ``markerPrefix``), so the sink never wakes a
changefeed of its own data prefix. ``commit(batch N)`` runs in the driver after every task
of N succeeded, before Spark records N as done; from then on only batches >= N can be
replayed, so it deletes the markers of batches < N (one range delete). The markers of the
last committed batch stay until the next commit; a query that is deleted for good leaves them
(delete ``<markerPrefix>stream/<query id>/``).
"""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from kvserver.spark.fencing import Fence
from kvserver.spark.source import chunks
from kvserver.spark.source.batch_write import fail_after, task_context
from kvserver.spark.source.options import SourceOptions
from kvserver.spark.source.store import open_client

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class StreamCommitMessage(WriterCommitMessage):
    def __init__(
        self, query_id: str, batch_id: int, partition: int, result: chunks.ChunkResult
    ) -> None:
        self.query_id = query_id
        self.batch_id = batch_id
        self.partition = partition
        self.result = result


def batch_scope(query_id: str, batch_id: int) -> str:
    return f"stream/{query_id}/{batch_id:020d}"


class RaftKVStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, o: SourceOptions) -> None:
        self.o = o
        self.fence = Fence.from_options(dict(o.raw))

    def write(self, iterator: Iterator) -> StreamCommitMessage:
        ctx = task_context()
        query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY)
        batch_raw = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if not query_id or batch_raw is None:
            raise RuntimeError(
                f"the raftkv streaming sink needs Spark's local properties "
                f"{QUERY_ID_PROPERTY} and {BATCH_ID_PROPERTY} in its tasks "
                f"(got {query_id!r}, {batch_raw!r})"
            )
        batch_id = int(batch_raw)
        rows = chunks.rows_from_arrow(iterator, self.o.marker_prefix)
        partition = ctx.partitionId()
        with open_client(self.o) as client:
            result = chunks.write_chunks(
                client,
                self.o,
                rows,
                batch_scope(query_id, batch_id),
                partition,
                self.fence,
                fail_after(self.o, ctx.attemptNumber()),
            )
        return StreamCommitMessage(query_id, batch_id, partition, result)

    def commit(self, messages, batchId: int) -> None:
        query_ids = {m.query_id for m in messages if m is not None}
        if not query_ids:
            return
        with open_client(self.o) as client:
            for query_id in query_ids:
                base = self.o.marker_prefix + f"stream/{query_id}/".encode()
                end = self.o.marker_prefix + batch_scope(query_id, batchId).encode()
                client.delete(base, end)

    def abort(self, messages, batchId: int) -> None:
        # Keep the markers: Spark will replay this batch, and the chunks already applied
        # must be skipped then.
        return None
