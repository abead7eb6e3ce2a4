"""Every metric the alert rules and the dashboard name is exported by a real member.

One ``raftkv serve`` on 127.0.0.1 (with a file:// archive, so the archive metrics exist too)
is scraped; the names are read from its exposition: every sample's name, and for a family
declared with no samples yet (``raftkv_raft_follower_lag_entries`` on a member with no
followers, ``raftkv_peer_send_failures_total`` with no peers) the names its type gives
(a counter's ``_total``, a histogram's ``_bucket``/``_count``/``_sum``). A rule or panel
naming a metric that does not exist (a typo, a rename) fails here instead of silently
matching nothing. ``up`` is Prometheus' own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from kvserver.localcluster.launcher import free_ports
from tests.monitoring.promql import (
    PROMETHEUS_SERIES,
    dashboard_exprs,
    grafana_to_promql,
    load_alerts,
    load_dashboard,
    metric_names,
)
from tests.support.procs import stop_process
from tests.support.wait import wait_for

SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum"),
}


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@pytest.fixture(scope="module")
def exposition(tmp_path_factory) -> str:
    """The /metrics text of a one-member cluster that has a leader and took a write."""
    tmp = tmp_path_factory.mktemp("member")
    client, peer = free_ports(2)
    c, p = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    archive = tmp / "archive"
    archive.mkdir()
    with open(tmp / "member.log", "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvserver.cli",
                "serve",
                "--data-dir",
                str(tmp / "data"),
                "--listen-client-urls",
                c,
                "--advertise-client-urls",
                c,
                "--listen-peer-urls",
                p,
                "--initial-advertise-peer-urls",
                p,
                "--archive-url",
                f"file://{archive}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for(
            lambda: _get(c + "/health")[0] == 200,
            60,
            "the member healthy",
            interval_s=0.1,
            ignore=(OSError,),
        )
        req = urllib.request.Request(c + "/v1/kv/monitoring", data=b"x", method="PUT")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        status, text = _get(c + "/metrics")
        assert status == 200
        return text
    except BaseException:
        print((tmp / "member.log").read_text()[-3000:])
        raise
    finally:
        stop_process(proc, timeout_s=20)


def exported_names(text: str) -> set[str]:
    names, types = set(), {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            types[family] = kind
        elif line and not line.startswith("#"):
            names.add(line.split("{", 1)[0].split(" ", 1)[0])
    for family, kind in types.items():
        base = family.removesuffix("_total") if kind == "counter" else family
        names.add(family)
        names.update(base + s for s in SUFFIXES.get(kind, ()))
    return names


def test_the_exposition_is_read_as_prometheus_would(exposition):
    names = exported_names(exposition)
    assert {
        "raftkv_raft_has_leader",
        "raftkv_wal_fsync_duration_seconds_bucket",
        "raftkv_proposals_failed_total",
        "raftkv_raft_follower_lag_entries",  # declared, no follower to report
        "raftkv_peer_send_failures_total",  # declared, no peer
        "raftkv_archive_lag_seconds",
    } <= names
    assert "raftkv_raft_has_leader_total" not in names  # a gauge gets no counter suffix


def test_every_metric_in_the_alert_rules_is_exported(exposition):
    exported = exported_names(exposition) | PROMETHEUS_SERIES
    used = {}
    for rule in load_alerts():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, rule["alert"])
    assert len(used) >= 10
    missing = {name: alert for name, alert in used.items() if name not in exported}
    assert not missing, f"metrics no member exports (metric: alert): {missing}"


def test_every_metric_on_the_dashboard_is_exported(exposition):
    exported = exported_names(exposition) | PROMETHEUS_SERIES
    used = set()
    for expr in dashboard_exprs(load_dashboard()):
        used |= metric_names(grafana_to_promql(expr))
    assert len(used) >= 20
    missing = sorted(used - exported)
    assert not missing, f"dashboard metrics no member exports: {missing}"
