"""Real ``raftkv serve`` processes on loopback: replication, failover, durability, recovery.

A write acknowledged to a client is on a majority's disks and survives kill -9 of
a minority and of the whole cluster; a member with a torn WAL tail repairs it and rejoins; a
member with corrupt data refuses to start and says where and what to run.
"""

import contextlib
import io
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.cluster.harness import call, get, get_prefix, leader_of, put, status, wait_healthy
from tests.support.wait import wait_for


class Writer:
    """Threads that put unique keys through any live node and remember what was acked."""

    def __init__(self, cluster, prefix: str, threads: int = 4):
        self.cluster = cluster
        self.prefix = prefix
        self.acked: dict[str, str] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(t,), daemon=True) for t in range(threads)
        ]

    def _run(self, t: int) -> None:
        i = 0
        while not self._stop.is_set():
            nodes = [n for n in self.cluster.nodes if n.alive()]
            if not nodes:  # the whole cluster is down: nothing can be acknowledged
                time.sleep(0.01)
                continue
            node = nodes[(t + i) % len(nodes)]
            key, value = f"{self.prefix}{t:02d}-{i:06d}", f"v{t}-{i}"
            try:
                put(node.client_url, key, value, timeout_s=3)
                with self._lock:
                    self.acked[key] = value
                i += 1
            except (AssertionError, OSError):
                with self._lock:
                    self.errors += 1  # not acknowledged: may or may not be applied
                time.sleep(0.01)

    def start(self):
        for th in self._threads:
            th.start()
        return self

    def stop(self) -> dict[str, str]:
        self._stop.set()
        for th in self._threads:
            th.join(timeout=10)
        return dict(self.acked)


def assert_all_present(cluster, acked: dict[str, str], prefix: str) -> None:
    """Every acknowledged write is on every node (linearizable read served by each)."""
    for node in cluster.nodes:
        have = get_prefix(node.client_url, prefix)
        missing = [k for k in acked if have.get(k) != acked[k]]
        assert not missing, f"{node.name} lost {len(missing)} acked writes, e.g. {missing[:3]}"


def test_put_and_get_through_every_node(make_cluster):
    cluster = make_cluster()
    for i, node in enumerate(cluster.nodes):
        put(node.client_url, f"key{i}", f"value{i}")
    for node in cluster.nodes:
        for i in range(len(cluster.nodes)):
            assert get(node.client_url, f"key{i}") == f"value{i}"
    # a serializable read from any node converges to the same answer
    for node in cluster.nodes:
        wait_for(
            lambda n=node: get(n.client_url, "key2", serializable=True) == "value2",
            5,
            f"{node.name} to apply key2",
        )


@pytest.mark.slow
def test_leader_killed_during_writes_new_leader_quickly_and_nothing_lost(make_cluster):
    cluster = make_cluster()
    writer = Writer(cluster, "w/").start()
    wait_for(lambda: len(writer.acked) >= 50, 20, "50 acknowledged writes")
    old = leader_of(cluster)
    cluster.kill(old, signal.SIGKILL)
    killed_at = time.monotonic()
    survivors = [n for n in cluster.nodes if n is not old]
    new = wait_for(lambda: leader_of(cluster, survivors), 10, "a new leader")
    elected_s = time.monotonic() - killed_at
    assert new is not old
    assert elected_s < 3.0, f"new leader after {elected_s:.2f}s (want < 3 s)"
    count = len(writer.acked)
    wait_for(lambda: len(writer.acked) >= count + 50, 20, "writes to continue")
    acked = writer.stop()
    cluster.start_node(old)
    wait_healthy(cluster)
    assert_all_present(cluster, acked, "w/")


@pytest.mark.slow
def test_whole_cluster_killed_and_restarted_keeps_every_acked_write(make_cluster):
    cluster = make_cluster()
    writer = Writer(cluster, "all/").start()
    wait_for(lambda: len(writer.acked) >= 200, 30, "200 acknowledged writes")
    for node in cluster.nodes:  # kill -9 while writes are in flight
        cluster.kill(node, signal.SIGKILL)
    acked = writer.stop()
    cluster.start()
    wait_healthy(cluster)
    assert_all_present(cluster, acked, "all/")


@pytest.mark.slow
def test_stopped_follower_catches_up_through_a_snapshot(make_cluster):
    cluster = make_cluster(
        extra_args=[
            "--snapshot-count",
            "50",
            "--snapshot-catchup-entries",
            "10",
            "--snapshot-catchup-bytes",
            "0",
        ]
    )
    lead = leader_of(cluster)
    follower = next(n for n in cluster.nodes if n is not lead)
    cluster.kill(follower, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        # One put at a time: one append message each, more than the leader's inflight
        # window (512), so the leader stops sending, and compacts past what the follower has.
        for i in range(800):
            put(lead.client_url, f"snap/{i:04d}", f"v{i}")
        # Stay stopped past the transport's liveness check (WebSocket ping every 2 s).
        time.sleep(max(0.0, 5.0 - (time.monotonic() - stopped_at)))
    finally:
        cluster.kill(follower, signal.SIGCONT)
    wait_for(
        lambda: get(follower.client_url, "snap/0799", serializable=True) == "v799",
        20,
        "the stopped follower to catch up",
    )
    log = open(follower.log_path).read()
    assert "restored snapshot" in log, "the follower caught up without a snapshot"
    assert get_prefix(follower.client_url, "snap/", serializable=True) == {
        f"snap/{i:04d}": f"v{i}" for i in range(800)
    }


def _wal_records(wal_dir: str) -> list[dict]:
    from kvserver.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["wal", "dump", "--json", wal_dir])
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


