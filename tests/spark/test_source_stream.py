"""The raftkv changefeed and streaming sink, on real local Spark against real raftkv processes.

- The changefeed of ``cf/``, written by the raftkv sink into ``cfout/`` of the same store,
  equals the MVCC history of ``cf/`` (puts, overwrites, deletes, a multi-key txn) read with
  a plain watch — across a stop and a restart from the checkpoint, and across a replayed
  batch (its commit file deleted): every event once (every output key has version 1).
- Offsets are revisions of events of the watched range: every batch of the offset log ends
  at such a revision, so no batch is empty and the sink's own writes (and an unrelated put)
  never wake the query.
- A compacted start fails naming the compact revision; ``skipCompacted`` reads from it.
- ``initialOffset`` answers the same on every call, and with ``sourceName`` in every process.
"""

import json
import os

import pytest

from kvserver.client import Client, Op, Txn
from kvserver.kvpb.kv import EventType
from tests.support.wait import wait_for


@pytest.fixture(scope="module")
def kv(raftkv_cluster):
    with Client(raftkv_cluster.endpoints, timeout_s=30) as client:
        yield client


@pytest.fixture(scope="module")
def opts(raftkv_cluster):
    return {"endpoints": ",".join(raftkv_cluster.endpoints)}


def make_history(kv, prefix: str, tag: str) -> int:
    """Puts, overwrites, deletes (one of a key that never comes back), a txn of several
    keys in one revision; ends with a put. Returns the last revision."""
    for i in range(6):
        kv.put(f"{prefix}{tag}-{i}", f"{tag}{i}")
    kv.put(f"{prefix}{tag}-1", f"{tag}1-again")
    kv.delete(f"{prefix}{tag}-2")
    kv.txn(
        Txn().then(
            Op.put(f"{prefix}{tag}-t1", "a"),
            Op.put(f"{prefix}{tag}-t2", "b"),
            Op.delete(f"{prefix}{tag}-3"),
        )
    )
    kv.delete(f"{prefix}{tag}-4")
    kv.put(f"{prefix}{tag}-4", "back")
    return kv.put(f"{prefix}{tag}-end", "end").revision


def history(kv, prefix: str, first: int, last: int) -> list:
    """The MVCC history of the prefix in [first, last], read with a plain watch."""
    out = []
    with kv.watch(prefix, prefix=True, start_revision=first, prev_kv=True) as w:
        while not out or out[-1].revision < last:
            out.append(w.get(timeout_s=30))
    return out


def expected_rows(events) -> dict[str, dict]:
    rows = {}
    for ev in events:
        key = ev.kv.key.decode()
        put = ev.type is EventType.PUT
        rows[f"cfout/{ev.revision:010d}/{key}"] = {
            "type": "PUT" if put else "DELETE",
            "key": key,
            "value": ev.kv.value.decode() if put else None,
            "prev": ev.prev_kv.value.decode() if ev.prev_kv is not None else None,
            "create_revision": ev.kv.create_revision,
            "version": ev.kv.version,
            "lease": ev.kv.lease,
        }
    return rows


def sink_rows(kv) -> dict[str, tuple]:
    return {
        k.key.decode(): (json.loads(k.value), k.version)
        for k in kv.range("cfout/", prefix=True).kvs
    }


def batch_ends(checkpoint: str) -> dict[int, int]:
    """Batch id -> end revision, from the checkpoint's offset log."""
    ends = {}
    folder = os.path.join(checkpoint, "offsets")
    for name in os.listdir(folder):
        if name.isdigit():
            with open(os.path.join(folder, name)) as f:
                lines = f.read().splitlines()
            ends[int(name)] = json.loads(lines[-1])["revision"]
    return ends


