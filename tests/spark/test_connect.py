"""The raftkv data source, FencedLock and CommitLog from a Spark Connect session.

A local Spark Connect server (PySpark's own: a classic session with the Connect plugin, in a
child process, bound to 127.0.0.1 on a free port) runs the data source in its Python
workers; this process is only a Connect client (``SparkSession.builder.remote``, Connect's
own builder, so it works beside the classic session of the other Spark tests). Then:

- ``register(spark)`` works on the Connect session (the source class is shipped to the
  server);
- a batch write under a ``FencedLock``'s fence (the fence travels as write options), read
  back by a batch read: the same rows;
- the ``CommitLog`` commits under the same lock from this process, and after the lock is
  released a write carrying the old fence is refused by the store (``FencedOutError`` in the
  Connect error) and applies nothing;
- the changefeed of the written prefix, streamed by the server into the raftkv sink with
  ``Trigger.AvailableNow``, copies every event once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from kvserver.client import Client
from kvserver.localcluster.launcher import free_ports
from kvserver.spark.commitlog import CommitLog
from kvserver.spark.lock import FencedLock
from tests.support.procs import stop_process
from tests.support.wait import wait_for

SERVER = r"""
import sys
from pyspark.sql import SparkSession

port = sys.argv[1]
spark = (
    SparkSession.builder.master("local[2]")
    .appName("raftkv-connect-server")
    .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
    .config("spark.connect.grpc.binding.address", "127.0.0.1")
    .config("spark.connect.grpc.binding.port", port)
    .config("spark.ui.enabled", "false")
    .config("spark.driver.host", "127.0.0.1")
    .config("spark.driver.bindAddress", "127.0.0.1")
    .config("spark.sql.shuffle.partitions", "2")
    .getOrCreate()
)
print("ready", flush=True)
sys.stdin.read()  # until the test closes our stdin
spark.stop()
"""


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    pytest.importorskip("grpc_status", reason="Spark Connect's client needs grpcio-status")
    pytest.importorskip("zstandard", reason="Spark Connect's client needs zstandard")
    log_path = tmp_path_factory.mktemp("connect") / "server.log"
    port = free_ports(1)[0]
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    ready = threading.Event()

    def watch_stdout():
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == b"ready":
                ready.set()

    threading.Thread(target=watch_stdout, daemon=True).start()
    try:
        wait_for(lambda: ready.is_set() or proc.poll() is not None, 180, "the Connect server")
        if not ready.is_set():
            raise AssertionError(f"the Connect server exited: {log_path.read_text()[-3000:]}")
        wait_for(lambda: _port_open(port), 60, f"the Connect server on 127.0.0.1:{port}")
        # Connect's own builder: pyspark's generic one refuses a remote session while a
        # classic one is active in this process (the other Spark tests' session).
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        session = RemoteSparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        try:
            from kvserver.spark import register

            register(session)
            yield session
        finally:
            session.stop()
    finally:
        if proc.stdin is not None:
            try:
                proc.stdin.close()  # the server stops its session and exits
            except OSError:
                pass
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        stop_process(proc, 10)
        log.close()


def test_source_lock_and_commit_log_from_a_connect_session(connect, raftkv_cluster, tmp_path):
    spark = connect
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    opts = {"endpoints": ",".join(raftkv_cluster.endpoints)}
    rows = [(f"conn/{i:03d}", f"v{i}") for i in range(50)]
    with Client(raftkv_cluster.endpoints, timeout_s=30) as kv:
        with FencedLock(kv, "connect-table", ttl=30) as lock:
            fence = lock.fence()
            df = spark.createDataFrame(rows, "key string, value string")
            df.write.format("raftkv").options(**opts, **fence.to_options()).mode("append").save()
            got = (
                spark.read.format("raftkv")
                .options(**opts)
                .option("prefix", "conn/")
                .option("valueFormat", "string")
                .load()
                .select("key", "value")
                .collect()
            )
            assert sorted((r.key, r.value) for r in got) == rows
            log = CommitLog(kv, "connect-table")
            version = log.next_version()
            log.commit(version, {"rows": len(rows)}, fence=lock)
            latest = log.latest()
            assert latest is not None and latest.version == version
        # The lock is released: its fence is stale, and the store refuses the write.
        stale = spark.createDataFrame([("conn/stale", "x")], "key string, value string")
        with pytest.raises(Exception) as err:
            stale.write.format("raftkv").options(**opts, **fence.to_options()).mode("append").save()
        assert "FencedOutError" in str(err.value) or "fence" in str(err.value).lower()
        assert not kv.range("conn/stale").kvs, "a write with a stale fence applied"
        assert kv.range("conn/", prefix=True).count == len(rows)

        # The changefeed of conn/ into connout/, run by the Connect server.
        ckpt = str(tmp_path / "checkpoint")  # the server is local: it sees this path
        feed = (
            spark.readStream.format("raftkv")
            .options(**opts)
            .option("changefeed", "true")
            .option("prefix", "conn/")
            .option("startingRevision", "earliest")
            .option("valueFormat", "string")
            .load()
        )
        query = (
            feed.selectExpr("concat('connout/', key) AS key", "value")
            .writeStream.format("raftkv")
            .options(**opts)
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert not query.isActive, "the changefeed query did not finish within 180 s"
        assert query.exception() is None, query.exception()
        copied = kv.range("connout/", prefix=True).kvs
        got_copy = sorted((k.key.decode()[len("connout/") :], k.value.decode()) for k in copied)
        assert got_copy == rows
        assert {k.version for k in copied} == {1}, "an event was copied twice"
