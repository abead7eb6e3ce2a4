"""How a store's gRPC put throughput changes with the cores it may use.

``python -m benchmarks.cores`` starts a one-member raftkv and a one-member etcd (Debian's;
``--members 3`` for three-member clusters),
one after the other, each time with this process, the member and the load generator
(``raftkv bench --protocol grpc``, two processes) pinned to a CPU set (``--cpu-sets``,
default ``0`` then ``0,1``; affinity is inherited by the processes started). For each set it
prints puts/s at ``--clients`` clients and the CPU per put of the member and of the load
generator, so the table shows both whether throughput grows with cores and where a member's
ceiling is (raftkv serves and runs raft on one event loop; its fsyncs run in a thread).

``--client-frontends N|auto`` starts each raftkv member with N client front-end processes
(``raftkv serve --client-frontends``; the default, ``auto``, is what ``raftkv serve`` does:
one per core of the set beyond the first, at least one); the CPU per put then counts them
with the member, and
``member loop`` is the member's own process alone, the part that cannot spread over cores.

Options: ``--systems raftkv,etcd``, ``--duration`` s per cell, ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from benchmarks.compare import bench_with_cpu
from benchmarks.systems import EtcdSystem, RaftkvSystem

SYSTEMS = {"raftkv": RaftkvSystem, "etcd": EtcdSystem}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--systems", default="raftkv,etcd")
    ap.add_argument("--cpu-sets", default="0;0,1", help="';'-separated CPU lists")
    ap.add_argument("--members", type=int, default=1, help="members per store")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--client-frontends", default="auto", help="per raftkv member: N or auto")
    ap.add_argument(
        "--protocol",
        choices=("grpc", "grpc-lean"),
        default="grpc",
        help="the load generator's client: grpc.aio, or the lean one that leaves the server "
        "more of the machine",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    # the fields compare.bench reads
    args.procs, args.val_size, args.key_space_size = 2, 256, 10000
    return args


def measure(system_name: str, cpus: set[int], args: argparse.Namespace, root: str) -> dict:
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)  # the member and the load processes inherit it
    try:
        path = os.path.join(root, f"{system_name}-{len(cpus)}")
        if system_name == "raftkv":
            frontends = ["--client-frontends", str(args.client_frontends)]
            store = RaftkvSystem(path, extra_args=frontends, size=args.members)
        else:
            store = SYSTEMS[system_name](path, size=args.members)
        with store as system:
            leader = system.wait_ready()
            if args.warmup:
                bench_with_cpu(system, leader, "put", args.clients, _for(args, args.warmup))
            r = bench_with_cpu(system, leader, "put", args.clients, args)
    finally:
        os.sched_setaffinity(0, before)
    return {
        "system": system_name,
        "cpus": sorted(cpus),
        "ops_per_s": r["ops_per_s"],
        "p50_ms": r["p50_ms"],
        "errors": r["errors"],
        "members_cpu_us_per_put": r.get("cpu_us_per_op", {}).get("servers"),
        "busiest_member_cpu_us_per_put": r.get("cpu_us_per_op", {}).get("busiest_server"),
        "load_generator_cpu_us_per_put": r.get("cpu_us_per_op", {}).get("load_generator"),
        "others_cores": r["others_cores"],
    }


def _for(args: argparse.Namespace, duration: float) -> argparse.Namespace:
    warm = argparse.Namespace(**vars(args))
    warm.duration = duration
    return warm


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cpu_sets = [{int(c) for c in s.split(",")} for s in args.cpu_sets.split(";")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="raftkv-cores-") as root:
        for name in args.systems.split(","):
            for cpus in cpu_sets:
                row = measure(name, cpus, args, root)
                rows.append(row)
                print(
                    f"{name:7} cores {','.join(map(str, row['cpus'])):5} "
                    f"{row['ops_per_s']:8.0f} puts/s  p50 {row['p50_ms']:6.2f} ms  "
                    f"members {row['members_cpu_us_per_put'] or 0:5.0f} us/put "
                    f"(busiest {row['busiest_member_cpu_us_per_put'] or 0:4.0f})  "
                    f"load generator {row['load_generator_cpu_us_per_put'] or 0:5.0f} us/put  "
                    f"errors {row['errors']}  others {row['others_cores']:.2f} cores",
                    flush=True,
                )
    for name in args.systems.split(","):
        mine = [r for r in rows if r["system"] == name]
        if len(mine) >= 2 and mine[0]["ops_per_s"]:
            print(
                f"{name}: {mine[-1]['ops_per_s'] / mine[0]['ops_per_s']:.2f}x puts/s from "
                f"{len(mine[0]['cpus'])} to {len(mine[-1]['cpus'])} cores"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
