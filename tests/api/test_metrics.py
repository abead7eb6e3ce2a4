"""``kvserver.server.metrics`` without HTTP: registry isolation, the node stats hook, histograms."""

from __future__ import annotations

import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvserver.server.metrics import (
    FSYNC_BUCKETS_SECONDS,
    NODE_METRICS,
    DurationHistogram,
    Metrics,
    NodeStats,
)


def _values(metrics: Metrics) -> dict[str, float]:
    text = metrics.render()[0].decode()
    return {
        s.name + str(sorted(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_each_metrics_object_has_its_own_registry() -> None:
    a, b = Metrics(process_metrics=False), Metrics(process_metrics=False)
    a.observe_http("etcd", "/v3/kv/put", 200, 0.001)
    key = (
        "raftkv_http_request_duration_seconds_count"
        "[('dialect', 'etcd'), ('route', '/v3/kv/put'), ('status', '200')]"
    )
    assert _values(a)[key] == 1
    assert key not in _values(b)


def test_duration_histogram_buckets_are_cumulative_and_bounds_inclusive() -> None:
    h = DurationHistogram((0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.005, 0.05, 5.0):
        h.observe(seconds)
    buckets, total = h.snapshot()
    # prometheus "le" semantics: an observation equal to a bound falls in that bucket
    assert buckets == [("0.001", 2), ("0.01", 3), ("0.1", 4), ("+Inf", 5)]
    assert total == pytest.approx(5.0565)
    assert h.count == 5


def test_duration_histogram_counts_every_observation_from_threads() -> None:
    h = DurationHistogram(FSYNC_BUCKETS_SECONDS)

    def work() -> None:
        for _ in range(5000):
            h.observe(0.00015)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.count == 20000
    assert h.snapshot()[0][-1] == ("+Inf", 20000)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        DurationHistogram((0.1, 0.01))
    with pytest.raises(ValueError):
        DurationHistogram(())


def test_a_failing_node_stats_source_does_not_break_the_scrape(caplog) -> None:
    m = Metrics(process_metrics=False)

    def broken() -> dict:
        raise RuntimeError("driver bug")

    m.node_stats = broken
    values = _values(m)  # still renders
    assert values["raftkv_node_stats_errors_total[]"] == 1
    assert "driver bug" in caplog.text
    m.node_stats = lambda: {"raft_term": 4}
    assert _values(m)["raftkv_raft_term[]"] == 4


def test_process_metrics_are_exported_by_default() -> None:
    assert any(k.startswith("process_") for k in _values(Metrics()))


def test_node_stats_type_names_exactly_the_exported_keys() -> None:
    assert set(NodeStats.__annotations__) == set(NODE_METRICS)
