"""Shared pytest helpers.

External programs (etcd, Java, Docker): a test that needs one calls
``require_program("etcd")``. On a developer machine without it the test is skipped with a
clear reason; when ``RAFTKV_REQUIRE_EXTERNAL=1`` (set by .ci/run, which installs them) a
missing program is a failure, so CI never silently skips.
"""

import os
import shutil

import pytest


def external_required() -> bool:
    return os.environ.get("RAFTKV_REQUIRE_EXTERNAL", "") not in ("", "0")


def require_program(name: str, hint: str = "") -> str:
    """Return the path of ``name`` on PATH, or skip (locally) / fail (in CI) without it."""
    path = shutil.which(name)
    if path:
        return path
    reason = f"{name} is not installed{': ' + hint if hint else ''}"
    if external_required():
        pytest.fail(f"{reason} (RAFTKV_REQUIRE_EXTERNAL=1: .ci/run should have installed it)")
    pytest.skip(reason)


# Suites that need minutes, a JVM or root (Spark, chaos, Docker) run in the slow phase of
# `make test`: marking one of them is enough, the slow mark follows.
_ALWAYS_SLOW = ("spark", "chaos", "docker")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(m) for m in _ALWAYS_SLOW) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
