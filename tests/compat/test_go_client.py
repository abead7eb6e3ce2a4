"""etcd's own Go client (clientv3 3.4) against a three-member raftkv, unmodified.

``benchmarks/etcdbench`` is built from Debian's etcd sources (``make etcd-bench``): puts and
linearizable ranges from many goroutines over several connections succeed without an error,
and a watch fan-out (200 watches on one prefix over 10 connections, a writer at 50 puts a
second) delivers every event to every watcher, exactly the count the writer's puts imply.
The members run as ``raftkv serve`` defaults them: with client front ends.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import leader_of, wait_healthy
from tests.conftest import require_program

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, ".build", "etcd-bench")


@pytest.fixture(scope="module")
def etcd_bench() -> str:
    require_program("go", "Debian's golang-go and golang-etcd-server-dev")
    subprocess.run(["make", "-s", "etcd-bench"], cwd=ROOT, check=True, timeout=600)
    return BINARY


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("go")), size=3)
    c.start()
    try:
        wait_healthy(c)
        yield c
    finally:
        c.stop()


def run(binary: str, endpoint: str, *args: str) -> dict:
    out = subprocess.run(
        [binary, "-endpoints", endpoint, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def test_puts_and_ranges_from_the_go_client(etcd_bench, cluster):
    leader = leader_of(cluster)
    assert leader is not None
    endpoint = f"127.0.0.1:{leader.client_port}"
    for op in ("put", "range"):
        r = run(etcd_bench, endpoint, "-op", op, "-clients", "16", "-conns", "4", "-duration", "2s")
        assert r["errors"] == 0 and r["ops"] > 100, r


def test_every_watcher_gets_every_event(etcd_bench, cluster):
    leader = leader_of(cluster)
    assert leader is not None
    endpoint = f"127.0.0.1:{leader.client_port}"
    r = run(
        etcd_bench,
        endpoint,
        "-op",
        "watch",
        "-watchers",
        "200",
        "-conns",
        "10",
        "-rate",
        "50",
        "-duration",
        "3s",
    )
    assert r["ops"] >= 100, r  # the writer's puts
    assert r["events"] == r["expected_events"], r
