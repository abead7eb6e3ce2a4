"""Fixtures for the dashboard's browser tests: a three-member cluster of real processes on
127.0.0.1 and headless Chromium (Debian's ``chromium`` + ``chromium-driver``) driven by
Selenium. Skipped when the browser or Selenium is missing, unless external programs are
required (``RAFTKV_REQUIRE_EXTERNAL=1``, as CI sets).

Screenshots go to ``$RAFTKV_UI_ARTIFACTS`` (a directory) or a temporary directory; its path
is printed at the end of the session.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import wait_healthy

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FAST_TIMING = ["--heartbeat-interval", "50", "--election-timeout", "500"]


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (dev extra)"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    return None


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    where = os.environ.get("RAFTKV_UI_ARTIFACTS")
    path = Path(where) if where else tmp_path_factory.mktemp("ui-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    yield path
    print(f"\ndashboard screenshots: {path}")


@pytest.fixture
def browser():
    missing = _browser_missing()
    if missing:
        if os.environ.get("RAFTKV_REQUIRE_EXTERNAL") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def cluster(tmp_path, request):
    """Three members; each test gets its own (some kill the leader or turn auth on)."""
    extra = getattr(request, "param", [])
    c = LocalCluster(str(tmp_path / "cluster"), size=3, extra_args=[*FAST_TIMING, *extra])
    c.start()
    try:
        wait_healthy(c, timeout_s=60.0)
        yield c
    finally:
        c.stop()
        if getattr(request.node, "rep_call", None) is None or request.node.rep_call.failed:
            for n in c.nodes:
                print(f"----- {n.name} log (tail) -----\n{c.log_tail(n, 30)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)
