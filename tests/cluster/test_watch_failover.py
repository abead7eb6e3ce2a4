"""Watch under failover: a prefix watch through the client survives a SIGKILL of the
leader serving it and sees every committed write exactly once, in revision order.

Three real ``raftkv serve`` processes. The client's watch is created on the leader (the client
sends watches to the leader when it knows it); a writer puts unique keys through the client
(retries carry the same request id, so a put is applied at most once); half way through, the
leader is killed with SIGKILL. The watch's stream breaks, the client reconnects to a survivor
with ``start_revision = last seen + 1``, and the events it yields must equal, element by
element, the committed puts in revision order — taken from a linearizable read of the prefix
at the end (each key is put once and never deleted, so the final state lists every committed
put with its revision). A sentinel put after the writer finishes marks the end: anything
repeated or out of order would show up before it.
"""

import threading

import pytest

from kvserver.client import Client, ClientError
from tests.cluster.harness import leader_of, wait_healthy
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

N_PUTS = 240
KILL_AT = N_PUTS // 2
CLIENT = dict(
    timeout_s=10.0,
    attempt_timeout_s=1.0,
    connect_timeout_s=0.5,
    backoff_initial_s=0.02,
    backoff_max_s=0.2,
)


def test_prefix_watch_survives_leader_kill_and_sees_each_commit_once(make_cluster):
    cluster = make_cluster(3)
    leader = wait_healthy(cluster)
    with (
        Client(cluster.endpoints, **CLIENT) as watch_client,
        Client(cluster.endpoints, **CLIENT) as writer,
    ):
        watch = watch_client.watch("w/", prefix=True, reconnect_timeout_s=30)
        assert watch.endpoint == leader.client_url  # so the kill breaks this very stream
        first_rev = watch.next_revision

        acked: list[str] = []
        failed: list[str] = []
        killed = threading.Event()

        def write() -> None:
            for i in range(N_PUTS):
                if i == KILL_AT:
                    cluster.kill(leader)  # SIGKILL, waits for the process to be gone
                    killed.set()
                key = f"w/{i:04d}"
                try:
                    writer.put(key, f"v{i}")
                    acked.append(key)
                except ClientError:
                    failed.append(key)  # outcome unknown: maybe committed, maybe not

        thread = threading.Thread(target=write, daemon=True)
        thread.start()
        events = []
        while thread.is_alive() or not killed.is_set():
            try:
                events.append(watch.get(timeout_s=0.5))
            except TimeoutError:
                pass
        thread.join()
        survivors = [n for n in cluster.nodes if n.alive()]
        wait_for(lambda: leader_of(cluster, survivors), 20, "a new leader")
        sentinel = writer.put("w/~end", "end").revision
        while not events or events[-1].key != b"w/~end":
            events.append(watch.get(timeout_s=20))
        final = writer.range("w/", prefix=True)
        watch.close()

    committed = sorted((kv.mod_revision, kv.key, kv.value) for kv in final.kvs)
    got = [(ev.revision, ev.key, ev.value) for ev in events]
    assert all(ev.is_put for ev in events)
    assert len(committed) >= len(acked) + 1
    assert {f"w/{i:04d}".encode() for i in range(N_PUTS)} >= {k for _, k, _ in committed} - {
        b"w/~end"
    }
    assert {a.encode() for a in acked} <= {k for _, k, _ in committed}
    assert got == committed  # every committed put once, in revision order, nothing else
    assert got[0][0] >= first_rev and got[-1][0] == sentinel
    assert watch.reconnects >= 1 and watch.endpoint != leader.client_url
    print(
        f"{len(got)} events, {len(acked)} acked puts, {len(failed)} with unknown outcome, "
        f"{watch.reconnects} reconnect(s)"
    )
