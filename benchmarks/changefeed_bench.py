"""Numbers for the raftkv changefeed: steady throughput and lag while writers run, and the
cold catch-up rate from the archive (file:// and S3).

Starts one ``raftkv serve`` on loopback (``--nodes 3`` for three) archiving to a
``file://`` directory, and one warm local SparkSession (``local[2]``), then prints a table::

    .venv/bin/python benchmarks/changefeed_bench.py [--seconds 20] [--rate 25000] [--writers 3]

- steady: ``--writers`` processes write txns of ``--txn-keys`` puts of ``--value-size``-byte
  values under ``feed/`` (``--writer lean``, the default: pre-encoded over plain HTTP, a
  load generator's cost; ``client``: through ``kvserver.client``), paced to ``--rate``
  events/s in total, for ``--seconds``. A streaming query (``numPartitions``
  ``--partitions``, default 2; batches back to back, or every ``--trigger-ms``) reads the
  changefeed of ``feed/`` into ``foreachBatch``, which collects each batch's
  ``mod_revision`` column in the driver (as Arrow). The query is warm before the writers
  start: ``WARM_EVENTS`` events went through it, which started Spark's Python workers.
  Throughput: events delivered during the writing window / its length, after ``WARMUP_S``.
  Lag of an event: when its batch reached ``foreachBatch`` - when the writer's txn was
  acknowledged (both on this machine's clock); p50 and p99 over the events acknowledged
  after ``WARMUP_S``, and p99 over all of them.
- cold catch-up: the store is compacted at its last revision, then a stream from
  ``earliest`` with ``archiveUrl`` (``Trigger.AvailableNow``, ``noop`` sink) replays the whole
  history from the archive (``coldPartitions`` ``--cold-partitions``: time slices cut at
  the archived snapshots, one every ``--snapshot-count`` entries); rate = events / the
  query's wall time (start to end, Spark's planning included). Once from the ``file://`` archive, once from a copy of it in S3
  (moto's server on 127.0.0.1; skipped when moto is missing).
- ``--spark-floor``: no raftkv at all. Spark's own cost per micro-batch: a source whose
  offsets advance with the clock at ``--rate`` rows/s and whose partitions carry a ready
  Arrow batch (as the hot tier's do), into the same ``foreachBatch``; the cycle, its phases
  and the driver JVM's CPU per batch. What is left of two cores for the member, the writers
  and the source follows from it.
- ``--only-cold``: no steady phase. One small changefeed query of ``bench/`` from the store
  starts Spark's Python workers (the steady phase does that in a full run), then
  ``--writers`` processes write ``--cold-events`` events as fast as they go (txns of
  ``--txn-keys`` puts), and the cold catch-up reads them all.

- ``--endpoints URLS``: the steady phase only, against those members instead of starting
  any; under spark-submit the session is spark-submit's (its master and addresses) instead
  of ``local[2]``: ``deploy/up.sh spark-submit benchmarks/changefeed_bench.py --endpoints
  http://raftkv1:2379,http://raftkv2:2379,http://raftkv3:2379`` measures it with the
  executors in the Spark workers' containers (docs/spark.md, "Running on a Spark cluster").

Not a timed test: the machine's load changes the numbers; compare rows of one run.
"""

from __future__ import annotations

import argparse
import datetime
import math
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvserver.client import Client, Op, Txn  # noqa: E402
from kvserver.localcluster.launcher import LocalCluster, free_ports  # noqa: E402


