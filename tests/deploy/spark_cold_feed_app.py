"""A spark-submit application for tests/deploy: a changefeed that reads cold history from
the members' archive (``archiveUrl``) into raftkv's exactly-once sink, restarting its query
from the checkpoint when it fails, as a production streaming job (or its scheduler) does.

    deploy/up.sh spark-submit tests/deploy/spark_cold_feed_app.py --endpoints URLS \\
        --prefix P --out O --checkpoint DIR --starting-revision N --archive-url URL

Every PUT of prefix ``P`` from revision ``N`` on becomes the key
``O<mod_revision, 12 digits>/<key below P>`` with the event's value, so the sink (which sorts
a task's rows by key) applies each batch's events in revision order, and one partition per
batch (``numPartitions=1``; a cold batch is one partition anyway) keeps the batches' writes
in revision order too: the feed keys' create revisions then follow the source's revisions.
``--max-revisions`` caps each batch (``maxRevisionsPerTrigger``), so reading the cold history
takes many batches. ``Trigger.AvailableNow``: the query stops once it has delivered what was
there when it started; the application exits 0 then.

A failed query (``StreamingQueryException``: a task or the planner could not reach the
archive, say) is printed as ``feed: the query failed: <its innermost error>`` and started again from the
checkpoint after ``--restart-wait`` seconds, at most ``--restarts`` times; past that the
application exits 1. Not a test itself (pytest collects ``test_*.py`` only).
"""

from __future__ import annotations

import argparse
import re
import sys
import time


def cause(error: BaseException) -> str:
    """The innermost ``SomethingError: message`` line of a failure's text (the Python
    traceback that Spark wraps), else its first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return (causes[-1] if causes else lines[0] if lines else repr(error))[:400]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoints", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--starting-revision", required=True)
    ap.add_argument("--archive-url", required=True)
    ap.add_argument("--max-revisions", type=int, default=25)
    ap.add_argument("--restarts", type=int, default=30)
    ap.add_argument("--restart-wait", type=float, default=2.0)
    args = ap.parse_args()

    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from kvserver.spark import register

    spark = SparkSession.builder.appName("raftkv-cold-feed").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    def start():
        events = (
            spark.readStream.format("raftkv")
            .option("endpoints", args.endpoints)
            .option("changefeed", "true")
            .option("prefix", args.prefix)
            .option("startingRevision", args.starting_revision)
            .option("archiveUrl", args.archive_url)
            .option("maxRevisionsPerTrigger", str(args.max_revisions))
            .option("numPartitions", "1")
            .load()
        )
        copies = events.where("type = 'PUT'").select(
            F.concat(
                F.lit(args.out),
                F.lpad(F.col("mod_revision").cast("string"), 12, "0"),
                F.lit("/"),
                F.expr(f"substring(key, {len(args.prefix) + 1})"),
            ).alias("key"),
            "value",
        )
        return (
            copies.writeStream.format("raftkv")
            .option("endpoints", args.endpoints)
            .option("checkpointLocation", args.checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    try:
        for attempt in range(args.restarts + 1):
            query = start()
            error = None
            try:
                query.awaitTermination()
                error = query.exception()
            except StreamingQueryException as exc:
                error = exc
            finally:
                query.stop()
            if error is None:
                print(f"feed: caught up after {attempt} restart(s)", flush=True)
                return 0
            print(f"feed: the query failed: {cause(error)}", flush=True)
            if attempt < args.restarts:
                print(f"feed: restart {attempt + 1} from the checkpoint", flush=True)
                time.sleep(args.restart_wait)  # a scheduler's back-off, not a wait for a state
        print(f"feed: gave up after {args.restarts} restarts", flush=True)
        return 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
