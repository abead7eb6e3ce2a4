"""TLS on vs off, side by side in one run: ``python -m kvserver.bench.tls_compare``.

Starts two local three-member clusters of real processes on free ports — one plain HTTP,
one as ``raftkv cluster up --tls`` makes it (https clients and peers, peer certificates
checked) — and benches them alternately, round after round, with the same ``raftkv bench``
commands: puts at 64 clients (throughput) and puts at 1 client (p50 latency), each to the
leader. Alternating rounds spread the machine's background load over both sides. Prints a
Markdown table of the medians over rounds and the per-round numbers; the clusters are
stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from kvserver.bench.process import bench_process, wait_writable
from kvserver.localcluster.launcher import LocalCluster

PUT = ["put", "--target-leader", "--val-size", "256", "--key-space-size", "10000"]


def _bench(cluster: LocalCluster, clients: int, duration_s: float) -> dict:
    ca = cluster.pki.ca_file if cluster.pki is not None else None
    return bench_process(cluster.endpoints, PUT, clients, duration_s, ca_file=ca)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kvserver.bench.tls_compare", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    p.add_argument("--data-dir", default=None, help="default: a temporary directory")
    args = p.parse_args(argv)
    root = args.data_dir or tempfile.mkdtemp(prefix="raftkv-tls-compare-")
    sides = {
        "TLS off": LocalCluster(os.path.join(root, "plain"), size=3),
        "TLS on": LocalCluster(os.path.join(root, "tls"), size=3, tls=True),
    }
    results: dict[str, dict[str, list[float]]] = {n: {"tput64": [], "p50_1": []} for n in sides}
    try:
        for cluster in sides.values():
            cluster.start()
        for cluster in sides.values():
            wait_writable(
                cluster.endpoints,
                ca_file=cluster.pki.ca_file if cluster.pki else None,
                what=f"cluster in {cluster.data_dir}",
            )
        for r in range(args.rounds):
            for name, cluster in sides.items():
                many = _bench(cluster, 64, args.duration)
                one = _bench(cluster, 1, args.duration)
                results[name]["tput64"].append(many["requests_per_s"])
                results[name]["p50_1"].append(one["percentiles_s"]["50"] * 1000)
                print(
                    f"round {r + 1} {name}: {many['requests_per_s']:.0f} puts/s at 64 "
                    f"clients, p50 {one['percentiles_s']['50'] * 1000:.2f} ms at 1 client "
                    f"(errors {many['errors']}, {one['errors']})",
                    file=sys.stderr,
                )
    finally:
        for cluster in sides.values():
            cluster.stop()
    print("| | puts/s, 64 clients (median) | p50 ms, 1 client (median) | rounds |")
    print("|---|---|---|---|")
    for name, res in results.items():
        print(
            f"| {name} | {statistics.median(res['tput64']):.0f} | "
            f"{statistics.median(res['p50_1']):.2f} | "
            f"{', '.join(f'{t:.0f}/{q:.2f}' for t, q in zip(res['tput64'], res['p50_1'], strict=True))} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
