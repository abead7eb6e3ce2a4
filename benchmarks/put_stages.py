"""One put at a time, timed stage by stage across the client, the leader's front end, the
leader and its followers; beside etcd's p50 through the same client.

    .venv/bin/python benchmarks/put_stages.py [--puts 2000] [--json]

A three-member raftkv cluster on loopback, as ``raftkv serve`` starts it (front ends on),
with ``RAFTKV_STAGE_TRACE`` set: every process keeps stage marks (``kvserver/stages.py``)
and writes them when it stops. A gRPC client (grpcio, synchronous, one connection) puts
256-byte values to the leader one at a time, marking when each call starts and returns on
the same clock (CLOCK_MONOTONIC). For each put, each stage's time is the first mark of that
stage after the put's previous stage, in the process where it happens:

    client ─▶ front end ─▶ link ─▶ member ─▶ raft ─▶ appends sent ─┬─▶ leader's write+fsync ─┐
                                                                   └─▶ follower round trip ─┴─▶ commit ─▶ apply ─▶ link ─▶ front end ─▶ client

The leader's write and the follower's round trip run at the same time; the put waits for
the later one (a quorum of three is the leader and one follower), and the table says which
one that was how often. The stage times of a put add up to what the client measured.
Then the same client puts to a three-member etcd 3.4 (Debian's) for its p50.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc  # noqa: E402

from benchmarks.systems import EtcdSystem, RaftkvSystem, frontend_pids  # noqa: E402
from kvserver.bench.result import find_leader  # noqa: E402
from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc  # noqa: E402

WARMUP_PUTS = 200
VALUE = b"v" * 256

Marks = dict[str, list[int]]  # stage -> sorted monotonic ns


def grpc_target(url: str) -> str:
    return url.split("://", 1)[1]


def timed_puts(url: str, puts: int) -> list[tuple[int, int]]:
    """(start, end) in monotonic ns of each put after a warm-up."""
    with grpc.insecure_channel(grpc_target(url)) as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        for i in range(WARMUP_PUTS):
            kv.Put(rpc_pb2.PutRequest(key=b"warm/%d" % i, value=VALUE), timeout=10)
        out = []
        for i in range(puts):
            req = rpc_pb2.PutRequest(key=b"stage/%d" % (i % 1000), value=VALUE)
            start = time.monotonic_ns()
            kv.Put(req, timeout=10)
            out.append((start, time.monotonic_ns()))
        return out


def read_marks(directory: str, pid: int) -> Marks:
    marks: Marks = defaultdict(list)
    with open(os.path.join(directory, f"{pid}.stages")) as f:
        for line in f:
            stage, _tag, ns = line.split()
            marks[stage].append(int(ns))
    for times in marks.values():
        times.sort()
    return marks


def first_after(marks: Marks, stage: str, t: int) -> int:
    times = marks.get(stage, [])
    i = bisect.bisect_left(times, t)
    if i == len(times):
        raise LookupError(f"no {stage} after {t}")
    return times[i]


STAGES = [
    ("client to front end (grpcio's send, HTTP/2 in)", "client"),
    ("front end to member (link)", "link_in"),
    ("member: call to proposal (servicer, raft queue)", "servicer"),
    ("raft: proposal to appends sent", "raft"),
    ("leader's write and fsync (in parallel)", "leader_disk"),
    ("  pwrite", "pwrite"),
    ("  to the WAL thread", "hop"),
    ("  fdatasync", "fsync"),
    ("  back to the loop", "back"),
    ("follower round trip (in parallel)", "follower"),
    ("  appends to the follower", "to_follower"),
    ("  follower's write and fsync", "follower_disk"),
    ("    raft step and pwrite", "f_step"),
    ("    to the WAL thread", "f_hop"),
    ("    fdatasync", "f_fsync"),
    ("    back to the loop, acknowledgement sent", "f_back"),
    ("  acknowledgement to the leader", "ack"),
    ("quorum to commit", "commit"),
    ("apply", "apply"),
    ("answer to front end (caller woken, link)", "link_out"),
    ("front end to client (HTTP/2 out, grpcio)", "client_out"),
]
CRITICAL = ["client", "link_in", "servicer", "raft", "quorum", "commit", "apply", "link_out",
            "client_out"]  # fmt: skip


def put_stages(
    put: tuple[int, int], leader: Marks, frontend: Marks, followers: list[Marks]
) -> dict[str, int]:
    t0, t1 = put
    a = first_after(frontend, "fe.call", t0)
    b = first_after(leader, "link.call_in", a)
    c = first_after(leader, "raft.propose", b)
    d = first_after(leader, "raft.append_sent", c)
    w = first_after(leader, "wal.written", d)
    fs = first_after(leader, "wal.fsync_start", w)
    fe = first_after(leader, "wal.fsync_end", fs)
    lp = first_after(leader, "wal.persisted", fe)
    ack = first_after(leader, "peer.ack_recv", d)
    # the follower whose acknowledgement came first: the one that made the quorum
    chains = []
    for f in followers:
        try:
            r = first_after(f, "peer.append_recv", d)
            sent = first_after(f, "raft.ack_sent", r)
        except LookupError:
            continue
        chains.append((sent, r, f))
    sent, r, f = min(chains, key=lambda chain: chain[0])
    fw = first_after(f, "wal.written", r)
    ffs = first_after(f, "wal.fsync_start", fw)
    ffe = first_after(f, "wal.fsync_end", ffs)
    quorum = max(lp, ack)
    cm = first_after(leader, "raft.committed", quorum)
    ap = first_after(leader, "apply.done", cm)
    fr = first_after(frontend, "fe.reply", ap)
    return {
        "total": t1 - t0,
        "client": a - t0,
        "link_in": b - a,
        "servicer": c - b,
        "raft": d - c,
        "leader_disk": lp - d,
        "pwrite": w - d,
        "hop": fs - w,
        "fsync": fe - fs,
        "back": lp - fe,
        "follower": ack - d,
        "to_follower": r - d,
        "follower_disk": sent - r,
        "f_step": fw - r,
        "f_hop": ffs - fw,
        "f_fsync": ffe - ffs,
        "f_back": sent - ffe,
        "ack": ack - sent,
        "quorum": quorum - d,
        "leader_later": int(lp > ack),
        "commit": cm - quorum,
        "apply": ap - cm,
        "link_out": fr - ap,
        "client_out": t1 - fr,
    }


def p50_ms(values: list[int]) -> float:
    return statistics.median(values) / 1e6


def measure_raftkv(puts: int, extra_args: list[str]) -> tuple[list[dict[str, int]], int]:
    with tempfile.TemporaryDirectory() as root:
        trace = os.path.join(root, "stages")
        os.makedirs(trace)
        os.environ["RAFTKV_STAGE_TRACE"] = trace
        try:
            system = RaftkvSystem(root, extra_args)
            system.start()
        finally:
            del os.environ["RAFTKV_STAGE_TRACE"]
        try:
            leader_url = find_leader(system.urls)
            index = system.urls.index(leader_url)
            member_pids = [n.proc.pid for n in system.cluster.nodes]
            frontends = frontend_pids(member_pids[index])
            if len(frontends) != 1:
                raise SystemExit(f"the leader has {len(frontends)} front ends; run with one")
            times = timed_puts(leader_url, puts)
        finally:
            system.stop()
        leader = read_marks(trace, member_pids[index])
        frontend = read_marks(trace, frontends[0])
        followers = [read_marks(trace, p) for i, p in enumerate(member_pids) if i != index]
    rows, skipped = [], 0
    for put in times:
        try:
            rows.append(put_stages(put, leader, frontend, followers))
        except (LookupError, ValueError):
            skipped += 1
    return rows, skipped


def measure_etcd(puts: int) -> list[int]:
    with tempfile.TemporaryDirectory() as root:
        with EtcdSystem(root) as system:
            leader_url = find_leader(system.urls)
            return [end - start for start, end in timed_puts(leader_url, puts)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--puts", type=int, default=2000)
    ap.add_argument("--raftkv-args", default="--client-frontends 1")
    ap.add_argument("--no-etcd", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows, skipped = measure_raftkv(args.puts, args.raftkv_args.split())
    etcd = [] if args.no_etcd else measure_etcd(args.puts)
    p50 = {key: p50_ms([r[key] for r in rows]) for key in rows[0]}
    leader_later = sum(r["leader_later"] for r in rows) / len(rows)
    summed = sum(p50[key] for key in CRITICAL)
    result = {
        "puts": len(rows),
        "unmatched": skipped,
        "p50_ms": p50,
        "leader_write_later_share": leader_later,
        "etcd_p50_ms": p50_ms(etcd) if etcd else None,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{len(rows)} puts matched ({skipped} not), p50 of each stage:\n")
    print("| stage | p50 ms |")
    print("|---|---|")
    for label, key in STAGES:
        print(f"| {label} | {p50[key]:.3f} |")
    print(f"| the later of the two: the leader's write in {leader_later:.0%} of puts | "
          f"{p50['quorum']:.3f} |")  # fmt: skip
    print(f"| **sum of the critical path's p50s** | **{summed:.3f}** |")
    print(f"| **put, as the client measured** | **{p50['total']:.3f}** |")
    if etcd:
        print(f"| etcd 3.4, the same client | {p50_ms(etcd):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
