"""The wall clock misbehaving under real member processes (libfaketime preloaded into every
member; its offset file is rewritten by the test): stepped an hour forward, then an hour
back, and running fast. raftkv's timers (ticks, elections, lease expiry) live on the
monotonic clock, which libfaketime leaves alone here, as a stepped or slewed wall clock
leaves it alone on a real machine. Each test checks that the leader stays (no election
from the clock), that a lease neither expires early nor outlives its TTL by much in real
time, and that acknowledged writes are all there.

libfaketime's own speed-up (``x2``) is not used: under it ``time.sleep`` fails with EINVAL
in Python (its clock_nanosleep wrapper), so "fast" is an offset the test advances twice
as fast as real time, re-read by the members once a second.
"""

import threading
import time

import pytest

from tests.chaos import kvhttp as h
from tests.cluster.harness import call, wait_healthy
from tests.faults import shims
from tests.faults.support import FAST_TIMING, FaultCluster, Load, check_acked, metric
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

TTL_S = 6


def _grant(url: str, ttl: int) -> int:
    code, body = call(url, "/v3/lease/grant", {"TTL": ttl})
    assert code == 200, body
    return int(body["ID"])


def _exists(url: str, key: str) -> bool:
    code, body = h.get(url, key, timeout_s=5)
    assert code == 200, body
    return bool(h.kvs(body))


def _lease_lives_its_ttl(cluster: FaultCluster, name: str) -> float:
    """Grant a TTL_S lease, attach a key; returns how long (real time) the key lived. The
    caller changes the clock right after the grant."""
    leader = cluster.leader()
    lease = _grant(leader.client_url, TTL_S)
    granted = time.monotonic()
    code, body = h.put(leader.client_url, name, "x", timeout_s=5, lease=lease)
    assert code == 200, body
    return granted


def _check_lived(cluster: FaultCluster, name: str, granted: float) -> float:
    url = cluster.leader().client_url
    gone_at = wait_for(
        lambda: not _exists(url, name) and time.monotonic(), TTL_S + 20, f"{name} to expire"
    )
    lived = gone_at - granted
    # Not early (a wall-clock step forward would expire it at once) and not much later
    # than the TTL (a step back would keep it an hour).
    assert TTL_S - 1 <= lived <= TTL_S + 10, lived
    return lived


def _cluster(tmp_path, offset_file):
    env = shims.faketime_env(str(offset_file))
    return FaultCluster(
        str(tmp_path / "c"),
        size=3,
        extra_args=list(FAST_TIMING),
        node_env={f"node{i}": env for i in (1, 2, 3)},
    )


def _leader_changes(cluster: FaultCluster) -> float:
    return sum(metric(n, "raftkv_raft_leader_changes_seen_total") or 0 for n in cluster.nodes)


@pytest.mark.parametrize("step", ["+3600", "-3600"])
def test_wall_clock_steps(tmp_path, step):
    offset = tmp_path / "offset"
    cluster = _cluster(tmp_path, offset)
    cluster.start()
    load = None
    try:
        leader = wait_healthy(cluster)
        changes = _leader_changes(cluster)
        load = Load(cluster.endpoints, threads=4).start()
        granted = _lease_lives_its_ttl(cluster, "leased")
        shims.set_offset(str(offset), step)
        lived = _check_lived(cluster, "leased", granted)
        print(f"wall clock {step} s: the lease lived {lived:.1f} s of its {TTL_S} s TTL")
        wait_for(lambda: load.acked_count() > 200, 60, "writes across the step")
        # One election may come from a loaded machine (members stalled by other work); one
        # per member or more would be the clock's doing.
        assert _leader_changes(cluster) - changes <= 1, leader
        load.stop()
        check_acked(cluster, load.acked)
    finally:
        if load is not None:
            load.stop()
        cluster.stop()


def test_wall_clock_running_fast(tmp_path):
    offset = tmp_path / "offset"
    cluster = _cluster(tmp_path, offset)
    stop = threading.Event()

    def run_fast():  # the offset gains a second per real second: a clock at twice the speed
        started = time.monotonic()
        while not stop.wait(0.25):
            shims.set_offset(str(offset), f"+{time.monotonic() - started:.2f}")

    cluster.start()
    load = None
    fast = threading.Thread(target=run_fast, daemon=True)
    try:
        leader = wait_healthy(cluster)
        changes = _leader_changes(cluster)
        load = Load(cluster.endpoints, threads=4).start()
        fast.start()
        granted = _lease_lives_its_ttl(cluster, "leased")
        lived = _check_lived(cluster, "leased", granted)
        print(f"wall clock at 2x: the lease lived {lived:.1f} s of its {TTL_S} s TTL")
        # One election may come from a loaded machine (members stalled by other work); one
        # per member or more would be the clock's doing.
        assert _leader_changes(cluster) - changes <= 1, leader
        load.stop()
        check_acked(cluster, load.acked)
    finally:
        stop.set()
        if load is not None:
            load.stop()
        cluster.stop()
