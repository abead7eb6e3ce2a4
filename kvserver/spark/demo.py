"""The example pipeline: generated events -> daily aggregates as Parquet, each day committed
exactly once through a ``CommitLog`` under a ``FencedLock``; run state kept in raftkv.

Run it (a three-node raftkv must be reachable; ``make spark-demo`` starts one)::

    python -m kvserver.spark.demo --endpoints http://127.0.0.1:2379 --out spark-demo-out
    python -m kvserver.spark.demo --endpoints http://127.0.0.1:2379 --status

What it does, for table ``T`` (``--table``, default ``daily_sales``):

1. takes the lock ``demo/T`` (``FencedLock``; a second run of the same table waits for it);
2. checks the run's parameters against those stored at the first run (``<state>/config``):
   days, start date, events per day and seed must match, or the run refuses (a table is one
   deterministic computation);
3. recovers: every committed day whose output directory is missing is finished by renaming
   its staging directory (after checking it holds exactly the committed files);
4. for each day not yet committed, in order (version N of the commit log is day N):
   generates the day's events (a pure function of the seed and the day), aggregates them per
   category (events, distinct users, revenue in cents: integers, so every run computes the
   same numbers), writes Parquet into ``OUT/_staging/day=D.t<token>`` (any other staging
   directory of that day is uncommitted debris and is removed first) and the same rows into
   raftkv (the data source's batch write, fenced by the lock: ``demo/T/rows/D/<category>``,
   the row as JSON), then **commits**: one
   txn puts version N (payload: day, directory, files with sizes, rows, token) and the
   progress record, only if version N is absent, N-1 is present and the lock is still held;
   then renames the staging directory to ``OUT/day=D``;
5. reads the table back from raftkv (the data source's batch read, at one revision) and
   checks it holds exactly the rows the commit log counts;
6. streams the changefeed of ``demo/T/rows/`` (from the earliest revision, through the
   archive with ``--archive-url`` when the store has compacted that history) into
   ``demo/T/feed/`` with the data source's exactly-once sink, fenced too, with
   ``Trigger.AvailableNow`` and its checkpoint in ``OUT/_checkpoints/feed``: each run
   continues the feed where the last one left it. An event of row ``D/C`` at revision R
   becomes ``feed/D/C@R`` (R zero-padded), so every PUT reaches the feed exactly once when
   each row key has as many feed keys as versions, each feed key at version 1;
7. records the final state (``done`` or ``stopped``), fenced like every write, and releases
   the lock.

The commit-log entry is the commit point. A crash before it leaves only a staging directory
(removed and rewritten by the next run); a crash after it leaves a committed day whose rename
the next run finishes. So ``OUT/day=D`` exists only for committed days, each day is committed
once (put-if-absent), and a second run continues where the first stopped. A run that lost its
lock (paused past its lease, partitioned) is refused at its next commit and stops with
``FencedOutError``; its staging output is never renamed.

Keys in raftkv: ``__raftkv/locks/demo/T/…`` (the lock queue), ``__raftkv/commitlog/T/v/…``
(the commit log), ``demo/T/state`` (status, owner, token, days done), ``demo/T/config``,
``demo/T/rows/…`` and ``demo/T/feed/…``.

On a cluster (``deploy/up.sh spark-demo``: ``spark-submit --master spark://…``) the master
comes from spark-submit, and ``OUT`` must be a directory every executor and the driver share
(the tasks write the Parquet files, the driver renames them).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kvserver.client import Client, Cmp, Op, Txn
from kvserver.client.errors import ClientError
from kvserver.spark import register
from kvserver.spark.commitlog import CommitConflictError, CommitEntry, CommitLog
from kvserver.spark.fencing import Fence, FencedOutError
from kvserver.spark.lock import FencedLock
from kvserver.spark.txn_reads import range_kvs

CATEGORIES = ("books", "games", "garden", "music", "tools")
STAGING = "_staging"
CHECKPOINTS = "_checkpoints"
COMMIT_ATTEMPTS = 3

__all__ = ["DemoConfig", "RunResult", "run", "main", "read_output"]


@dataclass(frozen=True)
class DemoConfig:
    table: str = "daily_sales"
    days: int = 7
    start_date: str = "2024-01-01"
    events_per_day: int = 20_000
    seed: int = 7

    def day(self, index: int) -> str:
        return (dt.date.fromisoformat(self.start_date) + dt.timedelta(days=index)).isoformat()

    def params(self) -> dict:
        return {
            "days": self.days,
            "start_date": self.start_date,
            "events_per_day": self.events_per_day,
            "seed": self.seed,
        }


@dataclass
class RunResult:
    token: int = 0
    committed: list[int] = field(default_factory=list)  # day indexes this run committed
    recovered: list[int] = field(default_factory=list)  # committed earlier, renamed now
    already: int = 0  # days committed before this run
    status: str = ""


def state_key(table: str) -> str:
    return f"demo/{table}/state"


def config_key(table: str) -> str:
    return f"demo/{table}/config"


def rows_prefix(table: str) -> str:
    return f"demo/{table}/rows/"


def feed_prefix(table: str) -> str:
    return f"demo/{table}/feed/"


# ---------------------------------------------------------------------------------------------
# The computation (Spark)


def daily_aggregate(spark, cfg: DemoConfig, index: int):
    """The day's aggregate DataFrame: a pure function of (seed, day index)."""
    from pyspark.sql import functions as F

    d, s = index, cfg.seed
    events = spark.range(cfg.events_per_day).select(
        F.element_at(
            F.array(*[F.lit(c) for c in CATEGORIES]),
            (F.pmod(F.col("id") * 7919 + s * 31 + d * 101, len(CATEGORIES)) + 1).cast("int"),
        ).alias("category"),
        F.pmod(F.col("id") * 104729 + d * 13 + s, 997).alias("user_id"),
        (F.pmod(F.col("id") * 2654435761 + d * 977 + s * 7, 10_000) + 99).alias("amount_cents"),
    )
    return (
        events.groupBy("category")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.countDistinct("user_id").alias("users"),
            F.sum("amount_cents").alias("revenue_cents"),
        )
        .withColumn("day", F.lit(cfg.day(index)))
        .select("day", "category", "events", "users", "revenue_cents")
        .orderBy("category")
    )


