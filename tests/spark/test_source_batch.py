"""The raftkv data source in batch mode, on real local Spark against three real raftkv processes.

Reads: one pinned revision for the whole DataFrame even while keys change under it (the rows
equal the store at one revision, not a mix of partitions read at different times); the
partitions' union is the range, no key twice, across many pages per partition; a compacted or
future ``revision`` fails with a clear error. Writes: txns within ``maxTxnOps`` and
``maxTxnBytes`` (counted on the server: every applied chunk is one revision, and the rows that
share a mod_revision are one txn), each row applied once although attempt 0 of every task
fails midway and Spark retries it; a stale fencing token is refused with nothing applied;
``overwrite`` is refused.
"""

import math
import threading

import pytest

from kvserver.client import Client
from kvserver.spark.source.options import DEFAULT_MARKER_PREFIX, DEFAULT_MAX_TXN_BYTES
from tests.support.wait import wait_for


@pytest.fixture(scope="module")
def kv(raftkv_cluster):
    with Client(raftkv_cluster.endpoints, timeout_s=30) as client:
        yield client


@pytest.fixture(scope="module")
def opts(raftkv_cluster):
    return {"endpoints": ",".join(raftkv_cluster.endpoints)}


def load_prefix(kv, prefix: str) -> dict[str, tuple]:
    res = kv.range(prefix, prefix=True)
    return {k.key.decode(): (k.value, k.mod_revision, k.version) for k in res.kvs}


def put_many(kv, items: dict[str, bytes]) -> None:
    from kvserver.client import Op, Txn

    keys = sorted(items)
    for i in range(0, len(keys), 100):
        kv.txn(Txn().then(*(Op.put(k, items[k]) for k in keys[i : i + 100])))


def no_markers(kv) -> bool:
    return kv.range(DEFAULT_MARKER_PREFIX, prefix=True, count_only=True).count == 0


# ---------------------------------------------------------------------------------------------
# Reads


def test_read_under_concurrent_writes_is_the_store_at_one_revision(spark, kv, opts):
    keys = [f"pin/{i:05d}" for i in range(800)]
    put_many(kv, {k: b"v0" for k in keys})
    stop = threading.Event()
    done = [0]

    def writer():
        # Overwrites spread over the whole range (every partition's keys change), puts only:
        # then the read's rows must equal the store at their own highest mod_revision.
        n = 0
        while not stop.is_set():
            k = keys[(n * 7919) % len(keys)]
            kv.put(k, f"w{n}")
            n += 1
            done[0] = n

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    try:
        wait_for(lambda: done[0] >= 20, 30, "the concurrent writer to start")
        before = done[0]
        df = (
            spark.read.format("raftkv")
            .options(**opts)
            .option("prefix", "pin/")
            .option("numPartitions", "4")
            .option("minPartitionKeys", "1")
            .option("pageSize", "40")
            .load()
        )
        rows = df.collect()
        during = done[0] - before
    finally:
        stop.set()
        t.join(30)
    assert during >= 20, "the writer must have changed keys while Spark read"
    assert df.rdd.getNumPartitions() == 4
    pinned = max(r.mod_revision for r in rows)
    at_pinned = kv.range("pin/", prefix=True, revision=pinned).kvs
    assert {r.key: (bytes(r.value), r.mod_revision, r.version) for r in rows} == {
        k.key.decode(): (k.value, k.mod_revision, k.version) for k in at_pinned
    }
    assert len(rows) == len(keys)


