"""``benchmarks/spark_bench.py`` runs end to end at a small size and reports every figure.

The benchmark starts its own raftkv member and SparkSession, so it runs in a subprocess (its
``spark.stop()`` must not end the suite's session). Only counts and presence are checked:
each figure is there and positive, the read figures cover every key, and planning a small
range gives one partition. Timings are not asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGURES = (
    "cold session start s",
    "cold first job s",
    "write raw rows/s",
    "write spark rows/s",
    "planning s",
    "read raw rows/s",
    "read raw arrow rows/s",
    "read spark noop rows/s",
    "read spark count rows/s",
    "decode old ms/1000",
    "decode arrow ms/1000",
)


def test_the_bench_reports_every_figure_at_a_small_size(tmp_path) -> None:
    out = tmp_path / "figures.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "spark_bench.py"),
            "--rows",
            "3000",
            "--write-rows",
            "1000",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["rows"] == 3000 and figures["write_rows"] == 1000
    for name in FIGURES:
        assert figures[name] > 0, name
    assert figures["planning partitions"] == 1  # under minPartitionKeys: one partition
    assert "read: Spark, 2 partitions, noop" in proc.stdout