def read_tables(client: Client, table: str) -> dict[str, list[tuple[str, str, int]]]:
    """The rows and the feed in raftkv: ``(key below the prefix, value, version)``, in key
    order, for ``rows`` and ``feed``."""
    out = {}
    for name, prefix in (("rows", rows_prefix(table)), ("feed", feed_prefix(table))):
        kvs = client.range(prefix, prefix=True).kvs
        out[name] = [(kv.key.decode()[len(prefix) :], kv.value.decode(), kv.version) for kv in kvs]
    return out


def read_output(out_dir: str) -> list[tuple]:
    """Every committed row under ``out_dir`` (``day=*`` directories), sorted; via pyarrow."""
    import pyarrow.parquet as pq

    rows: list[tuple] = []
    for name in sorted(os.listdir(out_dir)):
        if not name.startswith("day="):
            continue
        path = os.path.join(out_dir, name)
        for f in sorted(os.listdir(path)):
            if f.endswith(".parquet"):
                table = pq.read_table(os.path.join(path, f))
                rows.extend(tuple(r.values()) for r in table.to_pylist())
    return sorted(rows)


# ---------------------------------------------------------------------------------------------
# raftkv as a table: the data source's batch write and read, its changefeed and sink


def _source_options(client: Client, fence: Fence | None = None) -> dict[str, str]:
    options = {"endpoints": ",".join(client.endpoints)}
    if fence is not None:
        options.update(fence.to_options())
    return options


def _write_rows(client: Client, df, table: str, fence: Fence) -> None:
    """The day's rows into ``demo/T/rows/<day>/<category>`` (the row as JSON), fenced."""
    from pyspark.sql import functions as F

    rows = df.select(
        F.concat(F.lit(rows_prefix(table)), "day", F.lit("/"), "category").alias("key"),
        F.to_json(F.struct(*df.columns)).alias("value"),
    )
    rows.write.format("raftkv").options(**_source_options(client, fence)).mode("append").save()


def _count_rows(spark, client: Client, table: str) -> int:
    """The rows of ``demo/T/rows/`` at one revision (the data source's batch read)."""
    return (
        spark.read.format("raftkv")
        .options(**_source_options(client))
        .option("prefix", rows_prefix(table))
        .load()
        .count()
    )


