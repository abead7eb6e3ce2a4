"""Backups and the continuous archive, measured: snapshot save/restore MB/s, and put
throughput with archiving off vs on plus the archive's lag under that load.

    .venv/bin/python -m benchmarks.archive_bench [--keys 100000] [--rounds 3] [--duration 10]

- **snapshot**: one member, ``--keys`` keys of 200-byte values written in 100-put txns, then
  ``raftkv snapshot save FILE`` and ``raftkv snapshot restore FILE --data-dir ...`` timed as
  whole processes (start-up included; restore verifies the hash and decodes the image).
- **archive**: ``--rounds`` pairs of runs, order alternating (off/on, on/off, ...), each a
  fresh three-node cluster (``--archive-url file://...`` on every member when on) under
  ``raftkv bench put --target-leader --clients 64 --val-size 256``; while archiving, every
  member's ``/metrics`` is sampled every 100 ms for ``raftkv_archive_lag_entries`` and
  ``raftkv_archive_lag_seconds``. Prints the median puts/s of each mode, the cost, and the
  lag percentiles.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from kvserver.client import Client, Op, Txn
from kvserver.localcluster.launcher import LocalCluster
from tests.cluster.harness import wait_healthy

RAFTKV = [sys.executable, "-m", "kvserver.cli"]


def snapshot_round_trip(root: str, keys: int) -> dict:
    c = LocalCluster(os.path.join(root, "snap"), size=1, extra_args=["--snapshot-count", "1000000"])
    c.start()
    path = os.path.join(root, "backup.snap")
    try:
        wait_healthy(c, timeout_s=60)
        with Client(c.endpoints) as cl:
            value = b"v" * 200
            for start in range(0, keys, 100):
                cl.txn(
                    Txn().then(
                        *[
                            Op.put(f"bench/{i:08d}", value)
                            for i in range(start, min(keys, start + 100))
                        ]
                    )
                )
        t0 = time.perf_counter()
        subprocess.run(
            [*RAFTKV, "snapshot", "save", path, "--endpoints", c.endpoints[0]],
            check=True,
            capture_output=True,
        )
        save_s = time.perf_counter() - t0
    finally:
        c.stop()
    size = os.path.getsize(path)
    t0 = time.perf_counter()
    subprocess.run(
        [
            *RAFTKV,
            "snapshot",
            "restore",
            path,
            "--data-dir",
            os.path.join(root, "restored"),
            "--name",
            "a",
            "--initial-cluster",
            "a=http://127.0.0.1:1",
        ],
        check=True,
        capture_output=True,
    )
    restore_s = time.perf_counter() - t0
    return {
        "keys": keys,
        "bytes": size,
        "save_s": save_s,
        "restore_s": restore_s,
        "save_mb_s": size / 1e6 / save_s,
        "restore_mb_s": size / 1e6 / restore_s,
    }


def _lag(url: str) -> tuple[float, float] | None:
    with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:
        got = {}
        for line in resp.read().decode().splitlines():
            if line.startswith("raftkv_archive_lag_"):
                name, value = line.rsplit(" ", 1)
                got[name.split("{")[0]] = float(value)
    if not got:
        return None
    return got.get("raftkv_archive_lag_entries", 0.0), got.get("raftkv_archive_lag_seconds", 0.0)


def put_load(root: str, archive: bool, duration_s: int) -> tuple[dict, list]:
    extra = ["--archive-url", f"file://{root}/archive"] if archive else []
    c = LocalCluster(os.path.join(root, "cluster"), size=3, extra_args=extra)
    c.start()
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            for n in c.nodes:
                try:
                    got = _lag(n.client_url)
                except OSError:
                    continue
                if got is not None:
                    samples.append(got)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        wait_healthy(c, timeout_s=90)
        if archive:
            sampler.start()
        out = subprocess.run(
            [
                *RAFTKV,
                "bench",
                "put",
                "--endpoints",
                ",".join(c.endpoints),
                "--target-leader",
                "--clients",
                "64",
                "--duration",
                str(duration_s),
                "--val-size",
                "256",
                "--key-space-size",
                "10000",
                "--json",
            ],
            check=True,
            capture_output=True,
            text=True,
            timeout=duration_s + 120,
        )
    finally:
        stop.set()
        if sampler.is_alive():
            sampler.join(5)
        c.stop(timeout_s=30)
    return json.loads(out.stdout), samples


def _throughput(result: dict) -> float:
    summary = result.get("summary", result)
    return float(summary.get("requests_per_s") or summary.get("throughput") or summary.get("rps"))


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=10)
    ap.add_argument("--skip-snapshot", action="store_true")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    report: dict = {}
    with tempfile.TemporaryDirectory(prefix="raftkv-archive-bench-") as root:
        if not args.skip_snapshot:
            snap = snapshot_round_trip(root, args.keys)
            report["snapshot"] = snap
            print(
                f"snapshot of {snap['keys']} keys ({snap['bytes'] / 1e6:.1f} MB): save "
                f"{snap['save_mb_s']:.1f} MB/s ({snap['save_s']:.2f} s), restore "
                f"{snap['restore_mb_s']:.1f} MB/s ({snap['restore_s']:.2f} s)",
                flush=True,
            )
        runs: dict[str, list[float]] = {"off": [], "on": []}
        lag: list[tuple[float, float]] = []
        for r in range(args.rounds):
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                result, samples = put_load(
                    os.path.join(root, f"{r}-{mode}"), mode == "on", args.duration
                )
                runs[mode].append(_throughput(result))
                lag += samples
                print(f"round {r + 1} archive {mode:3s}: {runs[mode][-1]:.0f} puts/s", flush=True)
    off, on = statistics.median(runs["off"]), statistics.median(runs["on"])
    entries, seconds = [e for e, _ in lag], [s for _, s in lag]
    report["archive"] = {
        "puts_per_s_off": runs["off"],
        "puts_per_s_on": runs["on"],
        "median_off": off,
        "median_on": on,
        "cost_pct": 100 * (1 - on / off),
        "lag_entries_p50_p99_max": [pct(entries, 50), pct(entries, 99), max(entries, default=0)],
        "lag_seconds_p50_p99_max": [pct(seconds, 50), pct(seconds, 99), max(seconds, default=0)],
        "lag_samples": len(lag),
    }
    a = report["archive"]
    print(
        f"puts/s at 64 clients, median of {args.rounds}: off {off:.0f}, on {on:.0f} "
        f"({a['cost_pct']:+.1f} % cost)"
    )
    print(
        f"archive lag over {len(lag)} samples: entries p50/p99/max "
        f"{'/'.join(f'{x:.0f}' for x in a['lag_entries_p50_p99_max'])}; seconds "
        f"{'/'.join(f'{x:.2f}' for x in a['lag_seconds_p50_p99_max'])}"
    )
    print(f"(load average at the end: {os.getloadavg()[0]:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
