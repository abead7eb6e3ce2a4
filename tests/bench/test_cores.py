"""benchmarks/cores.py end to end at a tiny size: a one-member raftkv pinned to one CPU, then
to every CPU this process may use, each measured for half a second; the JSON has a row per
CPU set with puts counted and CPU per put for the member and the load generator."""

import json
import os

import pytest

from benchmarks import cores


@pytest.mark.slow
def test_one_row_per_cpu_set_with_puts_and_cpu(tmp_path, capsys):
    every = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    out = tmp_path / "cores.json"
    sets = f"{min(os.sched_getaffinity(0))};{every}"
    assert (
        cores.main(
            [
                "--systems",
                "raftkv",
                "--cpu-sets",
                sets,
                "--duration",
                "0.5",
                "--warmup",
                "0",
                "--clients",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())
    assert [r["cpus"] for r in rows] == [
        [min(os.sched_getaffinity(0))],
        sorted(os.sched_getaffinity(0)),
    ]
    for row in rows:
        assert row["ops_per_s"] > 0 and row["errors"] == 0
        assert row["members_cpu_us_per_put"] > 0 and row["load_generator_cpu_us_per_put"] > 0
    assert os.sched_getaffinity(0) == set(rows[-1]["cpus"])  # the affinity is given back
    assert "raftkv" in capsys.readouterr().out
