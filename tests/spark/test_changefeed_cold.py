"""The tiered changefeed: history below the store's compact revision, read from the archive.

A one-node store archiving to ``file://`` (a snapshot every 100 entries) takes puts,
overwrites, deletes, multi-key txns, a lease whose revoke deletes its keys and a prefix
delete; its MVCC history is recorded with a plain watch; then it is compacted and written
some more. Then, on real Spark:

- a stream from ``earliest`` with ``archiveUrl`` equals the full history (every event once,
  with its revision, create revision, version, lease and previous value), read in several
  cold batches (``maxRevisionsPerTrigger``) and then from the store;
- the same with a cold batch cut into time slices at archived snapshots
  (``coldPartitions``);
- the same across stops and restarts from the checkpoint: one batch per run
  (``Trigger.Once``) while the stream is in the cold part, through the batch that reaches
  the compact revision and the first one after it, then the rest;
- offsets stay one revision sequence: batch ends strictly increase, and the switch batch
  ends at the compact revision;
- an archive that does not reach back far enough fails the query naming the revision
  needed, the store's compact revision and the archive's oldest revision.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from kvserver.client import Client, Op, Txn
from kvserver.kvpb.kv import EventType
from kvserver.localcluster.launcher import LocalCluster
from kvserver.spark.source.cold_history import ArchiveView
from tests.cluster.harness import wait_healthy
from tests.spark.conftest import FAST_TIMING
from tests.support.wait import wait_for

PREFIX = "hist/"


def write_history(kv: Client, tag: str, rounds: int) -> int:
    """Varied writes under PREFIX; returns the last revision."""
    last = 0
    for r in range(rounds):
        for i in range(8):
            kv.put(f"{PREFIX}{tag}/k{i}", f"{tag}{r}.{i}")
        kv.delete(f"{PREFIX}{tag}/k{r % 8}")
        kv.txn(
            Txn().then(
                Op.put(f"{PREFIX}{tag}/t{r}a", "a"),
                Op.put(f"{PREFIX}{tag}/t{r}b", "b"),
                Op.delete(f"{PREFIX}{tag}/k{(r + 3) % 8}"),
            )
        )
        kv.put(f"other/{tag}{r}", "outside the range")
        if r % 5 == 2:
            lease = kv.lease_grant(600)
            kv.put(f"{PREFIX}{tag}/leased{r}", "l", lease=lease.id)
            kv.lease_revoke(lease.id)  # deletes the leased key: an event of the range
        if r % 7 == 6:
            kv.delete(f"{PREFIX}{tag}/t", prefix=True)
        last = kv.put(f"{PREFIX}{tag}/end", str(r)).revision
    return last


def recorded(kv: Client, first: int, last: int) -> list:
    out = []
    with kv.watch(PREFIX, prefix=True, start_revision=first, prev_kv=True) as w:
        while not out or out[-1].revision < last:
            out.append(w.get(timeout_s=30))
    return out


def as_rows(events) -> list[tuple]:
    rows = []
    for ev in events:
        put = ev.type is EventType.PUT
        rows.append(
            (
                ev.kv.mod_revision,
                ev.kv.key.decode(),
                "PUT" if put else "DELETE",
                ev.kv.value.decode() if put else None,
                ev.prev_kv.value.decode() if ev.prev_kv is not None else None,
                ev.kv.create_revision,
                ev.kv.version,
                ev.kv.lease,
            )
        )
    return sorted(rows)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("cold-feed")
    archive = f"file://{root}/archive"
    c = LocalCluster(
        str(root / "cluster"),
        size=1,
        extra_args=[
            *FAST_TIMING,
            "--archive-url",
            archive,
            "--archive-interval",
            "100",
            "--snapshot-count",
            "100",
        ],
    )
    c.start()
    try:
        wait_healthy(c)
        with Client(c.endpoints, timeout_s=30) as kv:
            last_cold = write_history(kv, "a", 40)
            compact = last_cold - 25  # some of "a" stays in the store after compaction
            history = recorded(kv, 1, last_cold)
            kv.compact(compact)
            last = write_history(kv, "b", 6)
            history += recorded(kv, last_cold + 1, last)
            index = max(s.status.raft_index for s in kv.statuses() if s.status is not None)
            wait_for(
                lambda: ArchiveView.load(archive, ()).reaches(index),
                60,
                "the archive to reach the store's last index",
            )
            yield {
                "cluster": c,
                "archive": archive,
                "root": root,
                "compact": compact,
                "last": last,
                "expect": as_rows(history),
                "endpoints": ",".join(c.endpoints),
            }
    finally:
        c.stop()


def feed(spark, store, **options):
    reader = (
        spark.readStream.format("raftkv")
        .option("endpoints", store["endpoints"])
        .option("changefeed", "true")
        .option("prefix", PREFIX)
        .option("startingRevision", "earliest")
        .option("prevValue", "true")
        .option("valueFormat", "string")
    )
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def run(spark, store, out: str, checkpoint: str, trigger: dict, **options):
    query = (
        feed(spark, store, **options)
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .start()
    )
    try:
        query.awaitTermination(300)
        assert not query.isActive, "the query did not finish within 300 s"
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
    finally:
        query.stop()


def sink(spark, out: str) -> list[tuple]:
    rows = spark.read.parquet(out).collect()
    return sorted(
        (
            r.mod_revision,
            r.key,
            r.type,
            r.value,
            r.prev_value,
            r.create_revision,
            r.version,
            r.lease,
        )
        for r in rows
    )


def batch_ends(checkpoint: str) -> dict[int, int]:
    out = {}
    offsets = os.path.join(checkpoint, "offsets")
    for name in os.listdir(offsets):
        if name.isdigit():
            with open(os.path.join(offsets, name)) as f:
                out[int(name)] = json.loads(f.read().splitlines()[-1])["revision"]
    return out


def test_stream_from_earliest_equals_full_history(spark, store, tmp_path):
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    run(
        spark,
        store,
        out,
        ckpt,
        {"availableNow": True},
        archiveUrl=store["archive"],
        maxRevisionsPerTrigger=150,
    )
    got = sink(spark, out)
    assert len(got) == len(set(got)), "an event was delivered twice"
    assert got == store["expect"]
    ends = [e for _, e in sorted(batch_ends(ckpt).items())]
    assert ends == sorted(set(ends)), "batch ends must strictly increase"
    assert store["compact"] in ends, "the last cold batch ends at the compact revision"
    assert sum(1 for e in ends if e < store["compact"]) >= 2, "several cold batches"


def test_cold_batches_in_time_slices_equal_full_history(spark, store, tmp_path):
    from pyspark.sql.functions import spark_partition_id

    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    query = (
        feed(spark, store, archiveUrl=store["archive"], coldPartitions=3)
        .withColumn("pid", spark_partition_id())
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    got = sink(spark, out)
    assert len(got) == len(set(got)), "an event was delivered twice"
    assert got == store["expect"]
    first_batch = min(b for b, e in batch_ends(ckpt).items() if e > 0)
    assert batch_ends(ckpt)[first_batch] == store["compact"], "one cold batch to the switch"
    cold_pids = {
        r.pid
        for r in spark.read.parquet(out).where(f"mod_revision <= {store['compact']}").collect()
    }
    assert len(cold_pids) >= 2, "the cold batch was read in several time slices"


def test_restarts_in_the_cold_part_and_across_the_switch(spark, store, tmp_path):
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    opts = {"archiveUrl": store["archive"], "maxRevisionsPerTrigger": 200}
    compact = store["compact"]
    runs = 0
    # One batch per run (Trigger.Once) until a run has ended past the compact revision.
    while True:
        run(spark, store, out, ckpt, {"once": True}, **opts)
        runs += 1
        ends = batch_ends(ckpt)
        if ends[max(ends)] > compact:
            break
        assert runs < 20, f"no progress past the compact revision {compact}: {ends}"
    assert runs >= 3, "stopped and restarted at least twice in the cold part"
    ordered = [ends[b] for b in sorted(ends)]
    assert compact in ordered, "a run ended exactly at the switch, the next one started there"
    run(spark, store, out, ckpt, {"availableNow": True}, **opts)
    got = sink(spark, out)
    assert len(got) == len(set(got)), "an event was delivered twice"
    assert got == store["expect"]


def test_archive_that_does_not_reach_back_fails_naming_both_revisions(spark, store, tmp_path):
    # An archive whose log does not start at the beginning (as retention leaves it): a copy
    # of the real one with its WAL dropped from the manifest, snapshots kept.
    src = store["archive"][len("file://") :]
    dst = tmp_path / "short-archive"
    shutil.copytree(src, dst)
    [manifest] = [
        os.path.join(d, f) for d, _, fs in os.walk(dst) for f in fs if f == "manifest.json"
    ]
    with open(manifest) as f:
        doc = json.load(f)
    doc["segments"] = []
    oldest = min(s["revision"] for s in doc["snapshots"]) + 1
    assert 1 < oldest < store["compact"], "the test needs a snapshot below the compact revision"
    with open(manifest, "w") as f:
        json.dump(doc, f)
    with pytest.raises(Exception) as err:
        run(
            spark,
            store,
            str(tmp_path / "out"),
            str(tmp_path / "ckpt"),
            {"availableNow": True},
            archiveUrl=f"file://{dst}",
            startingRevision=1,
        )
    message = str(err.value)
    assert "ColdGapError" in message or "revision 1 is needed" in message, message
    assert "revision 1 is needed" in message
    assert f"below revision {store['compact']}" in message
    assert f"from revision {oldest}" in message