def test_changefeed_equals_history_across_restart_and_replay_and_never_wakes_itself(
    spark, kv, opts, tmp_path
):
    start = kv.put("cf/seed", "0").revision
    checkpoint = str(tmp_path / "checkpoint")

    def run():
        feed = (
            spark.readStream.format("raftkv")
            .options(**opts)
            .option("changefeed", "true")
            .option("prefix", "cf/")
            .option("startingRevision", str(start))
            .option("prevValue", "true")
            .option("valueFormat", "string")
            .load()
        )
        out = feed.selectExpr(
            "concat('cfout/', lpad(cast(mod_revision as string), 10, '0'), '/', key) as key",
            "to_json(struct(type, key, value, prev_value as prev, create_revision, version, "
            "lease), map('ignoreNullFields', 'false')) as value",
        )
        return (
            out.writeStream.format("raftkv")
            .options(**opts)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def wait_rows(n: int, query) -> None:
        def enough():
            if query.exception() is not None:
                raise AssertionError(f"query failed: {query.exception()}")
            return len(sink_rows(kv)) >= n

        wait_for(enough, 120, f"{n} changefeed rows in the sink", interval_s=0.5)

    last1 = make_history(kv, "cf/", "one")
    expect = expected_rows(history(kv, "cf/", start, last1))
    query = run()
    try:
        wait_rows(len(expect), query)
    finally:
        query.stop()

    # Replay: forget that the newest planned batch committed (if the stop did not already
    # interrupt it); Spark runs it again on restart, from the offsets it logged.
    commits = os.path.join(checkpoint, "commits")
    newest = max(batch_ends(checkpoint))
    for name in (str(newest), f".{newest}.crc"):
        if os.path.exists(os.path.join(commits, name)):
            os.remove(os.path.join(commits, name))

    last2 = make_history(kv, "cf/", "two")  # while the query is stopped
    expect = expected_rows(history(kv, "cf/", start, last2))
    query = run()
    try:
        wait_rows(len(expect), query)
        wait_for(
            lambda: os.path.exists(os.path.join(commits, str(newest))),
            60,
            "the replayed batch to commit again",
        )
        # Writes outside the range (like the sink's own) make no batch; one more event does.
        kv.put("elsewhere/x", "1")
        last3 = kv.put("cf/after", "z").revision
        expect = expected_rows(history(kv, "cf/", start, last3))
        wait_rows(len(expect), query)
    finally:
        query.stop()

    got = sink_rows(kv)
    assert {k: v[0] for k, v in got.items()} == expect
    assert {v[1] for v in got.values()} == {1}, "an event was written twice"
    event_revisions = {int(k.split("/")[1]) for k in expect}
    ends = batch_ends(checkpoint)
    if ends[0] == start - 1:
        del ends[0]  # Spark always runs batch 0, even when it ends at the initial offset
    assert set(ends.values()) <= event_revisions, "a batch ended at a revision of no event"
    ordered = [ends[b] for b in sorted(ends)]
    assert ordered == sorted(set(ordered)), "batch end revisions must strictly increase"
    # Committing batch N deletes the markers below N; the stop may have interrupted a batch
    # after its tasks wrote (it replays on restart), so markers of the last committed batch
    # and of later ones may remain, none older.
    markers = kv.range("__raftkv_spark/stream/", prefix=True).kvs
    assert markers, "the last committed batch keeps its markers"
    last_committed = max(int(n) for n in os.listdir(commits) if n.isdigit())
    batches = {int(m.key.decode().split("/")[3]) for m in markers}
    assert min(batches) >= last_committed, f"old markers not cleaned: {batches}"


def test_initial_offset_is_stable(kv, opts):
    from kvserver.spark.source.changefeed import RaftKVStreamReader
    from kvserver.spark.source.options import parse

    base = {**opts, "prefix": "init/", "changefeed": "true"}
    reader = RaftKVStreamReader(parse({**base, "startingRevision": "latest"}))
    first = reader.initialOffset()
    kv.put("init/a", "1")
    assert reader.initialOffset() == first
    named = {**base, "startingRevision": "latest", "sourceName": "stable-test"}
    one = RaftKVStreamReader(parse(named)).initialOffset()
    kv.put("init/b", "2")
    assert RaftKVStreamReader(parse(named)).initialOffset() == one  # as a new process would
    n = RaftKVStreamReader(parse({**base, "startingRevision": "42"}))
    assert n.initialOffset() == n.initialOffset() == {"revision": 41}


def test_compacted_start_fails_clearly_or_skips_ahead(spark, kv, opts):
    first = kv.put("cmp/a", "1").revision
    kv.put("cmp/a", "2")
    compact_at = kv.put("cmp/b", "3").revision
    kv.put("cmp/c", "4")
    kv.compact(compact_at)

    def run(name, **extra):
        feed = (
            spark.readStream.format("raftkv")
            .options(**opts)
            .option("changefeed", "true")
            .option("prefix", "cmp/")
            .option("startingRevision", str(first))
            .options(**extra)
            .load()
        )
        return feed.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()

    query = run("cmp_fail")
    with pytest.raises(Exception, match=f"compact revision {compact_at}"):
        query.awaitTermination(120)
    query = run("cmp_skip", skipCompacted="true")
    assert query.awaitTermination(120) in (None, True)
    rows = spark.table("cmp_skip").collect()
    assert sorted((r.key, r.mod_revision) for r in rows) == [
        ("cmp/b", compact_at),
        ("cmp/c", compact_at + 1),
    ]
