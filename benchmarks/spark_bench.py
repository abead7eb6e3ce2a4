"""Numbers for the raftkv data source at scale: batch read and write rows/s through Spark
against the same work with the raw client in one run, planning time, and Spark's cold start
reported apart from the warm numbers.

Starts its own raftkv cluster (``--nodes`` real ``raftkv serve`` processes on loopback, one by
default) and one local SparkSession (``local[2]``), then prints one table::

    .venv/bin/python benchmarks/spark_bench.py                   # 1,000,000 keys of 256 bytes
    .venv/bin/python benchmarks/spark_bench.py --rows 20000 --write-rows 20000

Order of the run, and what each figure is:

1. load: ``--rows`` keys ``raw/<n>`` written by the raw client in txns of 127 puts, one after
   another (the ``raw client`` write rows/s).
2. decode, before Spark starts (its JVM and workers would share the cores): one real page of
   1,000 keys decoded the old way (JSON, a ``KeyValue`` per key, then Arrow arrays) and by
   ``range_arrow``'s decoder, ms per 1,000 keys.
3. cold start: ``SparkSession.builder.getOrCreate()`` + ``register`` (``session start``), then
   the first job of the session, a read of an empty prefix through the data source
   (``first job``: Spark's own start-up of a Python worker plus ours). Reported apart.
4. warm-up: a few small jobs through the data source (reads to the noop sink and writes), so
   that the timed jobs find a warm JVM and reused Python workers.
5. write: ``--write-rows`` rows generated in the JVM (``spark.range``, 2 partitions, cached
   and counted first) written with ``df.write.format("raftkv").mode("append")``: 2 tasks,
   each chunk a txn of 127 puts + its marker. Compared with the raw client of step 1.
6. planning: ``plan()`` of a read of the ``--rows`` keys (what Spark's planner runs), timed
   in this process.
7. read: the raw client pages through the ``--rows`` keys (pages of ``--page-size``) with
   ``range`` (a ``KeyValue`` per key) and with ``range_arrow`` (Arrow columns); Spark reads
   them with ``numPartitions`` 2 into the ``noop`` sink and with ``count()`` — nothing is
   collected to the driver.

On a cluster: ``--endpoints URLS`` runs against those members instead of starting any
(the prefixes ``raw/``, ``sp/``, ``cold/``, ``warm/`` and ``lag/`` are deleted first), and
under spark-submit the session is spark-submit's (its master, e.g. ``spark://...``, and
addresses) instead of ``local[2]``; ``deploy/up.sh spark-submit benchmarks/spark_bench.py
--endpoints http://raftkv1:2379,http://raftkv2:2379,http://raftkv3:2379`` runs it with two
Spark workers in containers (docs/spark.md, "Running on a Spark cluster").

``--reuse-loaded`` (with ``--endpoints``): when ``raw/`` already holds exactly ``--rows`` keys
(a run before this one loaded them), they are kept and step 1 is skipped (its figure is
reported as ``reused``), so a second run against the same members, e.g. local mode after the
cluster run (``benchmarks/spark_cluster.py``), does not load a million keys again.

``--lag-events N`` adds the changefeed's end-to-end lag (a streaming query, trigger 100 ms,
one put every 50 ms). Not a timed test: the machine's load changes the numbers; compare the
rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvserver.client import Client, Op, Txn  # noqa: E402
from kvserver.kvpb.kv import prefix_range_end  # noqa: E402
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


def under_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started our JVM already


def spark_session():
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("raftkv-bench")
    if not under_spark_submit():
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        builder = (
            builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    spark = (
        builder.config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from kvserver.spark import register

    register(spark)
    return spark


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def read_df(spark, opts: dict, prefix: str, partitions: int = 2, **extra: str):
    return (
        spark.read.format("raftkv")
        .options(**opts)
        .option("prefix", prefix)
        .option("numPartitions", str(partitions))
        .options(**extra)
        .load()
    )


def to_noop(df) -> None:
    df.write.format("noop").mode("overwrite").save()


def generated(spark, prefix: str, rows: int, value_size: int):
    df = spark.range(0, rows, 1, 2).selectExpr(
        f"format_string('{prefix}%08d', id) AS key",
        f"cast(repeat('v', {value_size}) AS binary) AS value",
    )
    return df.cache()


def cold_start(opts: dict) -> tuple[float, float, object]:
    t_session, spark = timed(spark_session)
    t_first, _ = timed(lambda: to_noop(read_df(spark, opts, "cold/", 1)))
    return t_session, t_first, spark


def warm_up(spark, opts: dict, client: Client, value_size: int) -> None:
    for i in range(3):
        to_noop(read_df(spark, opts, "warm/", 2, minPartitionKeys="1"))
        df = generated(spark, f"warm/{i}/", 200, value_size)
        df.count()
        df.write.format("raftkv").options(**opts).mode("append").save()
        df.unpersist()
    client.delete("warm/", prefix=True)


def raw_write(client: Client, prefix: str, rows: int, value: bytes) -> float:
    t0 = time.perf_counter()
    for i in range(0, rows, 127):
        keys = [f"{prefix}{j:08d}" for j in range(i, min(i + 127, rows))]
        client.txn(Txn().then(*(Op.put(k, value) for k in keys)))
    return rows / (time.perf_counter() - t0)


def spark_write(spark, opts: dict, prefix: str, rows: int, value_size: int) -> float:
    df = generated(spark, prefix, rows, value_size)
    df.count()
    t0 = time.perf_counter()
    df.write.format("raftkv").options(**opts).mode("append").save()
    rate = rows / (time.perf_counter() - t0)
    df.unpersist()
    return rate


def raw_read(client: Client, prefix: str, rows: int, page: int, arrow: bool) -> float:
    start, end = prefix.encode(), prefix_range_end(prefix.encode())
    t0 = time.perf_counter()
    rev = client.range(start, end, limit=1, keys_only=True).revision
    n = 0
    while True:
        if arrow:
            ans = client.range_arrow(start, end, revision=rev, limit=page)
            n += ans.batch.num_rows
            last = ans.last_key()
        else:
            res = client.range(start, end, revision=rev, limit=page)
            n += len(res.kvs)
            last = res.kvs[-1].key if res.kvs else None
            ans = res
        if not ans.more or last is None:
            break
        start = last + b"\0"
    assert n == rows, (n, rows)
    return rows / (time.perf_counter() - t0)


def planning(opts: dict, prefix: str) -> tuple[float, int]:
    from kvserver.spark.source.batch_read import plan
    from kvserver.spark.source.options import parse

    o = parse({**opts, "prefix": prefix, "numPartitions": "2"})
    t, parts = timed(lambda: plan(o))
    return t, len(parts)  # type: ignore[arg-type]


def spark_read(spark, opts: dict, prefix: str, rows: int) -> tuple[float, float]:
    df = read_df(spark, opts, prefix, 2)
    t_noop, _ = timed(lambda: to_noop(df))
    t_count, n = timed(df.count)
    assert n == rows, (n, rows)
    return rows / t_noop, rows / t_count


def decode_ms(client: Client, prefix: str, rounds: int = 20) -> tuple[float, float]:
    """ms per 1,000 keys: the old decode (KeyValue per key, then Arrow) and the Arrow one."""
    import pyarrow as pa

    from kvserver.client import codec, columnar
    from kvserver.client.txn import range_request

    req = range_request(prefix, prefix=True, limit=1000)
    body = json.dumps(codec.encode_range(req)).encode()
    import urllib.request

    raw = urllib.request.urlopen(
        urllib.request.Request(client.endpoints[0] + "/v3/kv/range", data=body), timeout=30
    ).read()

    def old() -> None:
        kvs = codec.decode_range(json.loads(raw)).kvs
        pa.RecordBatch.from_arrays(
            [
                pa.array([kv.key.decode() for kv in kvs], pa.string()),
                pa.array([kv.value for kv in kvs], pa.binary()),
                *(
                    pa.array([getattr(kv, f) for kv in kvs], pa.int64())
                    for f in ("create_revision", "mod_revision", "version", "lease")
                ),
            ],
            names=list(columnar.COLUMNS),
        )

    def new() -> None:
        columnar.decode_range_arrow(raw)

    out = []
    for fn in (old, new):
        fn()
        best = min(timed(lambda f=fn: [f() for _ in range(rounds)])[0] for _ in range(3))
        out.append(best / rounds * 1000)
    return out[0], out[1]


def changefeed_lag(spark, opts: dict, client: Client, events: int) -> tuple[float, float]:
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


def run(args) -> dict:
    value = b"v" * args.value_size
    out: dict = {"rows": args.rows, "write_rows": args.write_rows, "nodes": args.nodes}
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster(
            d,
            size=args.nodes,
            extra_args=["--heartbeat-interval", "50", "--election-timeout", "500"],
        )
        endpoints = args.endpoints.split(",") if args.endpoints else cluster.endpoints
        if not args.endpoints:
            cluster.start()
        try:
            with Client(endpoints, timeout_s=120) as client:
                wait_healthy(client)
                reuse = (
                    args.endpoints
                    and args.reuse_loaded
                    and client.range("raw/", prefix=True, count_only=True).count == args.rows
                )
                if args.endpoints:  # someone's cluster: start from empty prefixes
                    for prefix in ("sp/", "cold/", "warm/", "lag/", *(() if reuse else ("raw/",))):
                        client.delete(prefix, prefix=True)
                opts = {"endpoints": ",".join(endpoints), "timeout": "120"}
                out["write raw rows/s"] = (
                    None if reuse else raw_write(client, "raw/", args.rows, value)
                )
                # Before any Spark: the JVM and its workers would share the cores.
                out["decode old ms/1000"], out["decode arrow ms/1000"] = decode_ms(client, "raw/")
                t_session, t_first, spark = cold_start(opts)
                out["master"] = spark.sparkContext.master
                out["cold session start s"] = t_session
                out["cold first job s"] = t_first
                warm_up(spark, opts, client, args.value_size)
                out["write spark rows/s"] = spark_write(
                    spark, opts, "sp/", args.write_rows, args.value_size
                )
                t_plan, parts = planning(opts, "raw/")
                out["planning s"] = t_plan
                out["planning partitions"] = parts
                out["read raw rows/s"] = raw_read(client, "raw/", args.rows, args.page_size, False)
                out["read raw arrow rows/s"] = raw_read(
                    client, "raw/", args.rows, args.page_size, True
                )
                noop, count = spark_read(spark, opts, "raw/", args.rows)
                out["read spark noop rows/s"] = noop
                out["read spark count rows/s"] = count
                if args.lag_events:
                    out["lag p50 ms"], out["lag p99 ms"] = changefeed_lag(
                        spark, opts, client, args.lag_events
                    )
                spark.stop()
        finally:
            if not args.endpoints:
                cluster.stop()
    return out


def report(args, r: dict) -> str:
    where = args.endpoints or f"{args.nodes} node(s)"
    master = r.get("master", "local[2]")
    lines = [
        f"raftkv data source: {where}, {r['rows']:,} keys of {args.value_size}-byte "
        f"values ({r['write_rows']:,} written through Spark), {master}, {os.cpu_count()} cores",
        "",
        f"| {'what':<40} | {'figure':>14} |",
        f"|{'-' * 42}|{'-' * 16}|",
    ]
    raw = r["write raw rows/s"]
    ratio = f"{r['write spark rows/s'] / raw:.2f}" if raw else "n/a"
    rows = [
        ("cold: session start (s)", f"{r['cold session start s']:.2f}"),
        ("cold: first job, empty read (s)", f"{r['cold first job s']:.2f}"),
        ("write: raw client, 127-put txns (rows/s)", f"{raw:,.0f}" if raw else "reused"),
        ("write: Spark, 2 tasks (rows/s)", f"{r['write spark rows/s']:,.0f}"),
        ("write: Spark / raw client", ratio),
        (f"planning {r['rows']:,} keys (s)", f"{r['planning s']:.3f}"),
        ("read: raw client, range (rows/s)", f"{r['read raw rows/s']:,.0f}"),
        ("read: raw client, range_arrow (rows/s)", f"{r['read raw arrow rows/s']:,.0f}"),
        ("read: Spark, 2 partitions, noop (rows/s)", f"{r['read spark noop rows/s']:,.0f}"),
        ("read: Spark, 2 partitions, count (rows/s)", f"{r['read spark count rows/s']:,.0f}"),
        ("decode 1,000 keys: KeyValues (ms)", f"{r['decode old ms/1000']:.2f}"),
        ("decode 1,000 keys: Arrow columns (ms)", f"{r['decode arrow ms/1000']:.2f}"),
    ]
    if "lag p50 ms" in r:
        rows.append(
            ("changefeed lag p50 / p99 (ms)", f"{r['lag p50 ms']:.0f} / {r['lag p99 ms']:.0f}")
        )
    lines += [f"| {what:<40} | {fig:>14} |" for what, fig in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="keys read (and loaded)")
    ap.add_argument("--write-rows", type=int, default=200_000, help="rows written via Spark")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--endpoints", help="use these members (comma-separated) instead of starting")
    ap.add_argument("--value-size", type=int, default=256)
    ap.add_argument("--page-size", type=int, default=1000)
    ap.add_argument("--lag-events", type=int, default=0)
    ap.add_argument(
        "--reuse-loaded",
        action="store_true",
        help="with --endpoints: keep raw/ when it holds --rows keys already (no load)",
    )
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    r = run(args)
    print("\n" + report(args, r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return r


if __name__ == "__main__":
    main()
