"""Failover: time from a leader's SIGKILL to the first acknowledged write, raftkv vs etcd.

One run measures both systems side by side: rounds alternate (raftkv, etcd, raftkv, ...), each
round SIGKILLs the current leader of that system's three-node cluster (default flags:
heartbeat 100 ms, election timeout 1000 ms, for both) and times, from the kill, the first put
that any surviving member acknowledges. Writers run in parallel on every surviving member
(a new put to every survivor every 50 ms, each with its own timeout), so a member that holds
a request while it has no leader does not delay the measurement beyond 50 ms. Then the killed member is
restarted and the round waits until all three answer and a write succeeds again.

    .venv/bin/python -m benchmarks.failover --rounds 20 [--systems raftkv,etcd] [--json F]

Prints p50/p90/p99/max per system. The numbers are wall-clock on whatever machine runs it;
run it on a quiet machine for docs.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error

from benchmarks.systems import EtcdSystem, RaftkvSystem, System
from kvserver.bench.result import BenchError, find_leader, post_json

ATTEMPT_TIMEOUT_S = 2.0
STAGGER_S = 0.05
ROUND_LIMIT_S = 30.0


def _procs(system: System) -> list[subprocess.Popen]:
    if isinstance(system, RaftkvSystem):
        return [n.proc for n in system.cluster.nodes]
    return list(system.procs.procs)


def _restart(system: System, index: int) -> None:
    if isinstance(system, RaftkvSystem):
        system.cluster.start_node(system.cluster.nodes[index])
        return
    old = system.procs.procs[index]
    with open(system.procs.logs[index], "ab") as log:
        system.procs.procs[index] = subprocess.Popen(
            old.args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _put(url: str, key: str) -> bool:
    body = {
        "key": base64.b64encode(key.encode()).decode(),
        "value": base64.b64encode(b"x").decode(),
    }
    try:
        post_json(url, "/v3/kv/put", body, timeout_s=ATTEMPT_TIMEOUT_S)
        return True
    except (OSError, ValueError, urllib.error.URLError):
        return False


def first_ack_after_kill(system: System, round_no: int) -> float:
    """Kill the leader; seconds until a surviving member acknowledges a put."""
    leader = find_leader(system.urls, timeout_s=ROUND_LIMIT_S)
    index = system.urls.index(leader)
    survivors = [u for i, u in enumerate(system.urls) if i != index]
    done = threading.Event()
    acked: list[float] = []
    _procs(system)[index].send_signal(signal.SIGKILL)
    _procs(system)[index].wait(timeout=10)
    t0 = time.monotonic()

    def attempt(url: str, key: str) -> None:
        if _put(url, key):
            acked.append(time.monotonic() - t0)
            done.set()

    # A new attempt on every survivor every STAGGER_S, each in its own thread: a member that
    # holds a put while it has no leader (until the attempt's timeout) cannot hide the moment
    # the cluster starts acknowledging again.
    n = 0
    while not done.is_set() and time.monotonic() - t0 < ROUND_LIMIT_S:
        for url in survivors:
            n += 1
            threading.Thread(
                target=attempt, args=(url, f"failover/{round_no}/{n}"), daemon=True
            ).start()
        done.wait(STAGGER_S)
    done.set()
    _restart(system, index)
    system.wait_ready()
    # Every member answers again before the next kill (the restarted one has caught up
    # enough to know the leader).
    deadline = time.monotonic() + ROUND_LIMIT_S
    while time.monotonic() < deadline:
        try:
            if all(
                str(post_json(u, "/v3/maintenance/status", {}).get("leader", "0")) != "0"
                for u in system.urls
            ):
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    if not acked:
        raise BenchError(
            f"{system.name}: no write acknowledged within {ROUND_LIMIT_S:g} s "
            f"of killing its leader (round {round_no})"
        )
    return min(acked)


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * len(s) + 0.5) - 1))]


def summarize(samples: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        name: {
            "rounds": len(xs),
            "p50_s": statistics.median(xs),
            "p90_s": percentile(xs, 90),
            "p99_s": percentile(xs, 99),
            "max_s": max(xs),
        }
        for name, xs in samples.items()
        if xs
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--systems", default="raftkv,etcd")
    ap.add_argument("--json", metavar="FILE", help="also write the samples and summary here")
    ap.add_argument(
        "--keep",
        metavar="DIR",
        help="keep data and logs in DIR (default: a temporary directory, removed afterwards)",
    )
    args = ap.parse_args(argv)
    names = [n for n in args.systems.split(",") if n]
    classes = {"raftkv": RaftkvSystem, "etcd": EtcdSystem}
    samples: dict[str, list[float]] = {n: [] for n in names}
    with (
        contextlib.nullcontext(args.keep)
        if args.keep
        else tempfile.TemporaryDirectory(prefix="raftkv-failover-")
    ) as root:
        systems = [classes[n](root) for n in names]
        try:
            for s in systems:
                s.start()
            for s in systems:
                s.wait_ready()
            for r in range(args.rounds):
                for s in systems:
                    dt = first_ack_after_kill(s, r)
                    samples[s.name].append(dt)
                    print(f"round {r + 1:2d} {s.name:7s} first ack after {dt:.3f} s", flush=True)
        finally:
            for s in systems:
                s.stop()
    summary = summarize(samples)
    print(f"\n{'system':8s} {'rounds':>6s} {'p50 s':>7s} {'p90 s':>7s} {'p99 s':>7s} {'max s':>7s}")
    for name, row in summary.items():
        print(
            f"{name:8s} {row['rounds']:6d} {row['p50_s']:7.3f} {row['p90_s']:7.3f} "
            f"{row['p99_s']:7.3f} {row['max_s']:7.3f}"
        )
    print(f"(load average at the end: {os.getloadavg()[0]:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": samples, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