def test_partitions_union_is_the_range_without_duplicates_over_many_pages(spark, kv, opts):
    from pyspark.sql.functions import spark_partition_id

    items = {f"page/{i:05d}": f"value-{i}".encode() for i in range(3000)}
    put_many(kv, items)
    df = (
        spark.read.format("raftkv")
        .options(**opts)
        .option("prefix", "page/")
        .option("numPartitions", "5")
        .option("minPartitionKeys", "1")
        .option("pageSize", "97")
        .option("valueFormat", "string")
        .load()
    )
    rows = df.withColumn("part", spark_partition_id()).collect()
    assert len(rows) == len(items)
    assert {r.key: r.value.encode() for r in rows} == items  # no duplicate, none missing
    per_part = {}
    for r in rows:
        per_part[r.part] = per_part.get(r.part, 0) + 1
    assert len(per_part) == 5
    assert all(n > 3 * 97 for n in per_part.values()), per_part  # several pages each
    # Partitions are disjoint key intervals: each partition's keys form one contiguous run.
    by_part = {p: sorted(r.key for r in rows if r.part == p) for p in per_part}
    spans = sorted((ks[0], ks[-1]) for ks in by_part.values())
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_large_values_are_paged(spark, kv, opts):
    big = {f"big/{i:03d}": bytes([i]) * (100 * 1024) for i in range(40)}  # 4 MB in all
    for k, v in big.items():
        kv.put(k, v)
    df = (
        spark.read.format("raftkv")
        .options(**opts)
        .option("prefix", "big/")
        .option("numPartitions", "1")
        .option("pageSize", "5")
        .load()
    )
    assert {r.key: bytes(r.value) for r in df.collect()} == big


def test_explicit_revision_reads_the_past(spark, kv, opts):
    first = kv.put("past/a", "1").revision
    kv.put("past/a", "2")
    kv.put("past/b", "3")
    df = (
        spark.read.format("raftkv")
        .options(**opts)
        .option("prefix", "past/")
        .option("revision", str(first))
        .option("valueFormat", "string")
        .load()
    )
    assert [(r.key, r.value) for r in df.collect()] == [("past/a", "1")]


def test_future_revision_is_refused(spark, kv, opts):
    now = kv.put("future/a", "1").revision
    df = (
        spark.read.format("raftkv")
        .options(**opts)
        .option("prefix", "future/")
        .option("revision", str(now + 1000))
        .load()
    )
    with pytest.raises(Exception, match="above the store's current revision"):
        df.collect()


def test_bad_options_are_refused_clearly(spark, opts):
    with pytest.raises(Exception, match="unknown option.*pagesiz"):
        spark.read.format("raftkv").options(**opts).option("prefix", "x/").option(
            "pageSiz", "5"
        ).load().collect()
    with pytest.raises(Exception, match="give option prefix"):
        spark.read.format("raftkv").options(**opts).load().collect()


# ---------------------------------------------------------------------------------------------
# Writes


def txn_groups(kv, prefix: str) -> dict[int, list]:
    groups: dict[int, list] = {}
    for k in kv.range(prefix, prefix=True).kvs:
        groups.setdefault(k.mod_revision, []).append(k)
    return groups


def test_write_applies_each_row_once_under_task_retries_within_txn_limits(spark, kv, opts):
    rows = [(f"retry/{i:05d}", f"v{i}".encode()) for i in range(400)]
    df = spark.createDataFrame(rows, "key string, value binary").repartition(4)
    sizes = [len(p) for p in df.rdd.glom().collect()]
    before = kv.range("retry/", prefix=True, limit=1).revision
    (
        df.write.format("raftkv")
        .options(**opts)
        .mode("append")
        .option("maxTxnOps", "12")
        .option("testFailAfterTxns", "2")
        .save()
    )
    after = kv.range("retry/", prefix=True, limit=1).revision
    stored = load_prefix(kv, "retry/")
    assert {k: v[0] for k, v in stored.items()} == {k: v for k, v in rows}
    # Applied once: every key has version 1 although every task's attempt 0 wrote 2 chunks.
    assert {v[2] for v in stored.values()} == {1}
    groups = txn_groups(kv, "retry/")
    assert max(len(g) for g in groups.values()) <= 11  # maxTxnOps - 1 (the marker)
    expected_txns = sum(math.ceil(n / 11) for n in sizes)
    assert len(groups) == expected_txns
    # One revision per applied chunk txn, plus the job commit's marker delete; the retried
    # chunks found their markers and changed nothing.
    assert after - before == expected_txns + 1
    assert no_markers(kv)


def greedy_chunks(rows, max_puts, budget):
    """The chunking the data source promises: rows sorted by key, cut greedily at the op or
    byte limit (one op and 1 KiB kept for the marker and the compares)."""
    out, cur, size = [], [], 0
    for key, value in sorted(rows):
        need = len(key) + len(value) + 16
        if cur and (len(cur) >= max_puts or size + need > budget):
            out.append(cur)
            cur, size = [], 0
        cur.append(key)
        size += need
    return out + ([cur] if cur else [])


