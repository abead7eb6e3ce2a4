"""Fixtures for the Spark suite: one real local SparkSession per test run, real raftkv processes.

Every test here is marked ``spark`` (and so ``slow``): it needs a JVM (``java`` on PATH, which
``.ci/run`` installs when missing) and PySpark with pyarrow (the ``spark`` extra, part of
``dev``). The session is ``local[2]`` with task retries (``local[2,3]``: up to 3 attempts per
task), so tests that inject task failures see Spark retry them; a test that needs a task to
fail for good fails it more than 3 times. Python workers run this venv's interpreter; Spark's
UI is off and it binds to 127.0.0.1 only.
"""

import os
import sys

import pytest

from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import wait_healthy
from tests.conftest import require_program

FAST_TIMING = ["--heartbeat-interval", "50", "--election-timeout", "500"]


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.spark)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def spark():
    require_program("java", "PySpark needs a JRE (.ci/run installs default-jre-headless)")
    pytest.importorskip("pyarrow")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("raftkv-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from kvserver.spark import register

    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def raftkv_cluster(tmp_path_factory):
    """Three real ``raftkv serve`` processes on loopback, shared by a module's tests.

    A test that kills or pauses members must leave the cluster healthy again (restart what it
    killed) or use ``make_spark_cluster`` for a private one."""
    c = LocalCluster(
        str(tmp_path_factory.mktemp("spark-cluster")), size=3, extra_args=list(FAST_TIMING)
    )
    c.start()
    try:
        wait_healthy(c)
        yield c
    finally:
        c.stop()
        for n in c.nodes:
            sys.stderr.write(f"----- {n.name} log (tail) -----\n{c.log_tail(n, 15)}\n")


@pytest.fixture
def make_spark_cluster(tmp_path):
    """A private three-node cluster for a test that kills members; stopped afterwards."""
    clusters = []

    def make(size=3, extra_args=()):
        c = LocalCluster(
            str(tmp_path / f"c{len(clusters)}"), size=size, extra_args=[*FAST_TIMING, *extra_args]
        )
        clusters.append(c)
        c.start()
        wait_healthy(c)
        return c

    yield make
    for c in clusters:
        c.stop()
