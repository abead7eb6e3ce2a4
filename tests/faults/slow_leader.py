"""The slow-leader run: a three-member cluster under a write load, then one member's every
fdatasync made slow (the ``tests.faults.shims`` LD_PRELOAD shim), first a follower's, then
the leader's, then healed. Per phase: puts/s, p99 latency, who leads. The table in
docs/reliability.md comes from ``python -m tests.faults.slow_leader`` (defaults below);
``tests/faults/test_slow_disk.py`` runs it shorter and checks the leader gave way.

In the slow-leader phase, ``after_transfer`` is the part from ``settle_s`` after the disk
turned slow on: what a client sees once the leader gave way.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass

from tests.cluster.harness import wait_healthy
from tests.faults import shims
from tests.faults.support import FaultCluster, Load, check_acked, metric


@dataclass
class Phase:
    name: str
    puts_per_s: float
    p99_ms: float
    leader: str
    slow: str


def run(
    workdir: str,
    *,
    phase_s: float = 10.0,
    slow_phase_s: float = 15.0,
    settle_s: float = 5.0,
    delay_ms: int = 500,
    threads: int = 16,
    extra_args: tuple[str, ...] = (),
    log=print,
) -> tuple[list[Phase], dict]:
    lib = shims.build_slowsync(workdir)
    controls = {f"node{i}": os.path.join(workdir, f"slow-node{i}") for i in (1, 2, 3)}
    cluster = FaultCluster(
        os.path.join(workdir, "cluster"),
        size=3,
        extra_args=list(extra_args),
        node_env={name: shims.slowsync_env(lib, path) for name, path in controls.items()},
    )
    phases: list[Phase] = []
    facts: dict = {}
    cluster.start()
    load = None
    try:
        wait_healthy(cluster)
        load = Load(cluster.endpoints, threads=threads).start()
        time.sleep(2)  # warm-up: connections opened, the first snapshot out of the way

        def measure(name: str, seconds: float, slow: str) -> tuple[float, float]:
            start = time.monotonic()
            time.sleep(seconds)
            end = time.monotonic()
            lead = cluster.leader().name
            ph = Phase(name, load.rate(start, end), load.p99(start, end) * 1000, lead, slow)
            phases.append(ph)
            log(f"{ph.name}: {ph.puts_per_s:.0f} puts/s, p99 {ph.p99_ms:.0f} ms, leader {lead}")
            return start, end

        measure("baseline", phase_s, "-")
        first = cluster.leader()
        follower = next(n for n in cluster.nodes if n is not first)
        shims.set_delay(controls[follower.name], delay_ms)
        measure("slow follower", phase_s, follower.name)
        shims.set_delay(controls[follower.name], 0)

        leader = cluster.leader()
        shims.set_delay(controls[leader.name], delay_ms)
        stalled_at = time.monotonic()
        moved_at = None
        deadline = stalled_at + slow_phase_s
        while time.monotonic() < deadline:
            lead = cluster.leader()
            if moved_at is None and lead is not leader:
                moved_at = time.monotonic()
            time.sleep(0.2)
        end = time.monotonic()
        lead = cluster.leader()
        phases.append(
            Phase(
                "slow leader (whole phase)",
                load.rate(stalled_at, end),
                load.p99(stalled_at, end) * 1000,
                f"{leader.name} -> {lead.name}",
                leader.name,
            )
        )
        phases.append(
            Phase(
                f"slow leader (from {settle_s:g} s after the disk turned slow)",
                load.rate(stalled_at + settle_s, end),
                load.p99(stalled_at + settle_s, end) * 1000,
                lead.name,
                leader.name,
            )
        )
        log(f"{phases[-2]}\n{phases[-1]}")
        facts["per_second"] = [
            round(load.rate(stalled_at + i, stalled_at + i + 1)) for i in range(int(slow_phase_s))
        ]
        facts["slow_leader"] = leader.name
        facts["moved_after_s"] = None if moved_at is None else moved_at - stalled_at
        facts["transfers"] = metric(leader, "raftkv_slow_disk_leader_transfers_total")
        shims.set_delay(controls[leader.name], 0)
        measure("healed", phase_s, "-")
    finally:
        if load is not None:
            load.stop()
            facts["acked"] = load.acked_count()
            facts["errors"] = load.errors
    try:
        check_acked(cluster, load.acked if load else {})
        facts["lost"] = 0
    finally:
        cluster.stop()
    return phases, facts


def table(phases: list[Phase]) -> str:
    rows = ["| phase | slow disk | puts/s | p99 (ms) | leader |", "|---|---|---:|---:|---|"]
    rows += [
        f"| {p.name} | {p.slow} | {p.puts_per_s:.0f} | {p.p99_ms:.0f} | {p.leader} |"
        for p in phases
    ]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--phase-s", type=float, default=10.0)
    ap.add_argument("--slow-phase-s", type=float, default=15.0)
    ap.add_argument("--delay-ms", type=int, default=500)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--no-transfer", action="store_true", help="--slow-disk-transfer false")
    args = ap.parse_args()
    extra = ("--slow-disk-transfer", "false") if args.no_transfer else ()
    with tempfile.TemporaryDirectory(prefix="slow-leader-") as tmp:
        phases, facts = run(
            tmp,
            phase_s=args.phase_s,
            slow_phase_s=args.slow_phase_s,
            delay_ms=args.delay_ms,
            threads=args.threads,
            extra_args=extra,
        )
    print(table(phases))
    print(facts)


if __name__ == "__main__":
    main()
