"""Lease safety under failover, on a three-node raftkv of real processes.

As in etcd, only the leader expires leases (by proposing a revoke through
raft), and a new leader extends every remaining TTL by an election timeout, so

1. a lease that its holder keeps alive — through a client that fails over between members —
   is never expired by a leader change: the leader is SIGKILLed while the lease is held and
   the lease and its keys are still there after several TTLs;
2. a lease whose holder stops keeping it alive is expired, and its keys deleted, within
   TTL + one election timeout of the last keep-alive (asserted with a generous deadline,
   never as a timing equality), with or without a leader kill in between.

The keep-alive "client" here is a small loop over the gateway (``/v3/lease/keepalive``) that
tries the members in turn: a follower answers a retryable "not leader" (503), a dead member
refuses the connection, and the loop moves on, as a failover client does. Timing: heartbeat
50 ms, election timeout 500 ms (``tests/cluster/conftest.py``).
"""

import signal
import threading
import time

import pytest

from tests.cluster.harness import b64, call, get, leader_of, put, wait_healthy
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

ELECTION_TIMEOUT_S = 0.5
SLACK_S = 10.0  # scheduling noise on a shared two-core machine, and the election itself


def grant(cluster, lease_id: int, ttl_s: int) -> None:
    node = next(n for n in cluster.nodes if n.alive())
    code, body = call(node.client_url, "/v3/lease/grant", {"ID": str(lease_id), "TTL": ttl_s})
    assert code == 200 and body["TTL"] == str(ttl_s), body


def keepalive_once(cluster, lease_id: int) -> int | None:
    """One keep-alive through whichever member answers: the TTL, 0 if the lease is gone
    (no TTL in the answer, as etcd), None if no member could answer."""
    for node in [n for n in cluster.nodes if n.alive()]:
        try:
            code, body = call(
                node.client_url, "/v3/lease/keepalive", {"ID": str(lease_id)}, timeout_s=2.0
            )
        except OSError:
            continue  # dead or unreachable: try the next member
        if code == 200 and "result" in body:
            return int(body["result"].get("TTL", 0))
    return None


class KeepAlive:
    """A holder refreshing a lease every ``interval_s`` in a thread, with failover."""

    def __init__(self, cluster, lease_id: int, interval_s: float):
        self.cluster, self.lease_id, self.interval_s = cluster, lease_id, interval_s
        self.acks: list[tuple[float, int]] = []  # (monotonic time, TTL answered)
        self.misses = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            ttl = keepalive_once(self.cluster, self.lease_id)
            if ttl is None:
                self.misses += 1
                self._stop.wait(0.05)  # no member answered (an election): retry soon
                continue
            self.acks.append((time.monotonic(), ttl))
            self._stop.wait(self.interval_s)

    def start(self) -> "KeepAlive":
        self._thread.start()
        return self

    def stop(self) -> float:
        """Stop refreshing; returns the time of the last acknowledged keep-alive."""
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive()
        return self.acks[-1][0]


def live_url(cluster) -> str:
    return next(n.client_url for n in cluster.nodes if n.alive())


def time_to_live(cluster, lease_id: int) -> int:
    """The lease's remaining TTL as the leader reports it (-1: not found)."""

    def ask():
        lead = leader_of(cluster)
        if lead is None:
            return None
        code, body = call(lead.client_url, "/v3/lease/timetolive", {"ID": str(lease_id)})
        return (int(body["TTL"]),) if code == 200 else None  # a tuple: truthy even for 0

    return wait_for(ask, 20, "a time-to-live answer from the leader")[0]


def test_lease_kept_alive_across_a_leader_kill_is_not_expired(make_cluster):
    cluster = make_cluster()
    ttl_s, lease_id = 3, 0x1001
    grant(cluster, lease_id, ttl_s)
    for k in ("held/a", "held/b"):
        code, body = call(
            live_url(cluster),
            "/v3/kv/put",
            {"key": b64(k), "value": b64("v"), "lease": str(lease_id)},
        )
        assert code == 200, body
    holder = KeepAlive(cluster, lease_id, interval_s=ttl_s / 3).start()
    try:
        wait_for(lambda: len(holder.acks) >= 2, 10, "two keep-alives before the kill")
        old = leader_of(cluster)
        assert old is not None
        cluster.kill(old, signal.SIGKILL)
        killed_at = time.monotonic()
        survivors = [n for n in cluster.nodes if n.alive()]
        new = wait_healthy(cluster, timeout_s=30, among=survivors)
        assert new is not old
        # Hold on for three TTLs after the kill: without keep-alives (or with a leader that
        # lost the refreshed deadlines) the lease would be gone long before.
        wait_for(
            lambda: time.monotonic() - killed_at > 3 * ttl_s,
            4 * ttl_s + SLACK_S,
            "three TTLs after the kill",
            interval_s=0.2,
        )
        after_kill = [ttl for t, ttl in holder.acks if t > killed_at]
        assert len(after_kill) >= 3, holder.acks  # refreshed through the new leader
        assert all(ttl == ttl_s for ttl in after_kill), holder.acks  # never "not found"
        for node in survivors:
            assert get(node.client_url, "held/a") == "v", node.name
            assert get(node.client_url, "held/b") == "v", node.name
        assert 0 < time_to_live(cluster, lease_id) <= ttl_s
    finally:
        holder.stop()


@pytest.mark.parametrize("kill_leader", [False, True], ids=["steady", "leader-killed"])
def test_lease_of_a_stopped_holder_expires_within_ttl_plus_election_timeout(
    make_cluster, kill_leader
):
    cluster = make_cluster()
    ttl_s, lease_id = 2, 0x2002
    grant(cluster, lease_id, ttl_s)
    code, body = call(
        live_url(cluster),
        "/v3/kv/put",
        {"key": b64("gone/a"), "value": b64("v"), "lease": str(lease_id)},
    )
    assert code == 200, body
    put(live_url(cluster), "gone/unleased", "stays")
    holder = KeepAlive(cluster, lease_id, interval_s=0.5).start()
    wait_for(lambda: len(holder.acks) >= 3, 10, "a few keep-alives")
    last_refresh = holder.stop()
    if kill_leader:
        old = leader_of(cluster)
        assert old is not None
        cluster.kill(old, signal.SIGKILL)
    survivors = [n for n in cluster.nodes if n.alive()]

    def deleted_everywhere() -> bool:
        try:
            return all(get(n.client_url, "gone/a", timeout_s=2) is None for n in survivors)
        except (AssertionError, OSError):
            return False  # no leader yet (an election in progress): ask again

    deadline_s = ttl_s + ELECTION_TIMEOUT_S + SLACK_S
    wait_for(
        deleted_everywhere,
        deadline_s - (time.monotonic() - last_refresh),
        "the expired lease's key to be deleted on every live member",
        interval_s=0.1,
    )
    assert time.monotonic() - last_refresh <= deadline_s
    assert time_to_live(cluster, lease_id) == -1
    assert keepalive_once(cluster, lease_id) == 0  # etcd: no TTL for a lost lease
    for node in survivors:
        assert get(node.client_url, "gone/unleased") == "stays"
