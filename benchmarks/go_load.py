"""raftkv beside etcd under load from etcd's own Go client (clientv3 3.4), in one run.

    make etcd-bench && .venv/bin/python benchmarks/go_load.py
    .venv/bin/python benchmarks/go_load.py --only watch --watchers 5000 --rate 40

Each system is a three-member cluster on loopback (``benchmarks/systems.py``; raftkv with
what ``raftkv serve`` defaults to, front ends included; etcd 3.4 from Debian). The load is
``.build/etcd-bench`` (``benchmarks/etcdbench``), every call to the leader:

- puts at 1, 16 and 64 clients over 10 connections (1 at 1 client), 256-byte values;
- linearizable ranges of one key at 64 clients;
- watch fan-out: ``--watchers`` watches on one prefix over 10 connections, one writer at
  ``--rate`` puts a second: events delivered a second, the writer's puts a second, and the
  delivery latency (the writer's clock to the watcher's).
  ``--client-window`` sets the watchers' receive windows instead of grpc-go's default (64 KiB,
  grown by its bandwidth-delay estimate): with the default, how fast a server answers
  the client's pings sets how soon the windows grow.

Prints one table; ``--json`` prints the numbers. The load generator's CPU is Go's, so it takes
less of the machine from a Python server than a Python load generator would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.systems import (  # noqa: E402
    EtcdSystem,
    RaftkvSystem,
    System,
    frontend_pids,
    process_cpu_s,
)
from kvserver.bench.result import find_leader  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.path.join(ROOT, ".build", "etcd-bench")


def etcd_bench(endpoint: str, *args: str, timeout_s: float = 120.0) -> dict:
    out = subprocess.run(
        [BINARY, "-endpoints", endpoint, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    return json.loads(out.stdout)


def workloads(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    d = f"{args.duration}s"
    runs = [
        ("put, 1 client", ["-op", "put", "-clients", "1", "-conns", "1", "-duration", d]),
        ("put, 16 clients", ["-op", "put", "-clients", "16", "-conns", "10", "-duration", d]),
        ("put, 64 clients", ["-op", "put", "-clients", "64", "-conns", "10", "-duration", d]),
        ("range, 64 clients", ["-op", "range", "-clients", "64", "-conns", "10", "-duration", d]),
        (
            f"watch, {args.watchers} watchers at {args.rate:g} puts/s",
            [
                "-op",
                "watch",
                "-watchers",
                str(args.watchers),
                "-conns",
                "10",
                "-rate",
                str(args.rate),
                "-duration",
                d,
                "-window",
                str(args.client_window),
            ],
        ),
    ]
    return [r for r in runs if args.only is None or r[1][1] == args.only]


def cpu_s(pids: list[int]) -> float:
    return sum(process_cpu_s(pid) for pid in pids)


def measure(system: System, runs: list[tuple[str, list[str]]]) -> dict[str, dict]:
    """Each run's numbers from the load generator, plus the servers' CPU per operation:
    ``cpu_us_per_op`` over every server process, ``leader_us_per_op`` over the leader's own
    process (a raftkv member without its front ends: the part that cannot spread over cores)."""
    with system:
        system.wait_ready()
        leader_url = find_leader(system.urls)
        leader = urlsplit(leader_url).netloc
        leader_proc = system.member_proc(system.urls.index(leader_url))
        assert leader_proc is not None
        out = {}
        for name, flags in runs:
            print(f"{system.name}: {name} ...", file=sys.stderr, flush=True)
            pids = system.pids()
            before, leader_before = cpu_s(pids), process_cpu_s(leader_proc.pid)
            r = etcd_bench(leader, *flags)
            ops = r["events"] if r["op"] == "watch" else r["ops"]
            if ops:
                r["cpu_us_per_op"] = 1e6 * (cpu_s(pids) - before) / ops
                r["leader_us_per_op"] = 1e6 * (process_cpu_s(leader_proc.pid) - leader_before) / ops
                r["leader_frontends"] = len(frontend_pids(leader_proc.pid))
            out[name] = r
        return out


def cell(r: dict) -> str:
    if r["op"] == "watch":
        return (
            f"{r['events_per_s']:,.0f} ev/s ({r['events']:,}/{r['expected_events']:,}), "
            f"writer {r['writer_puts_per_s']:.0f}/s, p50 {r['p50_ms']:.1f} ms"
        )
    return f"{r['ops_per_s']:,.0f}/s, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--watchers", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--only", choices=("put", "range", "watch"), default=None)
    ap.add_argument("--raftkv-args", default="", help="extra flags for raftkv serve")
    ap.add_argument(
        "--client-window",
        type=int,
        default=0,
        help="the watchers' stream receive window in bytes (0: grpc-go's default, 64 KiB "
        "growing by its bandwidth-delay estimate)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not os.path.exists(BINARY):
        print("build the load generator first: make etcd-bench", file=sys.stderr)
        return 2
    runs = workloads(args)
    with tempfile.TemporaryDirectory(prefix="raftkv-go-load-") as root:
        results = {
            "raftkv": measure(RaftkvSystem(root, extra_args=args.raftkv_args.split()), runs),
            "etcd": measure(EtcdSystem(root), runs),
        }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print("| workload | raftkv | etcd 3.4 | raftkv/etcd |")
    print("|---|---|---|---|")
    for name, _ in runs:
        a, b = results["raftkv"][name], results["etcd"][name]
        key = "events_per_s" if a["op"] == "watch" else "ops_per_s"
        ratio = a[key] / b[key] if b[key] else float("nan")
        print(f"| {name} | {cell(a)} | {cell(b)} | {ratio:.2f}x |")
    print()
    print("Server CPU per operation (per event for watch), microseconds: every server process,")
    print("and the leader's own process (raftkv: the member without its front ends).")
    print()
    print(
        "| workload | raftkv, all servers | raftkv, leader's process | etcd, all servers | etcd, leader |"
    )
    print("|---|---|---|---|---|")
    for name, _ in runs:
        a, b = results["raftkv"][name], results["etcd"][name]
        print(
            f"| {name} | {a.get('cpu_us_per_op', 0):.0f} | {a.get('leader_us_per_op', 0):.0f} | "
            f"{b.get('cpu_us_per_op', 0):.0f} | {b.get('leader_us_per_op', 0):.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
