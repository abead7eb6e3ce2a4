"""Hostile HTTP/2 clients against raftkv's and etcd's leaders, side by side.

    .venv/bin/python benchmarks/abuse.py                       # every attack, 10 s each
    .venv/bin/python benchmarks/abuse.py --attacks rapid_reset,zero_window --seconds 5

Each system is a three-member cluster on loopback (``benchmarks/systems.py``; raftkv with the
defaults ``raftkv serve`` gives, front ends included; etcd 3.4 from Debian with its own).
Twenty 100 KB values under ``abuse/big/`` make one Range answer 2 MB. Then, for each attack
of ``kvserver.bench.h2_attacks`` (the same code ``tests/abuse`` runs), against the leader's
client URL, while an honest gRPC client puts and ranges every 0.5 s with a 3 s deadline:

- RSS growth: the leader's resident memory at the end of the attack minus before (raftkv:
  the member and its front ends), and what is still held 3 s after the attack;
- whether the leader changed (an election: the leader or the term moved);
- how often raftkv's event loop ran more than 64 ms late meanwhile (its
  ``raftkv_loop_stall_seconds``; etcd has no such figure);
- the honest calls that failed or ran past their deadline, and the slowest;
- what the attacker got back.

Prints one table (``--json`` for a machine). Timings vary with the machine; the table's
point is the comparison, in one run, with the same attack code.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import tempfile
import time
import urllib.request
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.systems import EtcdSystem, RaftkvSystem, System  # noqa: E402
from kvserver.bench import h2_attacks  # noqa: E402
from kvserver.bench.abuse_victim import HonestClient, process_rss  # noqa: E402
from kvserver.bench.result import find_leader, post_json  # noqa: E402

SETTLE_S = 3.0


def leader_state(url: str) -> tuple[str, str]:
    st = post_json(url, "/v3/maintenance/status", {})
    return str(st.get("leader", "")), str(st.get("header", {}).get("raft_term", ""))


STALL_OVER_S = "0.064"  # a loop late by more than this: raft's ticks are 100 ms apart


def late_turns(url: str) -> int | None:
    """How often the member's loop ran more than 64 ms late so far (raftkv's
    ``raftkv_loop_stall_seconds``; None for a server without it)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    total = re.search(r"^raftkv_loop_stall_seconds_count (\S+)$", text, re.M)
    within = re.search(
        rf'^raftkv_loop_stall_seconds_bucket\{{le="{STALL_OVER_S}"\}} (\S+)$', text, re.M
    )
    if total is None or within is None:
        return None
    return int(float(total.group(1)) - float(within.group(1)))


def leader_pid(system: System, url: str) -> int:
    index = system.urls.index(url)
    proc = system.member_proc(index)
    assert proc is not None
    return proc.pid


def load(url: str) -> None:
    value = base64.b64encode(b"v" * 100_000).decode()
    for i in range(20):
        key = base64.b64encode(f"abuse/big/{i:02d}".encode()).decode()
        post_json(url, "/v3/kv/put", {"key": key, "value": value}, timeout_s=10.0)


def run_attack(system: System, name: str, seconds: float) -> dict:
    leader = find_leader(system.urls)
    pid = leader_pid(system, leader)
    before = leader_state(leader)
    rss_before = process_rss(pid)
    late_before = late_turns(leader)
    host, port = urlsplit(leader).hostname or "127.0.0.1", urlsplit(leader).port or 2379
    honest = HonestClient(f"{host}:{port}")
    honest.start()
    started = time.monotonic()
    result = h2_attacks.ATTACKS[name](host, port, seconds)
    rss_end = process_rss(pid)
    time.sleep(max(0.0, started + seconds - time.monotonic()))
    report = honest.stop()
    time.sleep(SETTLE_S)
    rss_after = process_rss(pid)
    late_after = late_turns(leader)
    try:
        after = leader_state(find_leader(system.urls))
    except Exception as exc:  # noqa: BLE001 - a cluster the attack broke is a result too
        after = ("?", str(exc))
    return {
        "growth_mb": (rss_end - rss_before) / 2**20,
        "held_mb": (rss_after - rss_before) / 2**20,
        "leader_changed": after != before,
        "honest_calls": report.calls,
        "honest_failed": len(report.failures),
        "honest_slowest_ms": report.slowest_s * 1000,
        "answer": result.answer(),
        "late_turns": None
        if late_before is None or late_after is None
        else late_after - late_before,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attacks", default=",".join(h2_attacks.ATTACKS))
    ap.add_argument("--systems", default="raftkv,etcd")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    attacks = [a for a in args.attacks.split(",") if a]
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory(prefix="raftkv-abuse-") as root:
        for name in args.systems.split(","):
            system: System = RaftkvSystem(root) if name == "raftkv" else EtcdSystem(root)
            with system:
                load(system.wait_ready())
                results[name] = {}
                for attack in attacks:
                    print(f"{name}: {attack} ...", file=sys.stderr, flush=True)
                    results[name][attack] = run_attack(system, attack, args.seconds)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    systems = list(results)
    header = ["attack"] + [
        f"{s}: {col}"
        for s in systems
        for col in ("RSS +MB (held)", "leader", "loop >64 ms", "honest", "answer")
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for attack in attacks:
        row = [attack]
        for s in systems:
            r = results[s][attack]
            row += [
                f"{r['growth_mb']:+.0f} ({r['held_mb']:+.0f})",
                "changed" if r["leader_changed"] else "kept",
                "-" if r["late_turns"] is None else str(r["late_turns"]),
                f"{r['honest_calls'] - r['honest_failed']}/{r['honest_calls']} ok, "
                f"max {r['honest_slowest_ms']:.0f} ms",
                r["answer"],
            ]
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
