"""deploy/: the compose file's ``monitoring`` profile (``deploy/up.sh up --monitoring``) runs
Prometheus beside the three members, scrapes them and evaluates raftkv's alert rules.

``deploy/up.sh`` builds the Prometheus image from Debian's package (deploy/monitoring/
Dockerfile, on the base image it chose for raftkv), starts it with the members and waits
until it is ready. This checks that Prometheus scrapes all three members, loaded every rule
and evaluates them without errors, sees one leader reporting two followers, and that killing
a member makes ``RaftkvMembersDown`` pending (it fires after its 10 minutes, which this test
does not wait for). Skipped only when Docker, Compose or a base image is missing (as
tests/deploy). Builds are cached by the engine: about 1.5 minutes when the images exist.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest

from kvserver.localcluster.launcher import free_ports
from tests.deploy.compose import (
    APP_IMAGE,
    NOT_YET,
    SERVICES,
    base_image_env,
    compose_cluster,
    docker_command,
    http,
    remove_stale_projects,
)
from tests.monitoring.promql import load_alerts
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.external, pytest.mark.timeout(1800)]

PROMETHEUS_IMAGE = "raftkv-prometheus:pytest"
POLL_S = 1.0


def api(prom: str, path: str, **params: str):
    url = f"{prom}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    code, body = http("GET", url)
    assert code == 200, (code, body[:300])
    doc = json.loads(body)
    assert doc["status"] == "success", doc
    return doc["data"]


def scalar(prom: str, query: str) -> float | None:
    result = api(prom, "query", query=query)["result"]
    return float(result[0]["value"][1]) if result else None


def test_monitoring_profile_scrapes_the_members_and_evaluates_the_alerts():
    docker = docker_command()
    remove_stale_projects(docker)
    (port,) = free_ports(1)
    env = {
        **base_image_env(docker),
        "RAFTKV_MONITORING": "1",
        "RAFTKV_PROMETHEUS_IMAGE": PROMETHEUS_IMAGE,
        "RAFTKV_PROMETHEUS_PORT": str(port),
    }
    with compose_cluster(docker, APP_IMAGE, env, taken_ports=frozenset((port,))) as (c, up_s):
        prom = f"http://127.0.0.1:{port}"

        def targets_up():
            active = api(prom, "targets")["activeTargets"]
            return len(active) == 3 and all(t["health"] == "up" for t in active) and active

        targets = wait_for(targets_up, 90, "Prometheus scraping 3 members", ignore=NOT_YET)
        assert {t["labels"]["instance"] for t in targets} == {f"{s}:2379" for s in SERVICES}

        def rules_evaluated():
            groups = api(prom, "rules", type="alert")["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return (
                len(rules) == len(load_alerts())
                and all(r["health"] == "ok" for r in rules)
                and rules
            )

        wait_for(rules_evaluated, 60, "every alert rule evaluated without error", ignore=NOT_YET)
        wait_for(
            lambda: (
                scalar(prom, "sum(raftkv_raft_has_leader)") == 3
                and scalar(prom, "count(raftkv_raft_follower_lag_entries)") == 2
            ),
            60,
            "3 members with a leader, and 2 followers reported by it",
            interval_s=POLL_S,
            ignore=NOT_YET,
        )

        leader = c.leader()
        victim = next(s for s in SERVICES if s != leader)
        c.docker_run("kill", c.containers[victim])

        def members_down_pending():
            alerts = api(prom, "alerts")["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "RaftkvMembersDown"]

        (alert,) = wait_for(
            members_down_pending,
            120,
            "RaftkvMembersDown pending",
            interval_s=POLL_S,
            ignore=NOT_YET,
        )
        assert alert["state"] == "pending" and alert["labels"]["severity"] == "critical"
        assert scalar(prom, f'up{{instance="{victim}:2379"}}') == 0
        print(f"deploy/up.sh up --monitoring: {up_s:.1f} s; alert: {alert}")
