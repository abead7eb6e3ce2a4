"""Fixtures for the Spark-free coordination tests (lock, commit log, exactly-once wrapper).

They run against real ``raftkv serve`` processes on loopback (fast ticks: heartbeat 50 ms,
election 500 ms, so the minimum lease TTL is 1 s). ``kv_node`` is one member shared by a
module (starts in about a second: these tests stay in the default suite); tests that need
three members, kill or pause processes are marked slow and use ``make_cluster``.
"""

import sys

import pytest

from kvserver.client import Client
from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import wait_healthy

FAST_TIMING = ["--heartbeat-interval", "50", "--election-timeout", "500"]


def _start(path, size):
    c = LocalCluster(str(path), size=size, extra_args=list(FAST_TIMING))
    c.start()
    try:
        wait_healthy(c, timeout_s=30)
    except BaseException:
        c.stop()
        raise
    return c


def _stop(c):
    c.stop()
    for n in c.nodes:
        sys.stderr.write(f"----- {n.name} log (tail) -----\n{c.log_tail(n, 10)}\n")


@pytest.fixture(scope="module")
def kv_node(tmp_path_factory):
    c = _start(tmp_path_factory.mktemp("coord-node"), 1)
    yield c
    _stop(c)


@pytest.fixture
def client(kv_node):
    with Client(kv_node.endpoints, timeout_s=10) as c:
        yield c


@pytest.fixture
def make_cluster(tmp_path):
    """Private clusters (default three members) for tests that kill or pause; stopped after."""
    clusters = []

    def make(size=3):
        c = _start(tmp_path / f"c{len(clusters)}", size)
        clusters.append(c)
        return c

    yield make
    for c in clusters:
        _stop(c)
