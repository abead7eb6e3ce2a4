"""benchmarks/compare.py's table, ratios and target checks (pure functions, made-up numbers)."""

import pytest

from benchmarks.compare import batching, format_cpu, format_markdown, parse_args, table, targets
from benchmarks.perfdoc import KEEP_MARKER, kept_sections, render


def cell(ops, p50, p99=9.0):
    return {"ops_per_s": ops, "p50_ms": p50, "p99_ms": p99}


RESULTS = {
    "raftkv": {"put": {1: cell(500, 1.0), 64: cell(6000, 8.0)}, "range": {64: cell(9000, 5.0)}},
    "etcd": {"put": {1: cell(600, 1.25), 64: cell(3000, 12.0)}, "range": {64: cell(6000, 8.0)}},
    "pysyncobj": {"put": {1: cell(800, 0.9), 64: cell(2500, 15.0)}, "range": {64: cell(7000, 6.0)}},
}


def test_one_row_per_workload_with_ratios():
    rows = table(RESULTS, ["raftkv", "etcd", "pysyncobj"])
    assert rows[0][:4] == ["workload", "raftkv ops/s", "raftkv p50 ms", "raftkv p99 ms"]
    assert rows[0][-4:] == [
        "raftkv/etcd ops/s",
        "raftkv/etcd p50",
        "raftkv/pysyncobj ops/s",
        "raftkv/pysyncobj p50",
    ]
    by_name = {r[0]: r for r in rows[1:]}
    assert set(by_name) == {"put, 1 client", "put, 64 clients", "range (linearizable), 64 clients"}
    assert by_name["put, 64 clients"][-4:] == ["2.00x", "0.67x", "2.40x", "0.53x"]
    md = format_markdown(rows).splitlines()
    assert len(md) == 2 + 3 and md[1].startswith("|---|---:")


def test_targets_met_and_missed():
    got = {what: ok for what, ok, _ in targets(RESULTS)}
    assert got == {
        "puts at 64 clients >= 1.5x etcd": True,  # 2.0x
        "puts at 64 clients >= 3x PySyncObj": False,  # 2.4x
        "linearizable gets at 64 clients >= 1.5x etcd": True,
        "p50 put latency at 1 client <= etcd's": True,  # 1.0 vs 1.25 ms
    }


def test_batching_ratios_from_metric_deltas():
    before = {
        "u": {
            "raftkv_raft_commit_index": 100,
            "raftkv_wal_fsync_duration_seconds_count": 10,
            "raftkv_raft_append_messages_sent_total": 5,
            "raftkv_raft_append_entries_sent_total": 50,
        }
    }
    after = {
        "u": {
            "raftkv_raft_commit_index": 1100,
            "raftkv_wal_fsync_duration_seconds_count": 60,
            "raftkv_raft_append_messages_sent_total": 105,
            "raftkv_raft_append_entries_sent_total": 2050,
            "raftkv_raft_is_leader": 1,
        }
    }
    m = batching(before, after)["u"]
    assert m["leader"] and m["fsyncs_per_committed_entry"] == 0.05
    assert m["entries_per_append_message"] == 20.0


def test_cpu_lines_name_every_system_with_its_busiest_server():
    results = {
        "raftkv": {
            "put": {
                64: dict(
                    cell(6000, 8.0),
                    cpu_us_per_op={
                        "servers": 190.4,
                        "busiest_server": 120.2,
                        "load_generator": 20.0,
                    },
                )
            },
            "range": {},
        },
        "etcd": {"put": {64: cell(3000, 12.0)}, "range": {}},
    }  # no CPU numbers
    assert format_cpu(results, ["raftkv", "etcd"]) == [
        "put x64: raftkv 190 (busiest 120, load generator 20)"
    ]


def test_the_document_has_table_targets_cpu_and_analysis():
    doc = {
        "started": "2026-11-22 06:00:00 UTC",
        "load_average_before": 0.25,
        "machine": {"raftkv_commit": "abc"},
        "results": RESULTS,
        "options": {
            "duration": 5,
            "warmup": 1,
            "val_size": 256,
            "key_space_size": 10000,
            "procs": 1,
        },
    }
    rows = table(RESULTS, ["raftkv", "etcd", "pysyncobj"])
    text = render(
        doc,
        format_markdown(rows),
        targets(RESULTS),
        [],
        ["put x64: raftkv 190"],
        "performance.png",
        "benchmarks/compare.py --doc docs/performance.md",
    )
    assert "load average just before: 0.25" in text
    assert "| put, 64 clients |" in text and "![throughput vs clients](performance.png)" in text
    assert "- **missed**: puts at 64 clients >= 3x PySyncObj" in text
    assert "### CPU per request" in text and "- put x64: raftkv 190" in text
    assert "## Why the targets are missed" in text


def test_regenerating_the_doc_keeps_its_hand_written_sections(tmp_path):
    doc = tmp_path / "performance.md"
    assert kept_sections(str(doc)) == ""  # no doc yet
    doc.write_text(f"# Performance\ngenerated table\n\n{KEEP_MARKER}\n## Failover\n1.1 s\n")
    assert kept_sections(str(doc)) == f"{KEEP_MARKER}\n## Failover\n1.1 s\n"
    doc.write_text("# Performance\nno marker\n")
    assert kept_sections(str(doc)) == ""


def test_grpc_mode_compares_the_systems_that_serve_grpc(capsys):
    assert parse_args(["--protocol", "grpc"]).systems == "raftkv,etcd"
    assert parse_args([]).systems == "raftkv,etcd,pysyncobj"
    for argv, why in (
        (["--protocol", "grpc", "--systems", "raftkv,pysyncobj"], "pysyncobj does not serve gRPC"),
        (["--protocol", "grpc", "--doc", "x.md"], "no --doc"),
    ):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert why in capsys.readouterr().err