def wait_healthy(client: Client, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            client.put("bench/ping", "1")
            return
        except Exception:  # noqa: BLE001 - waiting for an election
            time.sleep(0.2)
    raise SystemExit("the cluster did not become healthy")


def spark_session(extra_conf: list[str] | None = None):
    """The warm local session (under spark-submit: spark-submit's); ``extra_conf`` holds
    ``key=value`` settings (``--spark-conf``)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("raftkv-changefeed-bench")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        builder = (
            builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    builder = (
        builder.config("spark.sql.shuffle.partitions", "2")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
    )
    for setting in extra_conf or ():
        key, sep, value = setting.partition("=")
        if not sep:
            raise SystemExit(f"--spark-conf {setting!r}: expected key=value")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from kvserver.spark import register

    register(spark)
    return spark


def paced(rate: float, txn_keys: int, seconds: float, events: int) -> Iterator[int]:
    """The numbers of a writer's txns, each when it is due: ``rate`` events/s (unpaced when
    0), for ``seconds`` or, with ``events``, until that many were written."""
    t0 = time.time()
    n = 0
    while True:
        now = time.time()
        if events and n * txn_keys >= events:
            return
        if not events and now - t0 >= seconds:
            return
        due = t0 + n * txn_keys / rate if rate else now
        if due > now:
            time.sleep(due - now)
        yield n
        n += 1


def feed_txn(w: int, n: int, txn_keys: int, value: bytes) -> Txn:
    """Writer ``w``'s ``n``-th txn: ``txn_keys`` puts of ``value`` from key base
    ``n * txn_keys % 50,000`` under ``feed/w<w>/``."""
    base = (n * txn_keys) % 50_000
    return Txn().then(*(Op.put(f"feed/w{w}/{base + i:06d}", value) for i in range(txn_keys)))


def writer(
    endpoints,
    w: int,
    rate: float,
    txn_keys: int,
    value_size: int,
    seconds: float,
    q,
    events: int = 0,
):
    """One writer process: paced txns (``paced``) through ``kvserver.client``; sends back
    (revision, ack time, keys) per txn."""
    value = os.urandom(value_size // 2).hex().encode()[:value_size]
    acks = []
    with Client(endpoints, timeout_s=30) as c:
        for n in paced(rate, txn_keys, seconds, events):
            res = c.txn(feed_txn(w, n, txn_keys, value))
            acks.append((res.header.revision, time.time(), txn_keys))
    q.put(acks)


def lean_writer(
    endpoints,
    w: int,
    rate: float,
    txn_keys: int,
    value_size: int,
    seconds: float,
    q,
    events: int = 0,
):
    """``writer`` with a load generator's cost instead of a client library's: the same txns
    (the same keys and values, encoded by ``kvserver.client.codec`` once, before the clock
    starts), posted over one keep-alive HTTP/1.1 connection to the first endpoint (a follower
    forwards them to the leader). The member does the same work per txn; the writer process
    spends a fraction of the CPU (``writer`` goes through the sync client's event-loop
    thread and encodes every op again), which the two cores then leave to the member and
    Spark."""
    import http.client
    import json
    from urllib.parse import urlsplit

    from kvserver.client import codec

    value = os.urandom(value_size // 2).hex().encode()[:value_size]
    period = 50_000 // math.gcd(50_000, txn_keys)  # feed_txn repeats after this many
    bodies = [
        json.dumps(codec.encode_txn(feed_txn(w, n, txn_keys, value).to_request())).encode()
        for n in range(period)
    ]
    url = urlsplit(endpoints[0])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    acks = []
    for n in paced(rate, txn_keys, seconds, events):
        conn.request("POST", "/v3/kv/txn", bodies[n % period], headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise SystemExit(f"writer {w}: txn answered {resp.status}: {data[:200]!r}")
        acks.append((int(json.loads(data)["header"]["revision"]), time.time(), txn_keys))
    conn.close()
    q.put(acks)


WRITERS = {"lean": lean_writer, "client": writer}
# A snapshot every 500 entries gives the cold catch-up's archive many time slices; it also
# makes the member snapshot every few seconds under the steady load, which a steady-only run
# (--no-cold) leaves to the member's default.
COLD_SNAPSHOT_COUNT = 500
WARMUP_S = 3.0  # steady state is after it
WARM_EVENTS = 10_000  # through the feed before the writers start: Spark's Python workers


def _epoch(iso: str) -> float:
    """A progress report's ``timestamp`` (ISO 8601, UTC) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def steady(spark, endpoints, args) -> dict:
    arrived: list[tuple[float, list[int]]] = []
    with Client(endpoints) as c:
        first = c.put("bench/feed-start", "x").revision + 1
    feed = (
        spark.readStream.format("raftkv")
        .option("endpoints", ",".join(endpoints))
        .option("changefeed", "true")
        .option("prefix", "feed/")
        .option("startingRevision", str(first))
        .option("numPartitions", str(args.partitions))
        .load()
    )

    def record(df, batch_id):
        revs = df.select("mod_revision").toArrow().column(0).to_pylist()
        arrived.append((time.time(), revs))

    writer_ = feed.writeStream.foreachBatch(record)
    if args.trigger_ms:
        writer_ = writer_.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    query = writer_.start()
    try:
        # Warm: WARM_EVENTS events through the feed before the writers start. Its first
        # batches start Spark's Python workers (seconds on this machine), and a batch of
        # more than 2 * 2,000 events makes the second one.
        with Client(endpoints) as c:
            for i in range(0, WARM_EVENTS, 100):
                ops = (Op.put(f"feed/warm/{i + j:06d}", "w") for j in range(100))
                warm_last = c.txn(Txn().then(*ops)).header.revision
        deadline = time.monotonic() + 120
        while not any(revs and max(revs) >= warm_last for _, revs in arrived):
            if time.monotonic() > deadline:
                raise SystemExit("the warm-up events did not come through the feed in 120 s")
            time.sleep(0.1)
        arrived.clear()
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        per = args.rate / args.writers
        procs = [
            ctx.Process(
                target=WRITERS[args.writer],
                args=(endpoints, w, per, args.txn_keys, args.value_size, args.seconds, q),
            )
            for w in range(args.writers)
        ]
        t_start = time.time()
        for p in procs:
            p.start()
        acks = [a for _ in procs for a in q.get(timeout=args.seconds + 120)]
        for p in procs:
            p.join(30)
        t_end = time.time()
        written = sum(k for _, _, k in acks)
        last_rev = max(r for r, _, _ in acks)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(revs and max(revs) >= last_rev for _, revs in arrived):
                break
            time.sleep(0.1)
    finally:
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        query.stop()
    phases: dict[str, float] = {}
    for p in progress:
        for k, v in p["durationMs"].items():
            phases[k] = phases.get(k, 0.0) + v / len(progress)
    acked = {r: t for r, t, _ in acks}
    lags, steady_lags = [], []
    in_window = 0
    for t, revs in arrived:
        for r in revs:
            if r in acked:
                lags.append(t - acked[r])
                if acked[r] >= t_start + WARMUP_S:
                    steady_lags.append(t - acked[r])
        if t_start + WARMUP_S <= t <= t_end:
            in_window += len(revs)
    delivered = sum(len(revs) for _, revs in arrived)
    return {
        "written": written,
        "write_rate": written / (t_end - t_start),
        "delivered": delivered,
        "steady_rate": in_window / max(t_end - t_start - WARMUP_S, 1e-9),
        "lag_p50_s": pct(steady_lags, 0.5),
        "lag_p99_s": pct(steady_lags, 0.99),
        "lag_all_p99_s": pct(lags, 0.99),
        "batches": len(arrived),
        "phases_ms": phases,
        "batch_ms": [
            p["durationMs"].get("triggerExecution", 0)
            for p in progress
            if _epoch(p["timestamp"]) >= t_start + WARMUP_S
        ],
    }


