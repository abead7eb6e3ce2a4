"""Numbers for the compose ``spark`` profile beside local mode, each with the load average it
was taken under, printed as one table.

    deploy/up.sh up --spark
    .venv/bin/python benchmarks/spark_cluster.py            # demo, batch, changefeed
    .venv/bin/python benchmarks/spark_cluster.py --steps demo --days 3 --events-per-day 3000

Every step runs commands a user runs, against the profile's members (started beforehand with
``deploy/up.sh up --spark``; settings such as ``RAFTKV1_CLIENT_PORT`` and
``COMPOSE_PROJECT_NAME`` are up.sh's and are passed through), and times them on this host:

- ``demo``: ``deploy/up.sh spark-demo`` (spark-submit in a driver container, two 1-core
  workers; the wheel build and the JVM's start included) beside ``python -m
  kvserver.spark.demo --master local[2]`` on this host against the same members through
  their published ports. Each on a fresh table.
- ``batch``: ``benchmarks/spark_bench.py`` under ``deploy/up.sh spark-submit`` (the raw
  client in the driver's container, the Spark tasks in the workers': ``--rows`` keys read,
  ``--write-rows`` rows written, 2 partitions), then the same script in local mode on this
  host with ``--reuse-loaded``: it reads the keys the first run loaded instead of loading
  them again (loading a million keys takes minutes here), so the 1,000,000-key read is the
  same data both times, read once per mode (twice by Spark: into ``noop`` and ``count()``).
- ``changefeed``: ``benchmarks/changefeed_bench.py --endpoints`` under spark-submit (the
  steady phase: writer processes in the driver's container, the streaming query's tasks in
  the workers'), then the same in local mode on this host.

The load average is ``os.getloadavg()``'s one-minute figure, sampled every 2 s while a
command runs: its mean and maximum over the command. Other sessions share this machine's
cores; compare figures taken under similar load only. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UP = ["bash", os.path.join(ROOT, "deploy", "up.sh")]
IN_NETWORK = "http://raftkv1:2379,http://raftkv2:2379,http://raftkv3:2379"


def published() -> str:
    """The members' client URLs on this host (up.sh's ports and address)."""
    addr = os.environ.get("RAFTKV_PUBLISH_ADDR", "127.0.0.1")
    addr = "127.0.0.1" if addr == "0.0.0.0" else addr
    ports = [
        os.environ.get("RAFTKV1_CLIENT_PORT", "2379"),
        os.environ.get("RAFTKV2_CLIENT_PORT", "22379"),
        os.environ.get("RAFTKV3_CLIENT_PORT", "32379"),
    ]
    return ",".join(f"http://{addr}:{p}" for p in ports)


def python() -> str:
    venv = os.path.join(ROOT, ".venv", "bin", "python")
    return venv if os.path.exists(venv) else sys.executable


@dataclass
class Run:
    cmd: list[str]
    seconds: float = 0.0
    rc: int = 0
    out: str = ""
    loads: list[float] = field(default_factory=list)

    def load(self) -> str:
        if not self.loads:
            return "?"
        return f"{sum(self.loads) / len(self.loads):.1f} (max {max(self.loads):.1f})"


def run(cmd: list[str], timeout_s: float, env: dict | None = None) -> Run:
    """``cmd`` timed, its output kept and echoed, the load average sampled meanwhile."""
    r = Run(cmd)
    print("$ " + " ".join(cmd), flush=True)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            r.loads.append(os.getloadavg()[0])
            stop.wait(2.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
        )
        r.rc, r.out = proc.returncode, proc.stdout
    finally:
        r.seconds = time.monotonic() - t0
        stop.set()
        sampler.join()
    tail = "\n".join(r.out.splitlines()[-25:])
    print(f"{tail}\n-> exit {r.rc}, {r.seconds:.1f} s, load {r.load()}\n", flush=True)
    if r.rc != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {r.rc}")
    return r


def figures(out: str) -> dict[str, str]:
    """``| what | figure |`` rows (spark_bench) and ``what   figure`` lines (changefeed_bench)."""
    found = {}
    for line in out.splitlines():
        m = re.match(r"^\| (.+?) +\| +(.+?) \|$", line) or re.match(r"^(\S.*?\S) {2,}(\S.*)$", line)
        if m:
            found[m.group(1).strip()] = m.group(2).strip()
    return found


@dataclass
class Row:
    what: str
    compose: str
    local: str
    load_compose: str
    load_local: str


def demo(args, rows: list[Row]) -> None:
    stamp = time.strftime("%H%M%S")
    common = ["--days", str(args.days), "--events-per-day", str(args.events_per_day)]
    c = run(
        [
            *UP,
            "spark-demo",
            "--table",
            f"bench-c{stamp}",
            "--out",
            f"/data/bench-c{stamp}",
            *common,
        ],
        3600,
    )
    with tempfile.TemporaryDirectory() as d:
        loc = run(
            [
                python(),
                "-m",
                "kvserver.spark.demo",
                "--endpoints",
                published(),
                "--master",
                "local[2]",
                "--table",
                f"bench-l{stamp}",
                "--out",
                os.path.join(d, "out"),
                *common,
            ],
            3600,
        )
    what = f"demo, {args.days} days of {args.events_per_day:,} events: wall time (s)"
    rows.append(Row(what, f"{c.seconds:.0f}", f"{loc.seconds:.0f}", c.load(), loc.load()))


# spark_bench's rows -> this table's, {rows} and {write_rows} filled in
BATCH_FIGURES = {
    "write: raw client, 127-put txns (rows/s)": "load: raw client, 127-put txns, {rows} keys (rows/s)",
    "write: Spark, 2 tasks (rows/s)": "batch write: Spark, 2 tasks, {write_rows} rows (rows/s)",
    "read: raw client, range_arrow (rows/s)": "read: raw client, range_arrow, {rows} keys (rows/s)",
    "read: Spark, 2 partitions, noop (rows/s)": "batch read: Spark, 2 partitions, {rows} keys, noop (rows/s)",
    "read: Spark, 2 partitions, count (rows/s)": "batch read: Spark, 2 partitions, {rows} keys, count() (rows/s)",
    "cold: first job, empty read (s)": "first job of the session, an empty read (s)",
}


def batch(args, rows: list[Row]) -> None:
    sizes = ["--rows", str(args.rows), "--write-rows", str(args.write_rows)]
    c = run(
        [
            *UP,
            "spark-submit",
            "benchmarks/spark_bench.py",
            "--endpoints",
            IN_NETWORK,
            "--reuse-loaded",
            *sizes,
        ],
        7200,
    )
    loc = run(
        [
            python(),
            "benchmarks/spark_bench.py",
            "--endpoints",
            published(),
            "--reuse-loaded",
            *sizes,
        ],
        7200,
    )
    fc, fl = figures(c.out), figures(loc.out)
    for name, what in BATCH_FIGURES.items():
        what = what.format(rows=f"{args.rows:,}", write_rows=f"{args.write_rows:,}")
        rows.append(Row(what, fc.get(name, "?"), fl.get(name, "?"), c.load(), loc.load()))


CHANGEFEED_FIGURES = (
    "written (events/s)",
    "changefeed steady (events/s)",
    "changefeed lag p50 (s)",
    "changefeed lag p99 (s)",
    "events delivered / written",
)


def changefeed(args, rows: list[Row]) -> None:
    opts = [
        "--seconds",
        str(args.seconds),
        "--rate",
        str(args.rate),
        "--writers",
        str(args.writers),
    ]
    c = run(
        [*UP, "spark-submit", "benchmarks/changefeed_bench.py", "--endpoints", IN_NETWORK, *opts],
        1800,
    )
    loc = run(
        [python(), "benchmarks/changefeed_bench.py", "--endpoints", published(), *opts],
        1800,
    )
    fc, fl = figures(c.out), figures(loc.out)
    for name in CHANGEFEED_FIGURES:
        rows.append(
            Row(
                f"changefeed: {name}, --rate {args.rate:,}",
                fc.get(name, "?"),
                fl.get(name, "?"),
                c.load(),
                loc.load(),
            )
        )


STEPS = {"demo": demo, "batch": batch, "changefeed": changefeed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="demo,batch,changefeed", help="comma-separated")
    ap.add_argument("--days", type=int, default=7, help="the demo's (its default: 7)")
    ap.add_argument("--events-per-day", type=int, default=20_000)
    ap.add_argument("--rows", type=int, default=1_000_000, help="keys read in the batch step")
    ap.add_argument("--write-rows", type=int, default=200_000)
    ap.add_argument("--seconds", type=int, default=30, help="the changefeed's writing window")
    ap.add_argument("--rate", type=int, default=21_000, help="events/s the writers aim at")
    ap.add_argument("--writers", type=int, default=4)
    args = ap.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    for s in steps:
        if s not in STEPS:
            ap.error(f"unknown step {s!r} (want {', '.join(STEPS)})")
    rows: list[Row] = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for s in steps:
        STEPS[s](args, rows)
    print(
        f"compose spark profile (2 workers of 1 core, executors in containers) beside local "
        f"mode (local[2] on this host, the same members via their published ports); "
        f"{os.cpu_count()} cores, {started}; load: 1-min load average over the command, mean "
        f"(max)"
    )
    print()
    print("| what | compose | local mode | load, compose | load, local |")
    print("|---|---:|---:|---|---|")
    for r in rows:
        print(f"| {r.what} | {r.compose} | {r.local} | {r.load_compose} | {r.load_local} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
