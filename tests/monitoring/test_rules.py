"""deploy/monitoring/alerts.yml: valid for promtool, and every alert unit-tested.

``promtool check rules`` parses the rules; ``promtool test rules`` runs alerts_test.yml,
where each case feeds series and states which alerts fire, with their exact labels and
annotations, at given times. This also checks that the test file covers every alert: each
(alert, severity) fires in some case, and each alert has an evaluation where it must stay
silent (a blip, a healthy member, a pending ``for``), so no rule is untested by accident.
"""

from __future__ import annotations

import pytest

from tests.monitoring.promql import (
    ALERTS,
    ALERTS_TEST,
    load_alert_tests,
    load_alerts,
    metric_names,
    promtool,
)

pytestmark = pytest.mark.external


def test_promtool_checks_the_rules():
    proc = promtool("check", "rules", ALERTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(load_alerts())} rules found" in proc.stdout


def test_promtool_unit_tests_pass():
    proc = promtool("test", "rules", ALERTS_TEST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_a_wrong_expectation_fails_the_unit_tests(tmp_path):
    """The unit tests can fail: the same file, expecting a member that is not down."""
    text = open(ALERTS_TEST).read().replace("members are down (1).", "members are down (2).")
    broken = tmp_path / "alerts_test.yml"
    broken.write_text(text.replace("rule_files: [alerts.yml]", f"rule_files: [{ALERTS}]"))
    proc = promtool("test", "rules", str(broken))
    assert proc.returncode != 0 and "members are down (1)." in proc.stdout + proc.stderr


def test_every_alert_fires_in_a_case_and_stays_silent_in_another():
    rules = load_alerts()
    assert all("alert" in r for r in rules), "only alerting rules here"
    wanted = {(r["alert"], r["labels"]["severity"]) for r in rules}
    fired, silent = set(), set()
    for case in load_alert_tests()["tests"]:
        for check in case.get("alert_rule_test", []):
            expected = check.get("exp_alerts") or []
            if not expected:
                silent.add(check["alertname"])
            for alert in expected:
                fired.add((check["alertname"], alert["exp_labels"]["severity"]))
    assert wanted - fired == set(), "alerts no case makes fire"
    assert fired - wanted == set(), "cases expect alerts that do not exist"
    assert {name for name, _ in wanted} - silent == set(), "alerts never tested silent"


def test_the_alerts_cover_what_an_etcd_operator_expects():
    names = {r["alert"] for r in load_alerts()}
    assert {
        "RaftkvNoLeader",
        "RaftkvHighNumberOfLeaderChanges",
        "RaftkvMemberBehind",
        "RaftkvHighFsyncDurations",
        "RaftkvDatabaseQuotaLowSpace",
        "RaftkvArchiveLagging",
        "RaftkvHighNumberOfFailedProposals",
        "RaftkvInsufficientMembers",
        "RaftkvMembersDown",
    } <= names
    for rule in load_alerts():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('raftkv_raft_has_leader{job=~".*raftkv.*"} == 0', {"raftkv_raft_has_leader"}),
        (
            "histogram_quantile(0.99, sum by (instance, le) "
            '(rate(raftkv_wal_fsync_duration_seconds_bucket{job="a"}[5m]))) > 1e-3',
            {"raftkv_wal_fsync_duration_seconds_bucket"},
        ),
        (
            "sum without (instance) (up == bool 0) or count without (peer) "
            "(rate(x_total[2m] offset 5m)) / on (job) group_left (peer) y",
            {"up", "x_total", "y"},
        ),
        ('max(a{job=~"$job"} / b) and c unless label_replace(d, "e", "$1", "f", "(.*)")',
         {"a", "b", "c", "d"}),
    ],
)  # fmt: skip
def test_metric_names_finds_the_selected_metrics_only(expr, names):
    assert metric_names(expr) == names
