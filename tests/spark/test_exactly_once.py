"""exactly_once on a real streaming query restarted from its checkpoint: Spark replays the
batch whose commit record is missing, and the wrapper skips it (the user's function runs
once per batch id), while without the wrapper the replay runs the function again."""

import json
import os

from kvserver.client import Client
from kvserver.spark.exactly_once import exactly_once


def write_inputs(path, files):
    os.makedirs(path, exist_ok=True)
    for i in range(files):
        with open(os.path.join(path, f"in-{i:03d}.json"), "w") as f:
            for j in range(3):
                f.write(json.dumps({"n": i * 10 + j}) + "\n")


def run_query(spark, src, ckpt, fn):
    q = (
        spark.readStream.schema("n long")
        .option("maxFilesPerTrigger", 1)
        .json(src)
        .writeStream.foreachBatch(fn)
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(240)
    assert q.exception() is None


def forget_last_commit(ckpt):
    """What a driver crash after foreachBatch, before Spark's commit record, leaves behind."""
    commits = os.path.join(ckpt, "commits")
    last = max(int(n) for n in os.listdir(commits) if n.isdigit())
    os.remove(os.path.join(commits, str(last)))
    crc = os.path.join(commits, f".{last}.crc")
    if os.path.exists(crc):
        os.remove(crc)
    return last


def test_batch_replayed_after_restart_from_checkpoint_is_skipped(spark, raftkv_cluster, tmp_path):
    src = str(tmp_path / "in")
    write_inputs(src, 3)
    calls = []  # (batch id, rows) each time the user's function runs
    invoked = []  # batch ids Spark called foreachBatch with

    def user_fn(df, batch_id):
        calls.append((batch_id, sorted(r.n for r in df.collect())))

    with Client(raftkv_cluster.endpoints, timeout_s=30) as client:
        sink = exactly_once(user_fn, "stream-replay", client)

        def spark_calls(df, batch_id):
            invoked.append(batch_id)
            sink(df, batch_id)

        ckpt = str(tmp_path / "ckpt")
        run_query(spark, src, ckpt, spark_calls)
        assert [b for b, _ in calls] == [0, 1, 2]
        last = forget_last_commit(ckpt)
        run_query(spark, src, ckpt, spark_calls)
        assert invoked == [0, 1, 2, last]  # Spark did replay the batch
        assert [b for b, _ in calls] == [0, 1, 2]  # the user's function ran once per batch
        assert sink.skipped == [last]
        assert sorted(n for _, rows in calls for n in rows) == [
            i * 10 + j for i in range(3) for j in range(3)
        ]

        # The control: the same replay without the wrapper runs the function again.
        plain = []
        ckpt2 = str(tmp_path / "ckpt2")
        run_query(spark, src, ckpt2, lambda df, bid: plain.append(bid))
        forget_last_commit(ckpt2)
        run_query(spark, src, ckpt2, lambda df, bid: plain.append(bid))
        assert plain == [0, 1, 2, 2]
