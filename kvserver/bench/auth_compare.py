"""Auth on vs off, side by side in one run: ``python -m kvserver.bench.auth_compare``.

Starts one local three-member cluster of real processes on free ports, creates ``root`` and a
user ``bench`` whose role may read and write the prefix the benchmark's keys use (a non-root
user, so every request pays the token lookup and the permission check), then alternates, round
after round, auth disabled (``raftkv bench`` without credentials) and auth enabled (``raftkv
bench --user bench:...``, one token for the run) with the same commands: puts at 64 clients
(throughput) and puts at 1 client (p50 latency), each to the leader. One cluster for both sides
keeps data size and placement equal; alternating spreads the machine's background load. Prints
a Markdown table of the medians and the per-round numbers; the cluster is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from kvserver.bench.process import bench_process, wait_writable
from kvserver.client import Client
from kvserver.localcluster.launcher import LocalCluster

KEY_SIZE, KEY_SPACE = 8, 10000  # keys "00000000".."00009999": all under prefix "0000"
PUT = [
    "put",
    "--target-leader",
    "--val-size",
    "256",
    "--key-size",
    str(KEY_SIZE),
    "--key-space-size",
    str(KEY_SPACE),
]
ROOT_PW, BENCH_PW = "root-bench-pw", "bench-pw"


def _bench(cluster: LocalCluster, clients: int, duration_s: float, user: str | None) -> dict:
    return bench_process(cluster.endpoints, PUT, clients, duration_s, user=user)


def _setup(cluster: LocalCluster, timeout_s: float = 90.0) -> None:
    wait_writable(cluster.endpoints, timeout_s=timeout_s, what=f"cluster in {cluster.data_dir}")
    with Client(cluster.endpoints, timeout_s=5) as c:
        for op, body in (
            ("user/add", {"name": "root", "password": ROOT_PW}),
            ("user/grant", {"user": "root", "role": "root"}),
            ("role/add", {"name": "bench"}),
            (
                "role/grant",
                {
                    "name": "bench",
                    "perm": {
                        "permType": "READWRITE",
                        "key": "MDAwMA==",  # "0000"
                        "range_end": "MDAwMQ==",
                    },
                },
            ),  # "0001"
            ("user/add", {"name": "bench", "password": BENCH_PW}),
            ("user/grant", {"user": "bench", "role": "bench"}),
        ):
            c.auth_request(op, body)


def _set_auth(cluster: LocalCluster, enabled: bool) -> None:
    if enabled:
        with Client(cluster.endpoints, timeout_s=10) as c:
            c.auth_request("enable")
    else:
        with Client(cluster.endpoints, timeout_s=10, user="root", password=ROOT_PW) as c:
            c.auth_request("disable")
    with Client(cluster.endpoints, timeout_s=10) as c:  # status needs no credentials
        if bool(c.auth_request("status").get("enabled")) != enabled:
            raise SystemExit(f"auth is not {'enabled' if enabled else 'disabled'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvserver.bench.auth_compare", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    p.add_argument("--data-dir", default=None, help="default: a temporary directory")
    args = p.parse_args(argv)
    root = args.data_dir or tempfile.mkdtemp(prefix="raftkv-auth-compare-")
    cluster = LocalCluster(os.path.join(root, "c"), size=3)
    sides = {"auth off": None, "auth on (user with a prefix)": f"bench:{BENCH_PW}"}
    results: dict[str, dict[str, list[float]]] = {n: {"tput64": [], "p50_1": []} for n in sides}
    try:
        cluster.start()
        _setup(cluster)
        for r in range(args.rounds):
            for name, user in sides.items():
                _set_auth(cluster, user is not None)
                many = _bench(cluster, 64, args.duration, user)
                one = _bench(cluster, 1, args.duration, user)
                results[name]["tput64"].append(many["requests_per_s"])
                results[name]["p50_1"].append(one["percentiles_s"]["50"] * 1000)
                print(
                    f"round {r + 1} {name}: {many['requests_per_s']:.0f} puts/s at 64 "
                    f"clients, p50 {one['percentiles_s']['50'] * 1000:.2f} ms at 1 client "
                    f"(errors {many['errors']}, {one['errors']})",
                    file=sys.stderr,
                )
    finally:
        cluster.stop()
    print("| | puts/s, 64 clients (median) | p50 ms, 1 client (median) | rounds |")
    print("|---|---|---|---|")
    for name, res in results.items():
        rounds = ", ".join(
            f"{t:.0f}/{q:.2f}" for t, q in zip(res["tput64"], res["p50_1"], strict=True)
        )
        print(
            f"| {name} | {statistics.median(res['tput64']):.0f} | "
            f"{statistics.median(res['p50_1']):.2f} | {rounds} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
