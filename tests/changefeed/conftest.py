"""The multi-process fixtures of tests/cluster (a LocalCluster per test, logs on failure)."""

from tests.cluster.conftest import make_cluster, pytest_runtest_makereport  # noqa: F401
