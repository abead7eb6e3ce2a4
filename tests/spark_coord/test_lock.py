"""FencedLock against real raftkv processes: queue order, fencing token, loss signalled, and a
holder whose lease expired is refused by the store (etcd's concurrency.Mutex semantics, plus
what Hudi's and Iceberg's lock providers lack: telling the writer, refusing its commit)."""

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from kvserver.client import Client
from kvserver.spark.commitlog import CommitLog
from kvserver.spark.fencing import Fence, FencedOutError
from kvserver.spark.lock import FencedLock, LockTimeoutError
from tests.support.wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def queue_len(client, lock):
    return client.range(lock.prefix, prefix=True, count_only=True).count


def test_token_is_the_create_revision_of_the_holders_key_and_release_deletes_it(client):
    lock = FencedLock(client, "token", ttl=5)
    fence = lock.acquire(timeout=10)
    kv = client.get(fence.key)
    assert kv is not None and kv.create_revision == fence.token == lock.token
    assert kv.lease == lock.lease_id
    assert fence.key.startswith(b"__raftkv/locks/token/")
    assert lock.held and lock.fence() == fence
    lock.release()
    assert client.get(fence.key) is None
    assert not lock.lost.is_set()  # a release is not a loss
    with pytest.raises(RuntimeError, match="not held"):
        lock.fence()
    lock.release()  # idempotent


def test_waiters_acquire_in_creation_order_one_at_a_time_with_increasing_tokens(kv_node):
    clients = [Client(kv_node.endpoints, timeout_s=10) for _ in range(4)]
    try:
        locks = [FencedLock(c, "queue", ttl=5) for c in clients]
        first = locks[0].acquire(timeout=10)
        order, tokens, holding = [], [], []
        overlap = []

        def wait_turn(i):
            fence = locks[i].acquire(timeout=60)
            holding.append(i)
            overlap.append(len(holding))
            order.append(i)
            tokens.append(fence.token)
            holding.remove(i)

        threads = []
        for i in (1, 2, 3):  # enqueue one by one so the creation order is known
            t = threading.Thread(target=wait_turn, args=(i,))
            t.start()
            threads.append(t)
            wait_for(
                lambda n=i + 1: queue_len(clients[0], locks[0]) == n,
                20,
                f"{i + 1} keys in the queue",
            )
        assert order == []  # nobody gets past the holder
        locks[0].release()
        for i in (1, 2, 3):
            wait_for(lambda i=i: i in order, 30, f"waiter {i} to acquire")
            assert locks[i].held
            locks[i].release()
        for t in threads:
            t.join(10)
        assert order == [1, 2, 3]
        assert tokens == sorted(tokens) and tokens[0] > first.token
        assert max(overlap) == 1
    finally:
        for c in clients:
            c.close()


def test_acquire_timeout_withdraws_the_waiter(kv_node):
    with Client(kv_node.endpoints) as a, Client(kv_node.endpoints) as b:
        holder = FencedLock(a, "timeout", ttl=5)
        holder.acquire(timeout=10)
        waiter = FencedLock(b, "timeout", ttl=5)
        with pytest.raises(LockTimeoutError, match="not acquired in time"):
            waiter.acquire(timeout=0.5)
        assert queue_len(a, holder) == 1 and waiter.key is None
        holder.release()
        with waiter:  # usable again after the timeout
            assert waiter.held
        assert queue_len(a, holder) == 0


def test_deleted_key_is_signalled_by_event_callback_and_exception_and_the_store_refuses(client):
    reasons = []
    lock = FencedLock(client, "deleted", ttl=5, on_lost=reasons.append)
    fence = lock.acquire(timeout=10)
    log = CommitLog(client, "deleted-table")
    log.commit(0, b"ok", fence=lock)
    client.delete(fence.key)  # e.g. an operator removes it
    assert lock.lost.wait(10)
    wait_for(lambda: reasons, 5, "the on_lost callback")
    assert len(reasons) == 1 and "deleted at revision" in reasons[0]
    assert not lock.held
    with pytest.raises(FencedOutError, match="deleted at revision"):
        log.commit(1, b"late", fence=lock)  # refused before sending: the lock knows
    with pytest.raises(FencedOutError, match="no longer exists"):
        log.commit(1, b"late", fence=fence)  # refused by the store
    assert log.get(1) is None and log.latest().version == 0
    lock.release()
    assert len(reasons) == 1