def spark_floor(spark, args) -> dict:
    """``--spark-floor``: Spark's own cost per micro-batch, without raftkv. A Python streaming
    source whose offsets advance at ``--rate`` rows/s with the clock and whose partitions
    carry a ready Arrow batch of the changefeed's columns (as the hot tier's do), read into
    the same ``foreachBatch`` as the steady phase, batches back to back (or every
    ``--trigger-ms``), for ``--seconds``.
    Reports the cycle, its phases, and the JVM's CPU per batch (``/proc`` of the driver JVM,
    over the second half)."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    rate = args.rate
    columns = ["type", "key", "value", "create_revision", "mod_revision", "version", "lease"]
    value = os.urandom(args.value_size // 2).hex().encode()[: args.value_size]

    class Carried(InputPartition):
        def __init__(self, ipc: bytes) -> None:
            self.ipc = ipc

    class ClockReader(DataSourceStreamReader):
        def __init__(self) -> None:
            self.t0 = time.time()

        def initialOffset(self) -> dict:
            return {"revision": 0}

        def latestOffset(self, start: dict, limit) -> dict:
            return {"revision": int((time.time() - self.t0) * rate)}  # everything, no limit

        def partitions(self, start: dict, end: dict) -> list:
            s, n = start["revision"], end["revision"] - start["revision"]
            revs = pa.array(range(s + 1, s + n + 1), pa.int64())
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array(["PUT"] * n),
                    pa.array([f"feed/w0/{i % 50_000:06d}" for i in range(n)]),
                    pa.array([value] * n, pa.binary()),
                    revs,
                    revs,
                    pa.array([1] * n, pa.int64()),
                    pa.array([0] * n, pa.int64()),
                ],
                names=columns,
            )
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as w:
                w.write_batch(batch)
            return [Carried(sink.getvalue().to_pybytes())]

        def read(self, partition):
            yield from pa.ipc.open_stream(partition.ipc)

    class ClockSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "raftkv_bench_clock"

        def schema(self) -> str:
            return (
                "type string, key string, value binary, create_revision long, "
                "mod_revision long, version long, lease long"
            )

        def streamReader(self, schema):
            return ClockReader()

    spark.dataSource.register(ClockSource)
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())

    def jvm_cpu_s() -> float:
        with open(f"/proc/{jvm_pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def record(df, batch_id):
        df.select("mod_revision").toArrow()

    writer_ = spark.readStream.format("raftkv_bench_clock").load().writeStream.foreachBatch(record)
    if args.trigger_ms:
        writer_ = writer_.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    query = writer_.start()
    try:
        time.sleep(args.seconds / 2)  # the first batches start the Python workers
        n0, c0, t0 = len(query.recentProgress), jvm_cpu_s(), time.time()
        time.sleep(args.seconds / 2)
        n1, c1, t1 = len(query.recentProgress), jvm_cpu_s(), time.time()
        progress = [p for p in query.recentProgress[n0:n1] if p["numInputRows"]]
    finally:
        query.stop()
    phases: dict[str, float] = {}
    for p in progress:
        for k, v in p["durationMs"].items():
            phases[k] = phases.get(k, 0.0) + v / max(1, len(progress))
    return {
        "batches": n1 - n0,
        "rows_per_batch": sum(p["numInputRows"] for p in progress) / max(1, len(progress)),
        "jvm_cores": (c1 - c0) / (t1 - t0),
        "jvm_ms_per_batch": 1000 * (c1 - c0) / max(1, n1 - n0),
        "phases_ms": phases,
    }


def fill(endpoints, args) -> int:
    """``--only-cold``: ``--cold-events`` events written by ``--writers`` unpaced processes
    (txns of ``--txn-keys`` puts, the steady phase's keys); the events written."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    per = -(-args.cold_events // args.writers)
    procs = [
        ctx.Process(
            target=WRITERS[args.writer],
            args=(endpoints, w, 0, args.txn_keys, args.value_size, 0, q, per),
        )
        for w in range(args.writers)
    ]
    for p in procs:
        p.start()
    acks = [a for _ in procs for a in q.get(timeout=1800)]
    for p in procs:
        p.join(30)
    return sum(k for _, _, k in acks)


def warm_feed(spark, endpoints) -> None:
    """``--only-cold``: one small changefeed query from the store (the steady phase's part
    in a full run), so that the measured catch-up finds Spark's Python workers started."""
    ckpt = tempfile.mkdtemp(prefix="raftkv-cf-bench-")
    query = (
        spark.readStream.format("raftkv")
        .option("endpoints", ",".join(endpoints))
        .option("changefeed", "true")
        .option("prefix", "bench/")
        .option("startingRevision", "1")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(300)
    finally:
        query.stop()
        shutil.rmtree(ckpt, ignore_errors=True)


def cold(spark, endpoints, archive: str, options: str = "", partitions: int = 1) -> dict:
    t0 = time.time()
    reader = (
        spark.readStream.format("raftkv")
        .option("endpoints", ",".join(endpoints))
        .option("changefeed", "true")
        .option("prefix", "feed/")
        .option("startingRevision", "earliest")
        .option("archiveUrl", archive)
        .option("coldPartitions", str(partitions))
    )
    if options:
        reader = reader.option("archiveOptions", options)
    ckpt = tempfile.mkdtemp(prefix="raftkv-cf-bench-")
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(1800)
        if query.exception() is not None:
            raise SystemExit(f"cold catch-up failed: {query.exception()}")
        events = sum(p["numInputRows"] for p in query.recentProgress)
        batches = sum(1 for p in query.recentProgress if p["numInputRows"])
        phases: dict[str, float] = {}
        for p in query.recentProgress:
            for k, v in p["durationMs"].items():
                phases[k] = phases.get(k, 0) + v
    finally:
        query.stop()
        shutil.rmtree(ckpt, ignore_errors=True)
    elapsed = time.time() - t0
    return {
        "events": events,
        "seconds": elapsed,
        "rate": events / elapsed,
        "batches": batches,
        "phases_ms": phases,
    }


def wait_archive(archive: str, endpoints) -> None:
    from kvserver.spark.source.cold_history import ArchiveView

    with Client(endpoints) as c:
        index = max(s.status.raft_index for s in c.statuses() if s.status is not None)
    deadline = time.monotonic() + 120
    while not ArchiveView.load(archive, ()).reaches(index):
        if time.monotonic() > deadline:
            raise SystemExit("the archive did not catch up within 120 s")
        time.sleep(0.2)


def moto(tmp: str):
    try:
        import moto  # noqa: F401
        import s3fs
    except ImportError:
        return None, None
    port = free_ports(1)[0]
    log = open(os.path.join(tmp, "moto.log"), "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=2).read()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                return None, None
            time.sleep(0.1)
    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", endpoint_url=url, skip_instance_cache=True
    )
    fs.mkdir("cfbench")
    return proc, (fs, url)


def on_cluster(args) -> int:
    """The steady phase against ``args.endpoints`` (``feed/`` and ``bench/`` emptied first)."""
    endpoints = args.endpoints.split(",")
    with Client(endpoints, timeout_s=30) as cl:
        wait_healthy(cl)
        for prefix in ("feed/", "bench/"):
            cl.delete(prefix, prefix=True)
    spark = spark_session(args.spark_conf)
    spark.range(10).count()  # warm the session
    master = spark.sparkContext.master
    s = steady(spark, endpoints, args)
    spark.stop()
    print()
    print(
        f"changefeed, {args.endpoints}, {master}, {args.writers} {args.writer} writers, "
        f"txns of {args.txn_keys} puts of {args.value_size} B, {args.seconds:g} s"
    )
    print(f"{'written (events/s)':44} {s['write_rate']:>14,.0f}")
    print(f"{'changefeed steady (events/s)':44} {s['steady_rate']:>14,.0f}")
    print(f"{'changefeed lag p50 (s)':44} {s['lag_p50_s']:>14.3f}")
    print(f"{'changefeed lag p99 (s)':44} {s['lag_p99_s']:>14.3f}")
    print(f"{'events delivered / written':44} {s['delivered']:>7,} / {s['written']:,}")
    print(f"{'micro-batches':44} {s['batches']:>14,}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rate", type=float, default=25_000, help="events/s written in total")
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--txn-keys", type=int, default=100)
    ap.add_argument("--value-size", type=int, default=256)
    ap.add_argument(
        "--writer",
        choices=sorted(WRITERS),
        default="lean",
        help="lean: pre-encoded txns over plain HTTP (the default); client: kvserver.client",
    )
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument(
        "--endpoints", help="the steady phase against these members (comma-separated) only"
    )
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--no-cold", action="store_true", help="the steady part only")
    ap.add_argument(
        "--trigger-ms", type=int, default=0, help="the steady query's trigger (0: back to back)"
    )
    ap.add_argument("--partitions", type=int, default=2, help="the steady query's numPartitions")
    ap.add_argument(
        "--snapshot-count",
        type=int,
        default=None,
        help="the member's --snapshot-count; default: 500 when the cold catch-up runs (its time "
        "slices are cut at the archived snapshots), else the member's own (100,000, as etcd)",
    )
    ap.add_argument(
        "--cold-partitions", type=int, default=2, help="coldPartitions of the catch-up runs"
    )
    ap.add_argument(
        "--only-cold",
        action="store_true",
        help="skip the steady phase: write --cold-events events unpaced, then catch up",
    )
    ap.add_argument(
        "--cold-events", type=int, default=500_000, help="events written for --only-cold"
    )
    ap.add_argument(
        "--spark-conf",
        action="append",
        metavar="KEY=VALUE",
        help="a Spark setting for the session (repeatable), e.g. to see what moves the floor",
    )
    ap.add_argument(
        "--spark-floor",
        action="store_true",
        help="Spark alone: a source of rows from nothing at --rate, no raftkv (see spark_floor)",
    )
    args = ap.parse_args(argv)

    if args.spark_floor:
        spark = spark_session(args.spark_conf)
        spark.range(10).count()  # warm the session
        f = spark_floor(spark, args)
        spark.stop()
        print()
        print(f"Spark alone, local[2]: rows from nothing at {args.rate:,.0f}/s, {args.seconds:g} s")
        print(f"{'measure':44} {'value':>14}")
        print(f"{'micro-batches (second half)':44} {f['batches']:>14,}")
        print(f"{'rows per batch':44} {f['rows_per_batch']:>14,.0f}")
        print(f"{'JVM CPU, cores':44} {f['jvm_cores']:>14.2f}")
        print(f"{'JVM CPU per batch, ms':44} {f['jvm_ms_per_batch']:>14,.0f}")
        for k, v in sorted(f["phases_ms"].items()):
            print(f"{'  mean ms per batch, ' + k:44} {v:>14,.0f}")
        return 0

    if args.endpoints:
        return on_cluster(args)

    root = tempfile.mkdtemp(prefix="raftkv-cf-bench-")
    archive = f"file://{root}/archive"
    snapshot_count = args.snapshot_count
    if snapshot_count is None and not args.no_cold:
        snapshot_count = COLD_SNAPSHOT_COUNT
    snapshot_args = [] if snapshot_count is None else ["--snapshot-count", str(snapshot_count)]
    c = LocalCluster(
        os.path.join(root, "cluster"),
        size=args.nodes,
        extra_args=[
            "--archive-url",
            archive,
            "--archive-interval",
            "200",
            *snapshot_args,
        ],
    )
    c.start()
    moto_proc = None
    try:
        with Client(c.endpoints, timeout_s=30) as cl:
            wait_healthy(cl)
        spark = spark_session(args.spark_conf)
        spark.range(10).count()  # warm the session
        s = None if args.only_cold else steady(spark, c.endpoints, args)
        written = 0
        if args.only_cold:
            warm_feed(spark, c.endpoints)
            written = fill(c.endpoints, args)
        cold_file = cold_s3 = None
        if not args.no_cold:
            with Client(c.endpoints, timeout_s=60) as cl:
                cl.compact(cl.put("bench/compact-at", "x").revision)
            wait_archive(archive, c.endpoints)
            cold_file = cold(spark, c.endpoints, archive, partitions=args.cold_partitions)
        if not args.no_s3 and not args.no_cold:
            moto_proc, s3 = moto(root)
            if s3 is not None:
                fs, url = s3
                fs.put(f"{root}/archive/", "cfbench/archive/", recursive=True)
                opts = (
                    f"key=testing,secret=testing,endpoint_url={url},"
                    "client_kwargs.region_name=us-east-1"
                )
                cold_s3 = cold(
                    spark, c.endpoints, "s3://cfbench/archive", opts, args.cold_partitions
                )
        spark.stop()
    finally:
        if moto_proc is not None:
            moto_proc.kill()
            moto_proc.wait(10)
        c.stop()
        shutil.rmtree(root, ignore_errors=True)

    print()
    if s is None:
        print(
            f"changefeed, {args.nodes} node(s), local[2], cold only: {written:,} events "
            f"written by {args.writers} writers, txns of {args.txn_keys} puts of "
            f"{args.value_size} B"
        )
        print(f"{'measure':44} {'value':>14}")
    else:
        print(
            f"changefeed, {args.nodes} node(s), local[2], {args.writers} {args.writer} writers, "
            f"txns of {args.txn_keys} puts of {args.value_size} B, {args.seconds:g} s, "
            f"snapshot count {snapshot_count or 'default'}"
        )
        print(f"{'measure':44} {'value':>14}")
        print(f"{'written (events/s)':44} {s['write_rate']:>14,.0f}")
        print(f"{'changefeed steady (events/s)':44} {s['steady_rate']:>14,.0f}")
        print(f"{'changefeed lag p50 (s)':44} {s['lag_p50_s']:>14.3f}")
        print(f"{'changefeed lag p99 (s)':44} {s['lag_p99_s']:>14.3f}")
        print(f"{'changefeed lag p99, warm-up included (s)':44} {s['lag_all_p99_s']:>14.3f}")
        print(f"{'events delivered / written':44} {s['delivered']:>7,} / {s['written']:,}")
        print(f"{'micro-batches':44} {s['batches']:>14,}")
        ms = s["batch_ms"]
        spread = f"{pct(ms, 0.5):,.0f} / {pct(ms, 0.9):,.0f} / {max(ms, default=0):,.0f}"
        print(f"{'  batch ms after the warm-up, p50 / p90 / max':44} {spread:>14}")
        for k, v in sorted(s["phases_ms"].items()):
            print(f"{'  mean ms per batch, ' + k:44} {v:>14,.0f}")
    if cold_file is None:
        return 0
    print(f"{'coldPartitions':44} {args.cold_partitions:>14}")
    print(
        f"{'cold catch-up, file:// (events/s)':44} {cold_file['rate']:>14,.0f}"
        f"   ({cold_file['events']:,} events, {cold_file['batches']} batches, "
        f"{cold_file['seconds']:.1f} s)"
    )
    for k in ("latestOffset", "addBatch", "triggerExecution"):
        v = cold_file["phases_ms"].get(k, 0)
        print(f"{'  file://, ms in ' + k:44} {v:>14,.0f}")
    if cold_s3 is not None:
        print(
            f"{'cold catch-up, S3 via moto (events/s)':44} {cold_s3['rate']:>14,.0f}"
            f"   ({cold_s3['events']:,} events, {cold_s3['batches']} batches, "
            f"{cold_s3['seconds']:.1f} s)"
        )
    else:
        print(f"{'cold catch-up, S3 via moto':44} {'skipped':>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
