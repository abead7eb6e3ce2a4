"""The hot batch carried to its task: what the driver's watch received, as Arrow, reads back
as the same rows a task's own watch would give.

- ``arrow_ipc`` / ``ipc_batches`` round-trip ``event_batches`` exactly (PUTs, DELETEs, prev
  values, both value formats); no events is no batch;
- option ``driverBufferBytes``: default, 0 (tasks read from the store), refused values;
- on Spark: a batch cut in three partitions gives the store's history, each event once, a
  key's events in one partition in revision order, both carried and read by the tasks, and
  so do small batches past the driver's buffer.
"""

from __future__ import annotations

import pytest

from kvserver.client import WatchEvent
from kvserver.kvpb.kv import EventType, KeyValue
from kvserver.spark.source.changefeed import arrow_ipc, event_batches, event_size, ipc_batches
from kvserver.spark.source.changefeed_options import changefeed_options
from kvserver.spark.source.changefeed_plan import DEFAULT_HOLD_BYTES
from kvserver.spark.source.options import OptionError, parse

pa = pytest.importorskip("pyarrow")


def options(**extra):
    return parse({"endpoints": "127.0.0.1:2379", "changefeed": "true", "prefix": "f/", **extra})


def events():
    out = []
    for i in range(20_000):  # more than one Arrow batch
        key = b"f/%05d" % (i % 700)
        if i % 97 == 5:
            out.append(WatchEvent(EventType.DELETE, KeyValue(key, mod_revision=100 + i)))
            continue
        prev = KeyValue(key, b"old%d" % i, 7, 99 + i, 1) if i % 3 else None
        kv = KeyValue(key, b"v%d" % i, 7, 100 + i, 2, lease=i % 5)
        out.append(WatchEvent(EventType.PUT, kv, prev))
    return out


@pytest.mark.parametrize(
    "extra", [{}, {"prevValue": "true"}, {"valueFormat": "string", "prevValue": "true"}]
)
def test_arrow_ipc_reads_back_as_event_batches(extra):
    o = options(**extra)
    evs = events()
    got = pa.Table.from_batches(list(ipc_batches(arrow_ipc(o, evs))))
    want = pa.Table.from_batches(list(event_batches(o, evs)))
    assert got.num_rows == len(evs)
    assert got.equals(want)
    assert list(ipc_batches(arrow_ipc(o, []))) == []


def test_event_size_counts_key_and_values():
    a, b = events()[1], events()[3]  # a put with its previous value, one without
    assert event_size(a) > event_size(b) > len(b.kv.key) + len(b.kv.value)


def test_driver_buffer_bytes_option():
    assert changefeed_options(options()).driver_buffer_bytes == DEFAULT_HOLD_BYTES
    assert changefeed_options(options(driverBufferBytes="0")).driver_buffer_bytes == 0
    assert changefeed_options(options(driverBufferBytes="4096")).driver_buffer_bytes == 4096
    for bad in ("-1", "lots"):
        with pytest.raises(OptionError, match="driverBufferBytes"):
            changefeed_options(options(driverBufferBytes=bad))


# -- on Spark, against a real store ------------------------------------------------------------


@pytest.fixture(scope="module")
def kv(raftkv_cluster):
    from kvserver.client import Client

    with Client(raftkv_cluster.endpoints, timeout_s=30) as client:
        yield client


def write_history(kv, prefix: str) -> tuple[int, int]:
    """About 6,000 events on 300 keys: txns of 100 puts, deletes, a key deleted and put
    again; ends with a put. Returns (first revision, last revision)."""
    from kvserver.client import Op, Txn

    first = kv.put(f"{prefix}seed", "0").revision
    for n in range(60):
        kv.txn(
            Txn().then(
                *(Op.put(f"{prefix}k{(n * 100 + i) % 300:03d}", f"v{n}") for i in range(100))
            )
        )
        if n % 7 == 3:
            kv.delete(f"{prefix}k{n:03d}")
    last = kv.put(f"{prefix}k005", "end").revision
    return first, last


def feed_rows(spark, opts, prefix: str, first: int, **extra) -> list:
    """One AvailableNow run: (batch, partition, type, key, value, mod_revision, version) per
    row, in the order each partition gave them."""
    from pyspark.sql import functions as F

    got: list = []

    def record(df, batch_id):
        cols = ["type", "key", "value", "mod_revision", "version"]
        for r in df.withColumn("pid", F.spark_partition_id()).collect():
            got.append((batch_id, r.pid, *(r[c] for c in cols)))

    query = (
        spark.readStream.format("raftkv")
        .options(**opts)
        .option("changefeed", "true")
        .option("prefix", prefix)
        .option("startingRevision", str(first))
        .option("valueFormat", "string")
        .option("numPartitions", "3")
        .options(**extra)
        .load()
        .writeStream.foreachBatch(record)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180) in (None, True)
    assert query.exception() is None
    return got


def by_event(row: tuple):
    """(revision, key) of a (type, key, value, mod_revision, version) row: one event."""
    return row[3], row[1]


def test_carried_and_watched_partitions_give_the_history(spark, kv, raftkv_cluster):
    opts = {"endpoints": ",".join(raftkv_cluster.endpoints)}
    first, last = write_history(kv, "carry/")
    history = []
    with kv.watch("carry/", prefix=True, start_revision=first) as w:
        while not history or history[-1].revision < last:
            history.append(w.get(timeout_s=30))
    want = [
        (
            "PUT" if ev.is_put else "DELETE",
            ev.key.decode(),
            ev.value.decode() if ev.is_put else None,
            ev.revision,
            ev.kv.version,
        )
        for ev in history
    ]
    runs = (
        {},  # one batch, carried by the driver
        {"driverBufferBytes": "0"},  # one batch, each task reads its key range
        # batches of at most 1,500 events; the driver holds the first few hundred events only
        {"driverBufferBytes": "300000", "maxEventsPerTrigger": "1500"},
    )
    for extra in runs:
        rows = feed_rows(spark, opts, "carry/", first, **extra)
        got = sorted((r[2:] for r in rows), key=by_event)
        assert got == sorted(want, key=by_event), extra  # every event once
        if "maxEventsPerTrigger" in extra:
            assert len({r[0] for r in rows}) >= 4
        else:
            assert len({r[1] for r in rows}) == 3, "a batch of 6,000 events is cut in three"
        pids: dict = {}
        for batch, pid, _, key, *_ in rows:
            pids.setdefault((batch, key), set()).add(pid)
        assert all(len(p) == 1 for p in pids.values()), "a key's events in one partition"
        for batch, pid in {(r[0], r[1]) for r in rows}:
            revs = [r[5] for r in rows if (r[0], r[1]) == (batch, pid)]
            assert revs == sorted(revs), "a partition's events in revision order"
