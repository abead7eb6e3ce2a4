"""benchmarks/scale.py end to end at a tiny size (raftkv only): every row filled, counts sane.

No timing is asserted; the run only has to measure everything it promises. It runs in this
process, so a timeout's exception still reaches the script's ``finally`` that stops the
cluster.
"""

import json

import pytest

from benchmarks import scale

KEYS = 2000
CATCHUP = 1000


def test_table_has_a_dash_for_what_was_not_measured():
    args = scale.parse_args(["--systems", "raftkv,etcd", "--keys", "10"])
    rows = scale.table({"raftkv": {"load": {"keys_per_s": 1234.5}}}, ["raftkv", "etcd"], args)
    assert rows[0] == ["measurement", "raftkv", "etcd"]
    assert len(rows) == 1 + len(scale.row_specs(args))
    by_label = {r[0]: r[1:] for r in rows[1:]}
    assert len(by_label) == len(rows) - 1  # labels are unique
    load = next(label for label in by_label if label.startswith("load 10 keys"))
    assert by_label[load] == ["1,234", "-"]
    assert all(cells[1] == "-" for cells in by_label.values())


def test_phases_pick_what_follows_the_load():
    assert scale.parse_args([]).phase_set == set(scale.PHASES)
    args = scale.parse_args(["--phases", "snapshot-storm,restart"])
    assert args.phase_set == {"snapshot-storm", "restart"}
    with pytest.raises(SystemExit):
        scale.parse_args(["--phases", "scan,nap"])


def test_repeated_storms_combine_into_one_result():
    def run(puts: int, errors: int, p99: float, top: float) -> dict:
        return {
            "seconds": 15.0,
            "puts": puts,
            "puts_per_s": puts / 15,
            "put_errors": errors,
            "put_p99_ms": p99,
            "put_max_ms": top,
            "term_changes": 0,
            "leader_changes": 0,
            "status_polls_failed": 1,
            "compaction_s": 0.5,
        }

    assert scale.combine_storms([run(300, 0, 10.0, 40.0)]) == run(300, 0, 10.0, 40.0)
    both = scale.combine_storms(
        [run(300, 0, 10.0, 40.0), run(600, 2, 20.0, 90.0), run(900, 1, 30.0, 50.0)]
    )
    assert both["puts"] == 1800 and both["put_errors"] == 3 and both["status_polls_failed"] == 3
    assert both["seconds"] == 45.0 and both["puts_per_s"] == 40.0 and both["put_p99_ms"] == 20.0
    assert both["put_max_ms_runs"] == [40.0, 90.0, 50.0]
    assert both["put_max_ms"] == 90.0 and both["put_max_ms_median"] == 50.0
    assert both["compaction_s"] == 0.5 and both["runs"] == 3  # the first run's own fields
    snapshots = [run(1, 0, 1.0, 1.0) | {"new_snapshot_files": files} for files in ([1, 1], [2, 0])]
    assert scale.combine_storms(snapshots)["new_snapshot_files"] == [3, 1]
    with pytest.raises(SystemExit):
        scale.parse_args(["--storm-repeats", "0"])


@pytest.mark.slow
def test_tiny_raftkv_run_fills_every_row(tmp_path, capsys):
    out_json, out_md = tmp_path / "scale.json", tmp_path / "scale.md"
    argv = ["--systems", "raftkv", "--keys", str(KEYS), "--storm-seconds", "1"]
    argv += ["--storm-repeats", "2"]
    argv += ["--snapshot-count", "500", "--catchup-keys", str(CATCHUP)]
    argv += ["--json", str(out_json), "--out-md", str(out_md), "--keep", str(tmp_path / "data")]
    assert scale.main(argv) == 0, capsys.readouterr().err[-3000:]
    printed = capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    assert doc["failures"] == {}
    assert doc["machine"]["nproc"] >= 1

    rows = doc["rows"]
    assert rows[0] == ["measurement", "raftkv"]
    assert len(rows) == 1 + len(scale.row_specs(scale.parse_args(argv)))
    empty = [r[0] for r in rows[1:] if r[1] in ("", "-")]
    assert empty == []
    for label, _cell in rows[1:]:
        assert label in printed  # the human table
    md_lines = [line for line in out_md.read_text().splitlines() if line.startswith("|")]
    assert len(md_lines) == 1 + len(rows)  # the head, the rule, one line a row

    r = doc["results"]["raftkv"]
    assert r["load"]["keys"] == KEYS and r["load"]["retried_txns"] == 0
    assert all(x > 0 for x in r["load"]["rss_mib"] + r["load"]["data_dir_mib"])
    assert len(r["load"]["rss_mib"]) == len(r["load"]["data_dir_mib"]) == 3
    for page in ("1000", "10000"):
        scan = r["scan"][page]
        assert scan["keys"] == KEYS
        assert scan["pages"] == -(-KEYS // int(page))  # the last page says no "more"
    assert r["count_only"]["count"] == KEYS

    for name in ("read_storm", "compaction_storm", "snapshot_storm"):
        st = r[name]
        assert st["puts"] > 0, (name, st)
        assert st["put_errors"] <= st["puts"] // 20, (name, st["put_error_kinds"])
        assert st["term_changes"] >= 0 and st["leader_changes"] >= 0
        assert st["put_max_ms"] >= st["put_p99_ms"] > 0
        assert st["runs"] == 2 and max(st["put_max_ms_runs"]) == st["put_max_ms"]
    assert r["read_storm"]["reads_served"] > 0
    assert r["compaction_storm"]["compacted_revision"] > KEYS // scale.TXN_OPS
    assert min(r["snapshot_storm"]["new_snapshot_files"]) >= 1  # every 500 entries, each member

    assert r["restart"]["seconds"] > 0
    cu = r["catch_up"]
    assert cu["new_keys"]["puts"] == CATCHUP and cu["new_keys"]["put_errors"] == 0
    assert cu["target_revision"] >= r["compaction_storm"]["compacted_revision"] + CATCHUP
    assert cu["member"] in (0, 1, 2) and cu["seconds"] > 0
    assert all(x > 0 for x in r["rss_end_mib"])
