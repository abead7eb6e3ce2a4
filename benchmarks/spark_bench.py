"""Numbers for the raftkv data source: batch read and write rows/s through Spark against the
same work with the raw client in one process, and the changefeed's end-to-end lag.

Starts its own raftkv cluster (three real ``raftkv serve`` processes on loopback, or one with
``--nodes 1``) and one local SparkSession, then prints one table::

    .venv/bin/python benchmarks/spark_bench.py [--rows 20000] [--nodes 3] [--value-size 100]

- read: ``spark.read.format("raftkv")`` of a prefix of ``--rows`` keys (``numPartitions`` 2,
  ``pageSize`` 1000), counted with ``collect()``; raw: the same pages with ``Client.range``.
- write: ``df.write.format("raftkv").mode("append")`` of ``--rows`` rows in 2 partitions
  (txns of 127 puts + marker); raw: the same 127-put txns sent one after another by one
  ``Client`` (no markers).
- changefeed lag: a streaming query (trigger 100 ms) from the changefeed into a ``foreach``
  writer that records when each row arrived; a put's lag is arrival time - put time
  (``--lag-events`` puts, one every 50 ms). p50/p99 in ms.
- txn profile: where the time of one 128-op txn goes, client side (encode, HTTP round trip)
  vs the server (``--profile-server`` prints cProfile of a one-node in-process server).

Not a timed test: the machine's load changes the numbers; compare rows of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvserver.client import Client, Op, Txn  # noqa: E402
from kvserver.localcluster.launcher import LocalCluster  # noqa: E402


def wait_healthy(client: Client, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            client.put("bench/ping", "1")
            return
        except Exception:  # noqa: BLE001 - waiting for an election
            time.sleep(0.2)
    raise SystemExit("the cluster did not become healthy")


def spark_session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("raftkv-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from kvserver.spark import register

    register(spark)
    return spark


def raw_write(client: Client, prefix: str, rows: int, value: bytes) -> float:
    t0 = time.perf_counter()
    keys = [f"{prefix}{i:08d}" for i in range(rows)]
    for i in range(0, rows, 127):
        client.txn(Txn().then(*(Op.put(k, value) for k in keys[i : i + 127])))
    return rows / (time.perf_counter() - t0)


def marked_write(client: Client, opts: dict, prefix: str, rows: int, value: bytes) -> float:
    """The data source's task path without Spark: sorted chunks, marker compare + put."""
    from kvserver.spark.source import chunks
    from kvserver.spark.source.options import parse

    o = parse(opts, need_range=False)
    data = [chunks.Row(f"{prefix}{i:08d}".encode(), value, 0) for i in range(rows)]
    t0 = time.perf_counter()
    chunks.write_chunks(client, o, data, "bench/marked", 0, None)
    return rows / (time.perf_counter() - t0)


def raw_read(client: Client, prefix: str, rows: int) -> float:
    t0 = time.perf_counter()
    res = client.range(prefix, prefix=True, limit=1, keys_only=True)
    rev, start, end, n = res.revision, prefix.encode(), None, 0
    from kvserver.kvpb.kv import prefix_range_end

    end = prefix_range_end(prefix.encode())
    while True:
        page = client.range(start, end, revision=rev, limit=1000)
        n += len(page.kvs)
        if not page.more:
            break
        start = page.kvs[-1].key + b"\0"
    assert n == rows, (n, rows)
    return rows / (time.perf_counter() - t0)


def spark_write(spark, opts, prefix: str, rows: int, value: bytes) -> float:
    df = (
        spark.createDataFrame(
            [(f"{prefix}{i:08d}", value) for i in range(rows)], "key string, value binary"
        )
        .repartition(2)
        .cache()
    )
    df.count()
    t0 = time.perf_counter()
    df.write.format("raftkv").options(**opts).mode("append").save()
    return rows / (time.perf_counter() - t0)


def spark_read(spark, opts, prefix: str, rows: int) -> float:
    t0 = time.perf_counter()
    got = (
        spark.read.format("raftkv")
        .options(**opts)
        .option("prefix", prefix)
        .option("numPartitions", "2")
        .load()
        .collect()
    )
    assert len(got) == rows, (len(got), rows)
    return rows / (time.perf_counter() - t0)


