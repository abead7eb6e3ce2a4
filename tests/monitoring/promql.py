"""What tests/monitoring needs to read the alert rules and the Grafana dashboard.

- ``metric_names(expr)``: the metric names a PromQL expression selects. No PromQL parser is
  at hand in Python, so it drops what cannot hold a metric name (strings, label matchers,
  ranges, ``by (...)``-style label lists, ``offset``) and keeps the identifiers that are not
  called (functions, aggregations) and not keywords. promtool checks the syntax itself.
- ``grafana_to_promql(expr)``: a dashboard query with Grafana's variables replaced by values
  PromQL accepts, so promtool can parse it.
- ``promtool(*args)``: runs promtool (skips, or fails under RAFTKV_REQUIRE_EXTERNAL=1,
  when it is missing: Debian's ``prometheus`` package has it).
- ``check_exprs(exprs, tmp_path)``: promtool's syntax check of expressions, as recording
  rules of a throwaway rule file.
- the files: ``ALERTS``, ``ALERTS_TEST``, ``DASHBOARD`` and their loaders.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import yaml

from tests.conftest import require_program

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MONITORING = os.path.join(ROOT, "deploy", "monitoring")
ALERTS = os.path.join(MONITORING, "alerts.yml")
ALERTS_TEST = os.path.join(MONITORING, "alerts_test.yml")
DASHBOARD = os.path.join(MONITORING, "grafana", "raftkv.json")
PROMETHEUS_CONFIG = os.path.join(MONITORING, "prometheus.yml")

# Series Prometheus makes itself, not a member's /metrics.
PROMETHEUS_SERIES = frozenset({"up"})

_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
     "unless", "offset", "inf", "nan"}
)  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[0-9a-z]+")
_IDENT = re.compile(r"(?<![\w.:$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    text = _STRING.sub(" ", expr)
    for pattern in (_MATCHERS, _RANGE, _LABEL_LIST, _OFFSET):
        text = pattern.sub(" ", text)
    return {
        m.group(1)
        for m in _IDENT.finditer(text)
        if m.group(2) is None and m.group(1).lower() not in _KEYWORDS
    }


_GRAFANA_VARS = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "${job}": "raftkv",
    "$job": "raftkv",
    "${instance}": ".*",
    "$instance": ".*",
}


def grafana_to_promql(expr: str) -> str:
    for var in sorted(_GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(var, _GRAFANA_VARS[var])
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
    return expr


def promtool(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    exe = require_program("promtool", "apt-get install prometheus")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)


def check_exprs(exprs: list[str], tmp_path) -> subprocess.CompletedProcess:
    """promtool's parse of ``exprs``, each as a recording rule of one throwaway file."""
    rules = [{"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}))
    return promtool("check", "rules", str(path))


def load_alerts() -> list[dict]:
    with open(ALERTS) as f:
        doc = yaml.safe_load(f)
    return [rule for group in doc["groups"] for rule in group["rules"]]


def load_alert_tests() -> dict:
    with open(ALERTS_TEST) as f:
        return yaml.safe_load(f)


def load_dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_panels(dash: dict) -> list[dict]:
    """Every panel, those nested in collapsed rows included."""
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_exprs(dash: dict) -> list[str]:
    """Every query of the dashboard: the panels' targets and the PromQL inside the
    variables' ``label_values(<selector>, label)`` queries."""
    exprs = [t["expr"] for p in dashboard_panels(dash) for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
        assert m, f"variable {var['name']}: not a label_values(selector, label) query: {query}"
        exprs.append(m.group(1))
    return exprs
