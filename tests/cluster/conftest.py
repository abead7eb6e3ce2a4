"""Fixtures for multi-process tests: a LocalCluster in a temp dir, logs shown on failure."""

import pytest

from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import wait_healthy

FAST_TIMING = ["--heartbeat-interval", "50", "--election-timeout", "500"]


@pytest.fixture
def make_cluster(tmp_path, request):
    clusters = []

    def make(size=3, extra_args=(), start=True):
        c = LocalCluster(
            str(tmp_path / f"c{len(clusters)}"), size=size, extra_args=[*FAST_TIMING, *extra_args]
        )
        clusters.append(c)
        if start:
            c.start()
            wait_healthy(c)
        return c

    yield make
    failed = request.node.rep_call.failed if hasattr(request.node, "rep_call") else True
    for c in clusters:
        c.stop()
        if failed:
            for n in c.nodes:
                print(f"----- {n.name} log (tail) -----\n{c.log_tail(n, 40)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
