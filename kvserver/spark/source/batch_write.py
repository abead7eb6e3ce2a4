"""Batch write (``df.write.format("raftkv").mode("append")``): chunk txns, once per job.

``RaftKVWriter`` is made in the driver when the job starts; it draws a job id (time + random)
and is pickled into every task. Each task writes its rows with
``kvserver.spark.source.chunks.write_chunks`` under the scope ``batch/<job id>``: chunks of at
most ``maxTxnOps - 1`` puts, each a txn with its put-if-absent marker (and the fence compare
when ``fenceKey``/``fenceToken`` are given), ``txnsInFlight`` (default 4) of them outstanding
at once so the member batches them into fewer raft rounds. ``commit`` and ``abort`` (driver)
delete the job's markers with one range delete.

What a reader of the store sees (also in the package docstring and the README):

- while the job runs: every chunk txn is atomic and visible as soon as it is applied, so a
  reader sees the rows of the chunks applied so far; there is no job-level atomicity;
- a task attempt that fails midway leaves its applied chunks; Spark's retry of the task
  skips them (their markers exist) and applies the rest: each row is applied once per job
  as long as the retried task computes the same set of rows (a deterministic input);
- a job that aborts (a task failed for good, or the fence refused a chunk) leaves the chunks
  applied so far, and ``abort`` removes the markers: nothing is rolled back;
- a driver that dies between the tasks' commits and the job commit leaves every row applied
  and the job's markers in place (under ``<markerPrefix>batch/``; each key names the job's
  start time): delete them with ``raftkv del --prefix <markerPrefix>batch/`` when no batch
  write is running. Re-running the job writes the same rows again (a new job id): the values
  end the same, with one more version per key.

``mode("overwrite")`` is refused: replacing a prefix atomically would need one txn for the
whole prefix, which the txn limits do not allow for more than ~127 keys.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from kvserver.spark.fencing import Fence
from kvserver.spark.source import chunks
from kvserver.spark.source.options import SourceOptions
from kvserver.spark.source.store import open_client


class OverwriteNotSupportedError(ValueError):
    pass


def check_write_schema(schema) -> None:
    names = [f.name for f in schema.fields]
    missing = [n for n in ("key", "value") if n not in names]
    extra = [n for n in names if n not in ("key", "value", "lease")]
    if missing or extra:
        raise ValueError(
            f"the raftkv data source writes columns key, value and optionally "
            f"lease; got {names}"
            + (f" (missing {missing})" if missing else "")
            + (f" (unknown {extra})" if extra else "")
        )


class ChunkCommitMessage(WriterCommitMessage):
    def __init__(self, partition: int, result: chunks.ChunkResult, scope: str) -> None:
        self.partition = partition
        self.result = result
        self.scope = scope


def task_context():
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("the raftkv writer must run inside a Spark task")
    return ctx


def fail_after(o: SourceOptions, attempt: int) -> int:
    """The test-only injected failure point (see option testFailAfterTxns)."""
    raw = dict(o.raw).get("testfailaftertxns")
    return int(raw) if raw is not None and attempt == 0 else -1


def delete_scope(o: SourceOptions, scope: str) -> None:
    with open_client(o) as client:
        client.delete(o.marker_prefix + scope.encode() + b"/", prefix=True)


class RaftKVWriter(DataSourceArrowWriter):
    def __init__(self, o: SourceOptions) -> None:
        self.o = o
        self.fence = Fence.from_options(dict(o.raw))
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.scope = f"batch/{stamp}-{secrets.token_hex(6)}"

    def write(self, iterator: Iterator) -> ChunkCommitMessage:
        ctx = task_context()
        partition = ctx.partitionId()
        rows = chunks.rows_from_arrow(iterator, self.o.marker_prefix)
        with open_client(self.o) as client:
            result = chunks.write_chunks(
                client,
                self.o,
                rows,
                self.scope,
                partition,
                self.fence,
                fail_after(self.o, ctx.attemptNumber()),
                in_flight=self.o.txns_in_flight,
            )
        return ChunkCommitMessage(partition, result, self.scope)

    def commit(self, messages) -> None:
        delete_scope(self.o, self.scope)

    def abort(self, messages) -> None:
        delete_scope(self.o, self.scope)