def changefeed_lag(spark, opts, client: Client, events: int) -> tuple[float, float]:
    arrived: dict[str, float] = {}
    put_at: dict[str, float] = {}
    lock = threading.Lock()

    # foreachBatch runs in the driver process, so the arrival times are on the same clock.
    def record(batch_df, batch_id):
        rows = batch_df.select("key").collect()
        now = time.time()
        with lock:
            for r in rows:
                arrived.setdefault(r.key, now)

    first = client.put("lag-start", "x").revision + 1  # not "latest": resolved when asked
    feed = (
        spark.readStream.format("raftkv")
        .options(**opts)
        .option("changefeed", "true")
        .option("prefix", "lag/")
        .option("startingRevision", str(first))
        .load()
    )
    query = (
        feed.writeStream.foreachBatch(record)
        .option("checkpointLocation", tempfile.mkdtemp())
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        while query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.2)  # the query has run its first (empty) batch
        for i in range(events):
            key = f"lag/{i:06d}"
            put_at[key] = time.time()
            client.put(key, "x")
            time.sleep(0.05)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(arrived) < events:
            if query.exception() is not None:
                raise SystemExit(f"changefeed query failed: {query.exception()}")
            time.sleep(0.2)
    finally:
        query.stop()
    lags = sorted((arrived[k] - put_at[k]) * 1000 for k in put_at if k in arrived)
    if len(lags) < events:
        raise SystemExit(f"only {len(lags)} of {events} events arrived within 120 s")
    p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
    return statistics.median(lags), p99


def txn_profile(client: Client, value: bytes, n: int = 30) -> dict[str, float]:
    """Per 128-op txn: client-side build+encode time, and the whole call."""
    import json

    from kvserver.client import codec

    keys = [f"prof/{i:08d}" for i in range(127 * n)]
    t0 = time.perf_counter()
    for j in range(n):
        req = Txn().then(*(Op.put(k, value) for k in keys[j * 127 : (j + 1) * 127])).to_request()
        json.dumps(codec.encode_txn(req), separators=(",", ":")).encode()
    encode_ms = (time.perf_counter() - t0) / n * 1000
    t0 = time.perf_counter()
    for j in range(n):
        client.txn(Txn().then(*(Op.put(k, value) for k in keys[j * 127 : (j + 1) * 127])))
    call_ms = (time.perf_counter() - t0) / n * 1000
    return {"client build+encode ms/txn": encode_ms, "whole txn call ms/txn": call_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--lag-events", type=int, default=100)
    args = ap.parse_args()
    value = b"v" * args.value_size
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster(
            d,
            size=args.nodes,
            extra_args=["--heartbeat-interval", "50", "--election-timeout", "500"],
        )
        cluster.start()
        try:
            with Client(cluster.endpoints, timeout_s=60) as client:
                wait_healthy(client)
                opts = {"endpoints": ",".join(cluster.endpoints), "timeout": "60"}
                spark = spark_session()
                results = []
                results.append(
                    (
                        "batch write",
                        "raw client, 127-put txns",
                        raw_write(client, "raw/", args.rows, value),
                    )
                )
                results.append(
                    (
                        "batch write",
                        "data source txn path, no Spark",
                        marked_write(client, opts, "mk/", args.rows, value),
                    )
                )
                results.append(
                    (
                        "batch write",
                        "spark data source (2 tasks)",
                        spark_write(spark, opts, "sp/", args.rows, value),
                    )
                )
                results.append(
                    ("batch read", "raw client, pages of 1000", raw_read(client, "raw/", args.rows))
                )
                results.append(
                    (
                        "batch read",
                        "spark data source (2 partitions)",
                        spark_read(spark, opts, "sp/", args.rows),
                    )
                )
                p50, p99 = changefeed_lag(spark, opts, client, args.lag_events)
                prof = txn_profile(client, value)
                spark.stop()
        finally:
            cluster.stop()
    print(
        f"\nraftkv data source, {args.nodes} node(s), {args.rows} rows of "
        f"{args.value_size}-byte values, {os.cpu_count()} cores\n"
    )
    print(f"| {'what':<12} | {'how':<34} | {'rows/s':>10} |")
    print(f"|{'-' * 14}|{'-' * 36}|{'-' * 12}|")
    for what, how, rate in results:
        print(f"| {what:<12} | {how:<34} | {rate:>10,.0f} |")
    print(
        f"\nchangefeed lag (put -> row in a micro-batch, trigger 100 ms, "
        f"{args.lag_events} puts): p50 {p50:.0f} ms, p99 {p99:.0f} ms"
    )
    for k, v in prof.items():
        print(f"{k}: {v:.1f}")


if __name__ == "__main__":
    main()