def test_stopped_keepalive_loses_the_lock_to_the_next_waiter_and_old_fence_is_refused(kv_node):
    with Client(kv_node.endpoints, timeout_s=10) as a, Client(kv_node.endpoints) as b:
        reasons = []
        old = FencedLock(a, "expiry", ttl=1, on_lost=reasons.append)
        old_fence = old.acquire(timeout=10)
        new = FencedLock(b, "expiry", ttl=5)
        got = []
        t = threading.Thread(target=lambda: got.append(new.acquire(timeout=30)))
        t.start()
        wait_for(lambda: queue_len(a, old) == 2, 10, "the waiter's key")
        old._keepalive.close()  # a driver that stopped refreshing (paused, partitioned)
        t.join(40)
        assert got and got[0].token > old_fence.token
        assert old.lost.wait(10) and reasons
        log = CommitLog(b, "expiry-table")
        log.commit(0, b"new holder", fence=new)
        with pytest.raises(FencedOutError) as info:
            log.commit(1, b"old holder", fence=old_fence)
        assert "no longer exists" in str(info.value)
        assert [e.payload for e in log.history()] == [b"new holder"]
        new.release()
        old.release()


def test_racing_unlocked_writers_one_commits_each_version_the_other_is_refused(kv_node):
    versions = 12
    clients = [Client(kv_node.endpoints, timeout_s=10) for _ in range(2)]
    barrier = threading.Barrier(2, timeout=30)
    outcomes = {0: [], 1: []}

    def writer(i):
        log = CommitLog(clients[i], "race")
        for v in range(versions):
            barrier.wait()
            try:
                log.commit(v, f"writer{i}".encode())
                outcomes[i].append(("ok", v, None))
            except Exception as exc:  # noqa: BLE001
                outcomes[i].append((type(exc).__name__, v, getattr(exc, "existing", None)))

    threads = [threading.Thread(target=writer, args=(i,)) for i in (0, 1)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        log = CommitLog(clients[0], "race")
        entries = list(log.history())
        assert [e.version for e in entries] == list(range(versions))
        for v in range(versions):
            results = [outcomes[0][v], outcomes[1][v]]
            kinds = sorted(r[0] for r in results)
            assert kinds == ["CommitConflictError", "ok"], results
            refused = next(r for r in results if r[0] != "ok")
            assert refused[2].payload == entries[v].payload  # told who won
            assert clients[0].get(log.key(v)).version == 1  # written once, never overwritten
    finally:
        for c in clients:
            c.close()


def test_bad_arguments():
    with pytest.raises(ValueError):
        FencedLock(None, "", ttl=5)
    with pytest.raises(ValueError):
        FencedLock(None, "x", ttl=0)
    with pytest.raises(ValueError):
        Fence(b"k", 0)


@pytest.mark.slow
def test_paused_driver_cannot_commit_after_the_lock_moved_on_and_is_told_why(make_cluster):
    """SIGSTOP a driver process past its lease TTL: the store expires its lease, the next
    driver takes the lock and commits; resumed, the old driver's commits are refused (through
    the lock, and with the raw fence it held) and it is told why."""
    cluster = make_cluster()
    endpoints = ",".join(cluster.endpoints)
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.spark_coord.driver",
            endpoints,
            "paused",
            "paused-table",
            "2",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["ready"] and ready["version"] == 0
        proc.send_signal(signal.SIGSTOP)
        with Client(cluster.endpoints, timeout_s=10) as client:
            lock = FencedLock(client, "paused", ttl=5)
            fence = lock.acquire(timeout=60)  # waits for the paused driver's lease to expire
            assert fence.token > ready["token"]
            log = CommitLog(client, "paused-table")
            log.commit(1, b"second driver", fence=lock)
            proc.send_signal(signal.SIGCONT)
            proc.stdin.write("commit\n")
            proc.stdin.flush()
            lines = [json.loads(proc.stdout.readline()) for _ in range(3)]
            assert proc.wait(30) == 0
            by_how = {line.get("how"): line for line in lines}
            assert by_how["lock"]["outcome"] == "fenced_out"
            assert by_how["raw_fence"]["outcome"] == "fenced_out"
            assert "no longer exists" in by_how["raw_fence"]["message"]
            assert lines[2]["lost"] and lines[2]["callbacks"] == 1 and lines[2]["reason"]
            assert [e.payload for e in log.history()] == [b"driver", b"second driver"]
            lock.release()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait(10)
