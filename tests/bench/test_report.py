"""The text report follows etcd's benchmark layout; --json carries the same numbers."""

import io
from array import array

from kvserver.bench.report import ProgressBar, format_report
from kvserver.bench.result import BenchResult
from kvserver.bench.stats import Stats
from kvserver.bench.workloads import BenchOptions


def result(by_kind):
    return BenchResult(BenchOptions(op="mixed").validate(), by_kind, ["http://127.0.0.1:1"])


def test_report_sections_in_etcd_order():
    st = Stats(array("d", [0.001 * i for i in range(1, 101)]), started=0.0, finished=2.0)
    st.error("HTTP 503: etcdserver: leader changed")
    text = format_report(result({"put": st}))
    lines = text.splitlines()
    order = [
        lines.index(h)
        for h in (
            "Summary:",
            "Response time histogram:",
            "Latency distribution:",
            "Error distribution:",
        )
    ]
    assert order == sorted(order)
    for field in ("Total:", "Slowest:", "Fastest:", "Average:", "Stddev:", "Requests/sec:"):
        assert any(line.strip().startswith(field) for line in lines), field
    pct = [line.strip() for line in lines if " in " in line and line.strip()[0].isdigit()]
    assert [p.split("%")[0] for p in pct] == ["10", "25", "50", "75", "90", "95", "99", "99.9"]
    assert "  50% in 0.0500 secs." in lines
    assert "  Requests/sec:\t50.0000" in lines  # 100 successes over 2 s
    hist = lines[
        lines.index("Response time histogram:") + 1 : lines.index("Latency distribution:") - 1
    ]
    assert len(hist) == 11 and sum(int(h.split("[")[1].split("]")[0]) for h in hist) == 100
    assert "  [1]\tHTTP 503: etcdserver: leader changed" in lines


def test_mixed_report_has_a_block_per_kind_and_json_per_kind():
    put = Stats(array("d", [0.002] * 3), started=0.0, finished=1.0)
    rng = Stats(array("d", [0.001] * 5), started=0.0, finished=1.0)
    r = result({"put": put, "range": rng})
    text = format_report(r)
    assert "--- put (3 ok, 0 failed) ---" in text and "--- range (5 ok, 0 failed) ---" in text
    doc = r.to_json()
    assert doc["count"] == 8 and doc["by_kind"]["put"]["count"] == 3
    assert doc["percentiles_s"]["50"] == 0.001 and doc["workload"] == "mixed"


def test_progress_bar_stays_quiet_off_a_terminal():
    out = io.StringIO()
    with ProgressBar([5], total=10, duration_s=None, stream=out) as bar:
        assert not bar.enabled
    assert out.getvalue() == ""