@pytest.mark.slow
def test_torn_wal_tail_is_repaired_and_the_member_rejoins(make_cluster):
    cluster = make_cluster()
    lead = leader_of(cluster)
    for i in range(20):
        put(lead.client_url, f"torn/{i}", f"v{i}")
    victim = next(n for n in cluster.nodes if n is not lead)
    cluster.kill(victim, signal.SIGKILL)
    wal_dir = os.path.join(victim.data_dir, "member", "wal")
    last = _wal_records(wal_dir)[-1]
    end = last["offset"] + last["frame_bytes"]
    # A crash in the middle of a large write: the length word and the first sectors of a
    # 4 KiB record reached the disk, the later sectors did not (still preallocated zeros).
    with open(os.path.join(wal_dir, last["segment"]), "r+b") as f:
        f.seek(end)
        f.write((4096).to_bytes(8, "little") + b"\x08\x02\x10" + b"\x7f" * 597)
    for i in range(20, 30):
        put(lead.client_url, f"torn/{i}", f"v{i}")
    cluster.start_node(victim)
    wait_healthy(cluster)
    assert "torn" in open(victim.log_path).read()
    assert get_prefix(victim.client_url, "torn/") == {f"torn/{i}": f"v{i}" for i in range(30)}


@pytest.mark.slow
def test_corrupt_wal_in_the_middle_refuses_to_start_with_file_offset_and_command(make_cluster):
    cluster = make_cluster()
    lead = leader_of(cluster)
    for i in range(30):
        put(lead.client_url, f"bad/{i}", "x" * 100)
    victim = next(n for n in cluster.nodes if n is not lead)
    cluster.kill(victim, signal.SIGKILL)
    wal_dir = os.path.join(victim.data_dir, "member", "wal")
    entries = [r for r in _wal_records(wal_dir) if r["type"] == "entry"]
    target = entries[len(entries) // 2]
    with open(os.path.join(wal_dir, target["segment"]), "r+b") as f:
        f.seek(target["offset"] + target["frame_bytes"] - 12)  # inside the entry's data
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x55]))
    cluster.start_node(victim)
    victim.proc.wait(timeout=20)
    assert victim.proc.returncode not in (0, None)
    log = open(victim.log_path).read()
    assert target["segment"] in log and "offset" in log and "raftkv wal repair" in log
    # the rest of the cluster keeps serving
    put(lead.client_url, "bad/after", "ok")
    assert get(lead.client_url, "bad/after") == "ok"


def test_retried_write_with_the_same_request_id_is_applied_once(make_cluster):
    cluster = make_cluster()
    node = cluster.nodes[0]
    before = int(call(node.client_url, "/v3/kv/range", {"key": "eA=="})[1]["header"]["revision"])
    ids = {"X-Raftkv-Client-Id": "4242", "X-Raftkv-Request-Id": "7"}
    body = {"key": "ZGVkdXA=", "value": "b25jZQ=="}
    try:  # the client gives up at once (a forced timeout); the server still applies it
        call(node.client_url, "/v3/kv/put", body, timeout_s=0.001, headers=ids)
    except OSError:
        pass
    code, first = call(cluster.nodes[1].client_url, "/v3/kv/put", body, headers=ids)
    assert code == 200
    code, again = call(cluster.nodes[2].client_url, "/v3/kv/put", body, headers=ids)
    assert code == 200
    after = int(call(node.client_url, "/v3/kv/range", {"key": "eA=="})[1]["header"]["revision"])
    assert after == before + 1, "the retried write was applied more than once"
    assert first["header"]["revision"] == again["header"]["revision"] == str(after)


def test_bad_input_is_refused_and_changes_nothing(make_cluster):
    cluster = make_cluster()
    url = cluster.nodes[0].client_url
    rev = call(url, "/v3/kv/range", {"key": "eA=="})[1]["header"]["revision"]
    cases = [
        ("/v3/kv/put", b"{not json"),
        ("/v3/kv/put", json.dumps({"key": "!!!notbase64", "value": "eA=="}).encode()),
        ("/v3/kv/put", json.dumps({"value": "eA=="}).encode()),
        ("/v3/kv/put", json.dumps({"key": "eA==", "value": "A" * (2 << 20)}).encode()),
        ("/v3/kv/range", json.dumps({"key": "eA==", "limit": "lots"}).encode()),
        ("/v3/no/such/path", b"{}"),
    ]
    for path, raw in cases:
        req = urllib.request.Request(url + path, data=raw, method="POST")
        try:
            urllib.request.urlopen(req, timeout=5)
            code = 200
        except urllib.error.HTTPError as exc:
            code = exc.code
            body = json.loads(exc.read())
            assert body.get("error") or body.get("message"), (path, body)
        assert 400 <= code < 500, (path, raw[:40], code)
    assert call(url, "/v3/kv/range", {"key": "eA=="})[1]["header"]["revision"] == rev
    assert all(status(n)["leader"] for n in cluster.nodes), "a node lost its leader"
