"""The ``raftkv-wal`` data source on real Spark, against the WALs of a real three-node run.

A cluster archiving to ``file://`` takes puts, deletes, a txn and a lease from two clients
with known ids, then stops (SIGTERM: the archiver's last pass). Then:

* every record of a member's data dir read through Spark equals ``raftkv wal dump --json``
  on that dir (segment, offset, type, index, term, entry type, vote, commit);
* the same through the archive URL, for every member (the archived bytes are the local
  ones, parts concatenated);
* ``committedOnly`` equals the entries the wal reader returns up to its hard state's commit,
  and answers the audit question: the put of a key is found with the client id and request
  id of the client that sent it, and its index and term.
"""

from __future__ import annotations

import json
import os

import pytest

import wal
from kvserver.client import Client, Op, Txn
from kvserver.localcluster.launcher import LocalCluster
from tests.archive.helpers import cli
from tests.cluster.harness import wait_healthy
from tests.spark.conftest import FAST_TIMING
from tests.support.wait import wait_for
from wal.segment import list_segments

CLIENT_A, CLIENT_B = 0x1111_2222_3333_4444, 2**64 - 5  # the second one does not fit a long


@pytest.fixture(scope="module")
def wal_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("wal-table")
    archive = f"file://{root}/archive"
    c = LocalCluster(
        str(root / "cluster"),
        size=3,
        extra_args=[*FAST_TIMING, "--archive-url", archive, "--archive-interval", "100"],
    )
    c.start()
    try:
        wait_healthy(c)
        with (
            Client(c.endpoints, client_id=CLIENT_A) as a,
            Client(c.endpoints, client_id=CLIENT_B) as b,
        ):
            for i in range(40):
                (a if i % 2 else b).put(f"t/{i:02d}", f"v{i}")
            a.delete("t/03")
            b.txn(Txn().when().then(Op.put("t/txn1", "x"), Op.delete("t/05")))
            lease = a.lease_grant(60)
            a.put("t/leased", "y", lease=lease.id)
            b.put("audit/who", "changed-it")
            last = a.put("t/last", "z").header.revision
        wait_for(
            lambda: all(_applied(c, n, last) for n in c.nodes),
            timeout_s=30,
            what="every member applied the last put",
        )
    finally:
        c.stop(timeout_s=30)
    return {"cluster": c, "archive": archive}


def _applied(c, node, revision) -> bool:
    with Client([node.client_url]) as cl:
        return cl.status().revision >= revision


def _dump(dir_: str) -> list[dict]:
    r = cli("wal", "dump", dir_, "--json")
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def _key(rec: dict) -> tuple:
    return (
        rec["segment"],
        rec["offset"],
        rec["type"],
        rec.get("index"),
        rec.get("term"),
        rec.get("entry_type"),
        rec.get("vote") or None,
        rec.get("commit"),
    )


_ENTRY_TYPES = {"normal": 0, "conf_change": 1, "conf_change_v2": 2}


def _spark_keys(rows) -> list[tuple]:
    return sorted(
        (
            r.segment,
            r["offset"],
            r.record_type,
            r["index"],
            r.term,
            None if r.entry_type is None else _ENTRY_TYPES[r.entry_type],
            None if r.vote is None else int(r.vote, 16),
            r.commit,
        )
        for r in rows
    )


def test_data_dir_rows_equal_wal_dump(spark, wal_run):
    node = wal_run["cluster"].nodes[0]
    df = spark.read.format("raftkv-wal").load(node.data_dir)
    rows = df.collect()
    segments = list_segments(os.path.join(node.data_dir, "member", "wal"))
    assert df.rdd.getNumPartitions() == len(segments)  # a partition per segment
    dumped = _dump(node.data_dir)
    assert len(rows) == len(dumped) > 50
    assert _spark_keys(rows) == sorted(_key(d) for d in dumped)
    assert len({r.member for r in rows}) == 1


def test_archive_rows_equal_wal_dump_of_every_member(spark, wal_run):
    c = wal_run["cluster"]
    rows = spark.read.format("raftkv-wal").load(wal_run["archive"]).collect()
    by_member: dict[str, list] = {}
    for r in rows:
        by_member.setdefault(r.member, []).append(r)
    assert len(by_member) == 3
    for node in c.nodes:
        dumped = _dump(node.data_dir)
        member = next(
            r.member
            for r in spark.read.format("raftkv-wal")
            .load(node.data_dir)
            .where("record_type = 'metadata'")
            .limit(1)
            .collect()
        )
        assert _spark_keys(by_member[member]) == sorted(_key(d) for d in dumped), node.name


def test_committed_only_equals_the_wal_reader_and_answers_who(spark, wal_run):
    c = wal_run["cluster"]
    node = c.nodes[1]
    w = wal.open_for_read(os.path.join(node.data_dir, "member", "wal"))
    try:
        _, hs, entries = w.read_all()
    finally:
        w.close()
    want = [(e.index, e.term) for e in entries if e.index <= hs.commit]
    for source in (node.data_dir, wal_run["archive"]):
        df = (
            spark.read.format("raftkv-wal")
            .option("committedOnly", "true")
            .option("member", _member_of(spark, node.data_dir))
            .load(source)
        )
        rows = df.collect()
        assert sorted((r["index"], r.term) for r in rows) == want, source
        assert {r.record_type for r in rows} == {"entry"}
    who = (
        spark.read.format("raftkv-wal")
        .option("committedOnly", "true")
        .load(node.data_dir)
        .where("operation = 'put' and array_contains(keys, 'audit/who')")
        .collect()
    )
    assert len(who) == 1
    assert (int(who[0].client_id), who[0].request_id is not None) == (CLIENT_B, True)
    assert json.loads(who[0].request)["value"] == "changed-it"
    assert who[0]["index"] in {i for i, _ in want}
    puts_by = {
        (int(r.client_id), r.keys[0])
        for r in spark.read.format("raftkv-wal")
        .option("committedOnly", "true")
        .load(node.data_dir)
        .where("operation = 'put'")
        .collect()
    }
    assert (CLIENT_A, "t/01") in puts_by and (CLIENT_B, "t/00") in puts_by
    ops = {
        r.operation
        for r in spark.read.format("raftkv-wal")
        .option("committedOnly", "true")
        .load(node.data_dir)
        .collect()
    }
    assert {"put", "delete_range", "txn", "lease_grant", "empty"} <= ops


def _member_of(spark, data_dir: str) -> str:
    return (
        spark.read.format("raftkv-wal")
        .load(data_dir)
        .where("record_type = 'metadata'")
        .limit(1)
        .collect()[0]
        .member
    )


def test_bad_option_and_missing_path_are_clear_errors(spark, tmp_path):
    with pytest.raises(Exception, match="unknown option"):
        spark.read.format("raftkv-wal").option("commitedOnly", "true").load(str(tmp_path)).collect()
    with pytest.raises(Exception, match="no WAL segment"):
        spark.read.format("raftkv-wal").load(str(tmp_path)).collect()
    with pytest.raises(Exception, match="absolute path"):
        spark.read.format("raftkv-wal").load("raftkv-data/n1").collect()
