"""Three real ``raftkv serve`` members per test on loopback, with etcd's default raft timing
(100 ms heartbeat, 1 s election timeout), stopped by pid afterwards; their logs are shown
when the test failed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import wait_healthy

START_TIMEOUT_S = 30.0


@pytest.fixture
def scale_cluster(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[list[str]], LocalCluster]]:
    clusters: list[LocalCluster] = []

    def make(extra_args: list[str]) -> LocalCluster:
        cluster = LocalCluster(str(tmp_path / f"c{len(clusters)}"), size=3, extra_args=extra_args)
        clusters.append(cluster)
        cluster.start()
        wait_healthy(cluster, timeout_s=START_TIMEOUT_S)
        return cluster

    yield make
    report = getattr(request.node, "rep_call", None)
    failed = report is None or report.failed or hasattr(report, "wasxfail")
    for cluster in clusters:
        cluster.stop()
        if failed:
            for node in cluster.nodes:
                print(f"----- {node.name} log (tail) -----\n{cluster.log_tail(node, 40)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
