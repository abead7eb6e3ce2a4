"""The example pipeline (kvserver.spark.demo) on real local Spark against real raftkv processes:
every day committed exactly once, output equal to a fault-free computation, a second run
continuing where the first stopped, a committed-but-unrenamed day recovered, a run that lost
its lock refused, and the leader SIGKILLed mid-run."""

import os
import subprocess
import sys
import threading

import pytest

from kvserver.client import Client
from kvserver.spark import demo
from kvserver.spark.commitlog import CommitLog
from kvserver.spark.fencing import FencedOutError
from tests.cluster.harness import leader_of
from tests.support.wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFG = dict(days=5, events_per_day=3000, seed=11)


def expected_rows(spark, cfg):
    """The answer computed straight from the DataFrames: no files, no commit log."""
    rows = []
    for i in range(cfg.days):
        rows.extend(tuple(r) for r in demo.daily_aggregate(spark, cfg, i).collect())
    return sorted(rows)


@pytest.fixture(scope="module")
def reference(spark):
    cfg = demo.DemoConfig(table="ref", **CFG)
    return expected_rows(spark, cfg)


def assert_committed_once(client, cfg, out_dir, reference):
    log = CommitLog(client, cfg.table)
    entries = list(log.history())
    assert [e.version for e in entries] == list(range(cfg.days))
    for e in entries:
        assert client.get(log.key(e.version)).version == 1  # put once, never overwritten
        assert e.json()["day"] == cfg.day(e.version)
    assert demo.read_output(out_dir) == reference
    assert os.listdir(os.path.join(out_dir, demo.STAGING)) == []
    state = client.get(demo.state_key(cfg.table)).value
    assert b'"status": "done"' in state and f'"days_done": {cfg.days}'.encode() in state


def test_second_run_continues_where_the_first_stopped(spark, raftkv_cluster, tmp_path, reference):
    cfg = demo.DemoConfig(table="resume", **CFG)
    out = str(tmp_path / "out")
    lines = []
    with Client(raftkv_cluster.endpoints, timeout_s=30) as client:
        first = demo.run(spark, client, out, cfg, stop_after=2, say=lines.append)
        assert first.committed == [0, 1] and first.status == "stopped"
        second = demo.run(spark, client, out, cfg, say=lines.append)
        assert second.already == 2 and second.committed == [2, 3, 4]
        assert second.status == "done" and second.token > first.token
        third = demo.run(spark, client, out, cfg, say=lines.append)
        assert third.committed == [] and third.already == 5
        assert_committed_once(client, cfg, out, reference)
        assert any("2 of 5 days already committed" in line for line in lines)
        with pytest.raises(ValueError, match="was started with"):
            demo.run(
                spark,
                client,
                out,
                demo.DemoConfig(table="resume", days=6, seed=11, events_per_day=3000),
                say=lines.append,
            )


def test_committed_but_unrenamed_day_is_recovered_and_debris_removed(
    spark, raftkv_cluster, tmp_path, reference, monkeypatch
):
    cfg = demo.DemoConfig(table="recover", **CFG)
    out = str(tmp_path / "out")
    real_finish = demo._finish
    crashed = []

    def crash_after_commit(out_dir, entry):
        if entry.version == 1 and not crashed:
            crashed.append(entry.version)
            raise KeyboardInterrupt("driver died between commit and rename")
        return real_finish(out_dir, entry)

    with Client(raftkv_cluster.endpoints, timeout_s=30) as client:
        monkeypatch.setattr(demo, "_finish", crash_after_commit)
        with pytest.raises(KeyboardInterrupt):
            demo.run(spark, client, out, cfg, say=lambda line: None)
        monkeypatch.setattr(demo, "_finish", real_finish)
        assert CommitLog(client, cfg.table).next_version() == 2
        assert not os.path.exists(os.path.join(out, f"day={cfg.day(1)}"))
        # Debris of an uncommitted attempt at day 2 (a crashed or fenced-out writer).
        debris = os.path.join(out, demo.STAGING, f"day={cfg.day(2)}.t1")
        os.makedirs(debris)
        with open(os.path.join(debris, "part-junk.parquet"), "wb") as f:
            f.write(b"not parquet")
        result = demo.run(spark, client, out, cfg, say=lambda line: None)
        assert result.recovered == [1] and result.committed == [2, 3, 4]
        assert_committed_once(client, cfg, out, reference)


def test_run_that_lost_its_lock_is_refused_and_its_output_never_published(
    spark, raftkv_cluster, tmp_path, reference
):
    cfg = demo.DemoConfig(table="fenced", **CFG)
    out = str(tmp_path / "out")
    with Client(raftkv_cluster.endpoints, timeout_s=30) as client:

        def say(line):
            if "committed as version 1 " in line:  # someone deletes the lock key now
                client.delete(b"__raftkv/locks/demo/fenced/", prefix=True)

        with pytest.raises(FencedOutError):
            demo.run(spark, client, out, cfg, say=say)
        assert CommitLog(client, cfg.table).next_version() == 2
        assert sorted(os.listdir(out)) == [demo.STAGING, f"day={cfg.day(0)}", f"day={cfg.day(1)}"]
        result = demo.run(spark, client, out, cfg, say=lambda line: None)
        assert result.committed == [2, 3, 4]
        assert_committed_once(client, cfg, out, reference)


def test_leader_sigkilled_mid_run_every_day_committed_once_output_as_without_faults(
    spark, make_spark_cluster, tmp_path, reference
):
    cluster = make_spark_cluster()
    cfg = demo.DemoConfig(table="chaos", **CFG)
    out = str(tmp_path / "out")
    outcome = {}
    with (
        Client(cluster.endpoints, timeout_s=30) as client,
        Client(cluster.endpoints, timeout_s=30) as observer,
    ):

        def body():
            try:
                outcome["result"] = demo.run(spark, client, out, cfg, say=lambda line: None)
            except BaseException as exc:  # noqa: BLE001 - reported below
                outcome["error"] = exc

        t = threading.Thread(target=body)
        t.start()
        log = CommitLog(observer, cfg.table)
        wait_for(lambda: log.next_version() >= 2 or "error" in outcome, 180, "two days committed")
        leader = wait_for(lambda: leader_of(cluster), 30, "a leader")
        cluster.kill(leader)  # SIGKILL, mid-run
        t.join(300)
        assert not t.is_alive()
        assert "error" not in outcome, outcome.get("error")
        result = outcome["result"]
        assert result.status == "done" and result.committed == list(range(cfg.days))
        assert_committed_once(observer, cfg, out, reference)


def test_one_command_run_and_status(raftkv_cluster, tmp_path):
    out = str(tmp_path / "cli-out")
    args = [
        sys.executable,
        "-m",
        "kvserver.spark.demo",
        "--endpoints",
        ",".join(raftkv_cluster.endpoints),
        "--out",
        out,
        "--table",
        "cli",
        "--days",
        "2",
        "--events-per-day",
        "500",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done: committed 2 day(s) now, 2/2 in all" in done.stdout
    status = subprocess.run(
        [*args, "--status"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert status.returncode == 0
    assert '"status": "done"' in status.stdout and "version 1: day 2024-01-02" in status.stdout
