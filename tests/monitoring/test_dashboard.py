"""deploy/monitoring/grafana/raftkv.json: a Grafana dashboard that imports and whose queries
parse.

Structure: a title and uid, a ``datasource`` variable of type datasource (Prometheus) that
every panel and query uses (so the board works with any Prometheus data source name),
``job`` and ``instance`` variables, panels with unique ids and a place on the 24-column grid
without overlaps, and at least one query per non-row panel. Every query, with Grafana's
variables replaced, is parsed by promtool. That every metric it names is exported by a
member is checked in test_exported.py.
"""

from __future__ import annotations

import pytest

from tests.monitoring.promql import (
    check_exprs,
    dashboard_exprs,
    dashboard_panels,
    grafana_to_promql,
    load_dashboard,
)

DATASOURCE = "${datasource}"


def test_the_dashboard_has_a_datasource_variable_and_filters():
    dash = load_dashboard()
    assert dash["title"] and dash["uid"] and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == DATASOURCE


def test_panels_use_the_datasource_variable_and_tile_the_grid():
    panels = dashboard_panels(load_dashboard())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 20
    assert {"stat", "timeseries", "gauge"} >= {p["type"] for p in graphs}
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] >= 1, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
    for p in graphs:
        assert p["title"] and p["datasource"]["uid"] == DATASOURCE, p["title"]
        assert p["targets"], f"{p['title']} has no query"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == DATASOURCE and t["expr"].strip(), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


@pytest.mark.external
def test_every_query_parses(tmp_path):
    exprs = [grafana_to_promql(e) for e in dashboard_exprs(load_dashboard())]
    proc = check_exprs(exprs, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


@pytest.mark.external
def test_a_broken_query_is_caught(tmp_path):
    """The parse check can fail: an unbalanced parenthesis."""
    proc = check_exprs(["sum(rate(raftkv_proposals_failed_total[1m])"], tmp_path)
    assert proc.returncode != 0