def test_write_respects_the_byte_limit_and_default_op_limit(spark, kv, opts):
    small = [(f"lim/s{i:05d}", b"x") for i in range(600)]
    big = [(f"lim/b{i:03d}", bytes([i % 250]) * (90 * 1024)) for i in range(40)]
    df = spark.createDataFrame(small + big, "key string, value binary").coalesce(1)
    df.write.format("raftkv").options(**opts).mode("append").save()
    groups = txn_groups(kv, "lim/")
    assert sum(len(g) for g in groups.values()) == 640
    assert max(len(g) for g in groups.values()) <= 127
    assert (
        max(sum(len(k.key) + len(k.value) + 16 for k in g) for g in groups.values())
        <= DEFAULT_MAX_TXN_BYTES
    )
    assert len(groups) == len(greedy_chunks(small + big, 127, DEFAULT_MAX_TXN_BYTES - 1024))
    assert no_markers(kv)


def test_write_with_lease_and_string_values(spark, kv, opts):
    lease = kv.lease_grant(60)
    df = spark.createDataFrame(
        [("leased/a", "hello", lease.id)], "key string, value string, lease long"
    )
    df.write.format("raftkv").options(**opts).mode("append").save()
    got = kv.get("leased/a")
    assert (got.value, got.lease) == (b"hello", lease.id)
    kv.lease_revoke(lease.id)
    assert kv.get("leased/a") is None


def test_stale_fencing_token_is_refused_and_nothing_is_applied(spark, kv, opts):
    token = kv.put("locks/table", "holder-1").revision  # create revision = fencing token
    fenced = {**opts, "fenceKey": "locks/table", "fenceToken": str(token)}
    ok = spark.createDataFrame(
        [(f"fenced/{i:03d}", b"1") for i in range(300)], "key string, value binary"
    ).repartition(2)
    ok.write.format("raftkv").options(**fenced).mode("append").save()
    assert kv.range("fenced/", prefix=True, count_only=True).count == 300

    kv.delete("locks/table")  # the lease expired ...
    kv.put("locks/table", "holder-2")  # ... and another holder took the lock
    late = spark.createDataFrame(
        [(f"stale/{i:03d}", b"2") for i in range(300)], "key string, value binary"
    ).repartition(2)
    with pytest.raises(Exception, match="fenced out") as info:
        late.write.format("raftkv").options(**fenced).mode("append").save()
    assert f"fencing token {token}" in str(info.value)
    assert kv.range("stale/", prefix=True, count_only=True).count == 0
    assert no_markers(kv)  # the aborted job's markers were removed


def test_overwrite_and_bad_columns_are_refused(spark, opts):
    df = spark.createDataFrame([("ow/a", b"1")], "key string, value binary")
    with pytest.raises(Exception, match="does not support mode\\('overwrite'\\)"):
        df.write.format("raftkv").options(**opts).mode("overwrite").save()
    bad = spark.createDataFrame([("ow/a", b"1", 3)], "key string, value binary, extra int")
    with pytest.raises(Exception, match="unknown \\['extra'\\]"):
        bad.write.format("raftkv").options(**opts).mode("append").save()
    marker = spark.createDataFrame(
        [(DEFAULT_MARKER_PREFIX + "x", b"1")], "key string, value binary"
    )
    with pytest.raises(Exception, match="under markerPrefix"):
        marker.write.format("raftkv").options(**opts).mode("append").save()


def test_compacted_revision_fails_naming_the_compact_revision(spark, kv, opts):
    old = kv.put("compacted/a", "1").revision
    kv.put("compacted/a", "2")
    compact_at = kv.put("compacted/b", "3").revision
    kv.compact(compact_at)
    df = (
        spark.read.format("raftkv")
        .options(**opts)
        .option("prefix", "compacted/")
        .option("revision", str(old))
        .load()
    )
    with pytest.raises(
        Exception, match=f"revision {old} has been compacted \\(compact revision {compact_at}"
    ):
        df.collect()
