"""The ``raftkv`` PySpark data source: batch read and write, changefeed, exactly-once sink.

::

    from kvserver.spark import register
    register(spark)                                     # spark.dataSource.register(...)
    opts = {"endpoints": "http://127.0.0.1:2379,http://127.0.0.1:22379"}
    df = spark.read.format("raftkv").options(**opts).option("prefix", "jobs/").load()
    df.write.format("raftkv").options(**opts).mode("append").save()   # columns key, value
    feed = (spark.readStream.format("raftkv").options(**opts).option("changefeed", "true")
            .option("prefix", "jobs/").load())
    feed.writeStream.format("raftkv").options(**opts).option("checkpointLocation", d).start()

Options (Spark lower-cases option names; unknown options are refused)
---------------------------------------------------------------------
``endpoints``        required: client URLs, comma-separated.
``prefix``           read/stream: every key starting with it ('' = every key); the path of
                     ``load(path)`` is the same. Or:
``key``, ``rangeEnd`` read/stream: ``[key, rangeEnd)``; ``key`` alone is one key;
                     ``rangeEnd`` ``\\0`` means every key >= ``key``.
``revision``         batch read: read at this revision (default: the current one, pinned
                     when the read is planned). Compacted: ``CompactedRevisionError`` naming
                     the compact revision; above the current one: ``FutureRevisionReadError``.
``numPartitions``    batch read: key-range partitions (default 4; split at equal key counts,
                     from the keys at those ranks: no key is read to plan).
``minPartitionKeys`` batch read: at least this many keys per partition (default 50000), so a
                     small range is one partition. Changefeed: at most this many key-range
                     partitions per micro-batch.
``pageSize``         batch read: keys per range request (default 1000), each page decoded
                     straight into an Arrow record batch.
``valueFormat``      ``binary`` (default) or ``string`` (values decoded as UTF-8; a value that
                     is not UTF-8 fails naming its key). Keys are always UTF-8 strings.
``timeout``          seconds per client call, retries included (default 30).
``maxTxnOps``        write: operations per txn, at most 128 (etcd's ``--max-txn-ops``); one
                     is the chunk's marker, so a txn carries up to ``maxTxnOps - 1`` rows.
``maxTxnBytes``      write: bytes of keys + values (+16 per put) per txn (default 1.5 MiB -
                     16 KiB, under the server's 1.5 MiB request limit).
``txnsInFlight``     batch write: chunk txns a task keeps outstanding at once (default 4; the
                     member batches concurrent proposals); chunks are independent.
``fenceKey``, ``fenceToken`` write: every txn also requires ``create_revision(fenceKey) ==
                     fenceToken`` (``kvserver.spark.fencing.Fence``, the token of a
                     ``FencedLock``); a refused txn applies nothing and the task fails with
                     ``FencedOutError``. Give both or neither.
``markerPrefix``     write: where the exactly-once markers live (default
                     ``__raftkv_spark/``); a changefeed range must not overlap it. Written
                     keys under it are refused.
``changefeed``       stream: must be ``true`` for ``spark.readStream`` (Spark asks a Python
                     source for its schema before saying whether the read is a stream).
``startingRevision`` stream: ``latest`` (default), ``earliest`` or a revision N.
``sourceName``       stream: store the resolved start once (see ``changefeed``), so a
                     restart replays batch 0 from the same revision.
``skipCompacted``    stream: ``true`` skips history that was compacted instead of failing
                     (default ``false``).
``prevValue``        stream: ``true`` adds the column ``prev_value``.
``maxEventsPerTrigger`` stream: at most this many events per micro-batch (Spark's
                     admission control, ``ReadMaxRows``); a revision is never split. In
                     the cold tier it counts revisions (see ``changefeed``).
``maxRevisionsPerTrigger`` stream: at most this many revisions per micro-batch.
``archiveUrl``       stream: history below the store's compact revision is read from this
                     continuous archive (``raftkv serve --archive-url``), then the store's.
``archiveOptions``   stream: fsspec/s3fs options of ``archiveUrl``, ``key=value,...``.
``coldPartitions``   stream: cut a cold batch into up to this many time slices at archived
                     snapshots, replayed in parallel (default 1; see ``changefeed``).
``driverBufferBytes`` stream: bytes of decoded events the driver keeps to hand each hot
                     partition its events (default 128 MiB; 0: tasks read them from the store).
``caFile``, ``certFile``, ``keyFile`` https endpoints: the CA to trust, and a client
                     certificate and key (etcdctl's ``--cacert --cert --key``). Paths, read
                     where each task runs: every Spark host needs the files at that path.
``user``, ``password`` the store's auth (``raftkv auth enable``): every process of the job
                     authenticates as this user. Spark redacts option values whose names
                     match ``spark.redaction.regex`` (``password`` does) in plans and its UI.
``testFailAfterTxns`` tests only: attempt 0 of every write task fails after this many txns.

Schemas
-------
Batch read: ``key string, value binary, create_revision long, mod_revision long, version
long, lease long`` (``value string`` with ``valueFormat=string``). Changefeed: ``type
string, key string, value binary[, prev_value binary], create_revision long, mod_revision
long, version long, lease long``. Writes take ``key`` (string or binary), ``value`` (binary
or string) and optionally ``lease`` (long).

Guarantees (details in the modules)
-----------------------------------
- Batch read (``batch_read``): one revision for the whole DataFrame; partitions are disjoint
  key ranges whose union is the range at that revision; pages of ``pageSize`` keys.
- Batch write (``batch_write``, ``chunks``), ``mode("append")`` only (``overwrite`` is
  refused): each chunk of up to ``maxTxnOps - 1`` rows is one atomic txn, visible when
  applied; no job-level atomicity. A task retried after failing midway skips the chunks
  its earlier attempt applied (put-if-absent markers per job/partition/chunk), so a row is
  applied once per job given a deterministic input. A job that aborts leaves the chunks
  applied so far (no rollback). A driver that dies between the tasks' commits and the job
  commit leaves every row applied plus the job's markers under ``<markerPrefix>batch/``.
- Changefeed (``changefeed``): offsets are revisions of events of the watched range; batch
  ``(start, end]`` = exactly those events, from MVCC history (below the compact revision,
  from the archive with ``archiveUrl``); no event missed or repeated across a stop and a
  restart from the checkpoint, nor across the switch from archive to store; writes
  elsewhere never wake it. Key-range partitions per batch (``numPartitions``), every event
  of a key in one partition, in revision order.
- Streaming sink (``stream_write``): each chunk of a micro-batch applied once, however
  often Spark replays the batch (markers per query/batch/partition/chunk under
  ``<markerPrefix>stream/``, deleted once a later batch commits).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from kvserver.spark.source.batch_read import RaftKVReader, kv_schema
from kvserver.spark.source.batch_write import (
    OverwriteNotSupportedError,
    RaftKVWriter,
    check_write_schema,
)
from kvserver.spark.source.changefeed import RaftKVStreamReader, changefeed_schema
from kvserver.spark.source.options import OptionError, check_outside_markers, parse
from kvserver.spark.source.store import CompactedRevisionError, FutureRevisionReadError
from kvserver.spark.source.stream_write import RaftKVStreamWriter

__all__ = [
    "CompactedRevisionError",
    "FutureRevisionReadError",
    "OptionError",
    "OverwriteNotSupportedError",
    "RaftKVDataSource",
]

OVERWRITE_REFUSAL = (
    "the raftkv data source does not support mode('overwrite'): replacing a prefix "
    "atomically would take one txn for the whole prefix, and txns are limited to 128 "
    "operations; use mode('append') (puts), and delete keys yourself if you must"
)


class RaftKVDataSource(DataSource):
    """``format("raftkv")``: see the module docstring for options and guarantees."""

    @classmethod
    def name(cls) -> str:
        return "raftkv"

    def schema(self) -> str:
        # Spark asks a Python data source for one schema, without saying whether the read is
        # a batch or a stream; the changefeed's columns differ, hence the option.
        o = parse(self.options, need_range=False)
        return changefeed_schema(o) if o.changefeed else kv_schema(o.value_string)

    def reader(self, schema) -> RaftKVReader:
        o = parse(self.options)
        if o.changefeed:
            raise OptionError(
                "option changefeed=true is for spark.readStream; a batch read "
                "has the key/value columns"
            )
        return RaftKVReader(o)

    def writer(self, schema, overwrite: bool) -> RaftKVWriter:
        if overwrite:
            raise OverwriteNotSupportedError(OVERWRITE_REFUSAL)
        check_write_schema(schema)
        return RaftKVWriter(parse(self.options, need_range=False))

    def streamReader(self, schema) -> RaftKVStreamReader:
        o = parse(self.options)
        if not o.changefeed:
            raise OptionError(
                "a streaming read of raftkv is its changefeed: add "
                ".option('changefeed', 'true') (it gives the columns type, key, "
                "value, ...; Spark asks for the schema before it says the read "
                "is a stream)"
            )
        check_outside_markers(o)
        return RaftKVStreamReader(o)

    def streamWriter(self, schema, overwrite: bool) -> RaftKVStreamWriter:
        if overwrite:
            raise OverwriteNotSupportedError(OVERWRITE_REFUSAL)
        check_write_schema(schema)
        return RaftKVStreamWriter(parse(self.options, need_range=False))