def _stream_feed(
    spark, client: Client, table: str, out_dir: str, fence: Fence, archive_url: str
) -> None:
    """Every PUT of ``demo/T/rows/`` not yet in the feed copied into ``demo/T/feed/`` (a key
    per event: ``<row key>@<revision>``, the revision zero-padded to 12 digits): the
    changefeed from its first revision (its start stored once under ``sourceName``; history
    the store compacted read from ``archive_url``) into the exactly-once sink, fenced, up to
    what is there now (``Trigger.AvailableNow``), continuing from the checkpoint."""
    from pyspark.sql import functions as F

    feed = (
        spark.readStream.format("raftkv")
        .options(**_source_options(client))
        .option("changefeed", "true")
        .option("prefix", rows_prefix(table))
        .option("startingRevision", "earliest")
        .option("sourceName", f"demo/{table}/feed")
    )
    if archive_url:
        feed = feed.option("archiveUrl", archive_url)
    copies = (
        feed.load()
        .where("type = 'PUT'")
        .select(
            F.concat(
                F.lit(feed_prefix(table)),
                F.expr(f"substring(key, {len(rows_prefix(table)) + 1})"),
                F.lit("@"),
                F.lpad(F.col("mod_revision").cast("string"), 12, "0"),
            ).alias("key"),
            "value",
        )
    )
    query = (
        copies.writeStream.format("raftkv")
        .options(**_source_options(client, fence))
        .option("checkpointLocation", os.path.join(out_dir, CHECKPOINTS, "feed"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"the feed's streaming query failed: {query.exception()}")
    finally:
        query.stop()


# ---------------------------------------------------------------------------------------------
# Files


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parquet_files(path: str) -> dict[str, int]:
    return {
        f: os.path.getsize(os.path.join(path, f))
        for f in sorted(os.listdir(path))
        if f.endswith(".parquet")
    }


def _finish(out_dir: str, entry: CommitEntry) -> bool:
    """Make a committed day visible: rename its staging directory (False: already done)."""
    info = entry.json()
    final = os.path.join(out_dir, info["dir"])
    if os.path.isdir(final):
        return False
    staging = os.path.join(out_dir, info["staging"])
    if not os.path.isdir(staging):
        raise RuntimeError(
            f"day {info['day']} is committed (version {entry.version}) but "
            f"neither {final} nor its staging directory {staging} exists: the "
            f"output directory was changed outside the pipeline"
        )
    if _parquet_files(staging) != info["files"]:
        raise RuntimeError(
            f"staging directory {staging} does not hold the files committed "
            f"for day {info['day']}: {info['files']}"
        )
    os.rename(staging, final)
    _fsync_dir(out_dir)
    return True


def _clear_uncommitted(out_dir: str, day: str) -> None:
    staging_root = os.path.join(out_dir, STAGING)
    os.makedirs(staging_root, exist_ok=True)
    for name in os.listdir(staging_root):
        if name.startswith(f"day={day}."):
            shutil.rmtree(os.path.join(staging_root, name), ignore_errors=True)
    final = os.path.join(out_dir, f"day={day}")
    if os.path.isdir(final):  # impossible under this protocol (renamed only after commit)
        shutil.rmtree(final)


# ---------------------------------------------------------------------------------------------
# Guarded state writes


def _fenced_put(client: Client, fence: Fence, key: str, value: dict) -> None:
    result = client.txn(Txn().when(fence.compare()).then(Op.put(key, json.dumps(value))))
    if not result.succeeded:
        raise FencedOutError(fence.key, fence.token, f"writing {key} refused")


def _check_config(client: Client, cfg: DemoConfig, fence: Fence) -> None:
    want = json.dumps(cfg.params(), sort_keys=True)
    key = config_key(cfg.table)
    result = client.txn(
        Txn()
        .when(Cmp.version(key) == 0, fence.compare())
        .then(Op.put(key, want))
        .otherwise(Op.get(key))
    )
    if result.succeeded:
        return
    kvs = range_kvs(result, 0)
    if not kvs:
        raise FencedOutError(fence.key, fence.token, "writing the run's configuration refused")
    if kvs[0].value.decode() != want:
        raise ValueError(
            f"table {cfg.table!r} was started with {kvs[0].value.decode()}; this "
            f"run asks for {want}. Use another --table (or another cluster)."
        )


def _commit_day(
    log: CommitLog,
    lock: FencedLock,
    index: int,
    payload: dict,
    progress: dict,
    say: Callable[[str], None],
) -> CommitEntry:
    """Commit one day; an ambiguous failure (no answer after the client's retries) is
    resolved by reading the version back: ours (same run id and token) means it is done."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return log.commit(
                index,
                payload,
                fence=lock,
                also=[Op.put(state_key(log.table), json.dumps(progress))],
            )
        except CommitConflictError as exc:
            theirs = exc.existing.json()
            if theirs.get("run") == payload["run"] and theirs.get("token") == payload["token"]:
                return exc.existing  # our own commit, whose answer was lost
            raise
        except ClientError as exc:
            if not exc.retryable or attempt == COMMIT_ATTEMPTS:
                raise
            say(f"  commit of day {payload['day']} got no answer ({exc.message}); retrying")
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------------
# The run


def run(
    spark,
    client: Client,
    out_dir: str,
    cfg: DemoConfig = DemoConfig(),
    *,
    ttl: int = 10,
    lock_timeout: float | None = 60.0,
    stop_after: int | None = None,
    archive_url: str = "",
    say: Callable[[str], None] = print,
) -> RunResult:
    """One run of the pipeline (see the module docstring); returns what it did."""
    os.makedirs(out_dir, exist_ok=True)
    out_dir = os.path.abspath(out_dir)
    register(spark)
    _make_active(spark)
    result = RunResult()
    run_id = uuid.uuid4().hex[:12]
    owner = f"{socket.gethostname()}:{os.getpid()}"
    lost: list[str] = []

    def on_lost(reason: str) -> None:
        lost.append(reason)
        say(f"!! lock lost: {reason}")

    lock = FencedLock(client, f"demo/{cfg.table}", ttl=ttl, on_lost=on_lost)
    say(f"raftkv: {', '.join(client.endpoints)}; table {cfg.table!r}: waiting for its lock")
    fence = lock.acquire(timeout=lock_timeout)
    result.token = fence.token
    try:
        _check_config(client, cfg, fence)
        log = CommitLog(client, cfg.table)
        entries = list(log.history())
        result.already = len(entries)
        for entry in entries:
            if _finish(out_dir, entry):
                result.recovered.append(entry.version)
                say(
                    f"  recovered day {entry.json()['day']}: committed earlier, output "
                    f"renamed into place now"
                )
        say(
            f"run {run_id} holds the lock (fencing token {fence.token}); "
            f"{len(entries)} of {cfg.days} days already committed"
        )
        state = {
            "run": run_id,
            "owner": owner,
            "token": fence.token,
            "status": "running",
            "days_done": len(entries),
            "days_total": cfg.days,
            "updated_at": time.time(),
        }
        _fenced_put(client, lock.fence(), state_key(cfg.table), state)
        for index in range(len(entries), cfg.days):
            if stop_after is not None and len(result.committed) >= stop_after:
                break
            lock.check()
            day = cfg.day(index)
            started = time.monotonic()
            _clear_uncommitted(out_dir, day)
            staging_rel = os.path.join(STAGING, f"day={day}.t{fence.token}")
            staging = os.path.join(out_dir, staging_rel)
            df = daily_aggregate(spark, cfg, index)
            df.coalesce(1).write.mode("overwrite").parquet(staging)
            files = _parquet_files(staging)
            rows = sum(pq_rows(os.path.join(staging, f)) for f in files)
            _write_rows(client, df, cfg.table, lock.fence())
            payload = {
                "day": day,
                "dir": f"day={day}",
                "staging": staging_rel,
                "files": files,
                "rows": rows,
                "run": run_id,
                "token": fence.token,
            }
            state.update(days_done=index + 1, last_day=day, updated_at=time.time())
            entry = _commit_day(log, lock, index, payload, state, say)
            _finish(out_dir, entry)
            result.committed.append(index)
            say(
                f"  day {day}: {cfg.events_per_day} events -> {rows} rows, committed as "
                f"version {index} at revision {entry.revision} "
                f"({time.monotonic() - started:.1f} s); {index + 1}/{cfg.days} done"
            )
        done = len(entries) + len(result.committed)
        have = _count_rows(spark, client, cfg.table)
        if done == cfg.days:  # then every row written is a committed one
            want = sum(e.json()["rows"] for e in log.history())
            if have != want:
                raise RuntimeError(
                    f"raftkv holds {have} rows of {cfg.table!r}; the commit log counts {want}"
                )
        _stream_feed(spark, client, cfg.table, out_dir, lock.fence(), archive_url)
        say(f"  raftkv holds {have} rows; the feed is up to date")
        result.status = "done" if done == cfg.days else "stopped"
        state.update(status=result.status, days_done=done, updated_at=time.time())
        _fenced_put(client, lock.fence(), state_key(cfg.table), state)
        say(
            f"run {run_id} {result.status}: committed {len(result.committed)} day(s) now, "
            f"{done}/{cfg.days} in all; output in {out_dir}"
        )
        return result
    finally:
        lock.release()


def _make_active(spark) -> None:
    """Make ``spark`` the JVM's active session on this thread. Spark looks a Python data
    source up in the active session, which the JVM keeps per thread: a run on another thread
    than the one that made the session would not find ``format("raftkv")``."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is not None:  # a classic session (Spark Connect has no JVM here, nor the issue)
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def pq_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def show_status(client: Client, table: str, say: Callable[[str], None] = print) -> None:
    kv = client.get(state_key(table))
    say(f"table {table!r}: " + (kv.value.decode() if kv else "no run yet"))
    for entry in CommitLog(client, table).history():
        info = entry.json()
        say(
            f"  version {entry.version}: day {info['day']}, {info['rows']} rows, "
            f"{len(info['files'])} file(s), token {info['token']}, revision {entry.revision}"
        )


# ---------------------------------------------------------------------------------------------
# Command line


def _spark_session(master: str | None):
    """Local Spark on 127.0.0.1 (``master``, default ``local[2]``), or, under spark-submit
    (its gateway is already running), the master and addresses spark-submit was given."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("raftkv-demo")
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit's settings
        if master is not None:
            builder = builder.master(master)
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.master(master or "local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
    spark = (
        builder.config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvserver.spark.demo", description="daily aggregates committed exactly once"
    )
    p.add_argument(
        "--endpoints",
        default=os.environ.get("RAFTKV_ENDPOINTS"),
        help="raftkv client URLs, comma-separated (default: $RAFTKV_ENDPOINTS)",
    )
    p.add_argument(
        "--start-cluster",
        metavar="DIR",
        help="start a local three-node raftkv in DIR for this run (kept on disk, "
        "so a second run continues); ports 2479, 22479, 32479",
    )
    p.add_argument("--out", default="spark-demo-out", help="output directory")
    p.add_argument("--table", default=DemoConfig.table)
    p.add_argument("--days", type=int, default=DemoConfig.days)
    p.add_argument("--start-date", default=DemoConfig.start_date)
    p.add_argument("--events-per-day", type=int, default=DemoConfig.events_per_day)
    p.add_argument("--seed", type=int, default=DemoConfig.seed)
    p.add_argument("--stop-after", type=int, help="commit at most this many days, then stop")
    p.add_argument("--ttl", type=int, default=10, help="lock lease TTL (s)")
    p.add_argument(
        "--master",
        help="Spark master (default: spark-submit's --master under spark-submit, else local[2])",
    )
    p.add_argument(
        "--archive-url",
        default="",
        help="the members' continuous archive (raftkv serve --archive-url), for the feed's "
        "changefeed to read history the store has compacted",
    )
    p.add_argument("--status", action="store_true", help="show the state and commit log, exit")
    args = p.parse_args(argv)
    if args.days < 1 or args.events_per_day < 1:
        p.error("--days and --events-per-day must be >= 1")
    dt.date.fromisoformat(args.start_date)
    cluster = None
    if args.start_cluster:
        from kvserver.localcluster.launcher import LocalCluster

        cluster = LocalCluster(args.start_cluster, size=3, base_port=2479)
        cluster.start()
        args.endpoints = ",".join(cluster.endpoints)
        print(f"started a local raftkv (data and logs in {args.start_cluster})", flush=True)
    if not args.endpoints:
        p.error("give --endpoints (or $RAFTKV_ENDPOINTS) or --start-cluster DIR")
    cfg = DemoConfig(args.table, args.days, args.start_date, args.events_per_day, args.seed)
    try:
        with Client(args.endpoints.split(","), timeout_s=30) as client:
            if cluster is not None:
                _wait_ready(client)
            if args.status:
                show_status(client, args.table)
                return 0
            spark = _spark_session(args.master)
            try:
                run(
                    spark,
                    client,
                    args.out,
                    cfg,
                    ttl=args.ttl,
                    stop_after=args.stop_after,
                    archive_url=args.archive_url,
                    say=lambda line: print(line, flush=True),
                )
            finally:
                spark.stop()
            show_status(client, args.table)
        return 0
    except (FencedOutError, ValueError, RuntimeError, ClientError) as exc:
        print(f"demo: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.stop()


def _wait_ready(client: Client, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.get("demo/ready-check")
            return
        except ClientError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
