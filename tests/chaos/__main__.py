"""``python -m tests.chaos --duration 60 --nemesis kill,pause,partition --out DIR``

(``--soak --rounds 100 --keys 1000000 --members 3|5``: the soak of tests/chaos/soak.py, every
nemesis once per round, disk and clock faults included; prints a line per round and the
table, writes ``DIR/report.json`` and ``DIR/timeline.png``.)

(``--target compose``: the same against deploy/docker-compose.yml's three containers, with
Docker's faults; see tests/chaos/docker_members.py.)

Runs one chaos run (see :mod:`tests.chaos.runner`), prints the summary, writes
``DIR/report.json``, ``DIR/timeline.png``, ``DIR/operations.json`` and the members' logs under
``DIR/data``. Exit status 0 when every check passed, 1 when one failed, 2 when this machine
cannot run the requested faults (network namespaces need root, ``ip`` and ``iptables``).
"""

from __future__ import annotations

import argparse
import json
import sys

from tests.chaos.nemesis import ALL_FAULTS, FAMILIES
from tests.chaos.runner import ChaosConfig, ChaosUnavailable, run

SUMMARY_KEYS = (
    "ok",
    "rounds",
    "acked_writes",
    "lost_writes",
    "linearizability",
    "bank",
    "lock",
    "failover",
    "recovery_any_fault",
    "problems",
    "png",
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    p.add_argument(
        "--duration",
        type=float,
        default=60.0,
        help="seconds during which fault cycles start (every requested fault runs at least once)",
    )
    p.add_argument(
        "--nemesis",
        default=p_default_nemesis(),
        help=f"(with --soak: soak faults, default all of them) families ({', '.join(FAMILIES)}, all) or faults "
        f"({', '.join(ALL_FAULTS)}), comma-separated",
    )
    p.add_argument("--out", default="chaos-out", help="directory for the report, plot, logs")
    p.add_argument("--seed", type=int, default=1, help="fault order and targets")
    p.add_argument("--hold", type=float, default=3.0, help="seconds each fault lasts")
    p.add_argument("--gap", type=float, default=1.0, help="seconds between faults")
    p.add_argument(
        "--failover-kills",
        type=int,
        default=0,
        help="extra leader SIGKILLs after the schedule (failover p50/p99)",
    )
    p.add_argument("--network", choices=("auto", "netns", "loopback"), default="auto")
    p.add_argument(
        "--target",
        choices=("process", "compose"),
        default="process",
        help="process: three `raftkv serve` processes (namespaces for partitions); "
        "compose: deploy/docker-compose.yml's containers, Docker's faults "
        "(docker kill/start, pause/unpause, network disconnect/connect)",
    )
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `raftkv serve` flag (repeat), e.g. --server-arg=--election-timeout=500",
    )
    p.add_argument(
        "--register-over-grpc",
        action="store_true",
        help="the register workload speaks etcd's gRPC API instead of the JSON gateway",
    )
    p.add_argument("--soak", action="store_true", help="run the soak (tests/chaos/soak.py)")
    p.add_argument("--rounds", type=int, default=100, help="--soak: rounds of every nemesis")
    p.add_argument("--keys", type=int, default=1_000_000, help="--soak: keys loaded first")
    p.add_argument("--members", type=int, default=3, help="--soak: 3, or 5 (two faults at once)")
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="--soak: minutes of rounds (the preload not counted) after which none starts",
    )
    args = p.parse_args(argv)
    if args.soak:
        return _soak(args)
    cfg = ChaosConfig(
        duration_s=args.duration,
        nemesis=args.nemesis,
        out_dir=args.out,
        seed=args.seed,
        hold_s=args.hold,
        gap_s=args.gap,
        failover_kills=args.failover_kills,
        network=args.network,
        extra_args=args.server_arg,
        target=args.target,
        register_over_grpc=args.register_over_grpc,
    )
    try:
        report = run(cfg)
    except ChaosUnavailable as exc:
        print(f"chaos: cannot run here: {exc}", file=sys.stderr)
        return 2
    except BaseException as exc:
        # tests/deploy/compose.py, shared with pytest, skips (or fails under
        # RAFTKV_REQUIRE_EXTERNAL=1) when Docker, Compose or a base image is missing
        if type(exc).__name__ in ("Skipped", "Failed") and args.target == "compose":
            print(f"chaos: cannot run here: {exc}", file=sys.stderr)
            return 2
        raise
    print(json.dumps({k: report.get(k) for k in SUMMARY_KEYS}, indent=2, default=str))
    return 0 if report["ok"] else 1


def _soak(args) -> int:
    from tests.chaos.soak import SOAK_FAULTS, SoakConfig, run_soak, table

    nemesis = args.nemesis if args.nemesis != p_default_nemesis() else ",".join(SOAK_FAULTS)
    cfg = SoakConfig(
        rounds=args.rounds,
        keys=args.keys,
        members=args.members,
        out_dir=args.out,
        seed=args.seed,
        hold_s=args.hold,
        gap_s=args.gap,
        faults=[f.strip() for f in nemesis.split(",") if f.strip()],
        time_limit_s=None if args.time_limit is None else 60 * args.time_limit,
        extra_args=args.server_arg,
    )
    report = run_soak(cfg)
    print(table(report))
    print(
        json.dumps(
            {
                k: report.get(k)
                for k in ("ok", "totals", "stopped_by_time_limit", "problems", "png")
            },
            indent=2,
        )
    )
    return 0 if report["ok"] else 1


def p_default_nemesis() -> str:
    return "kill,pause,restart,partition"


if __name__ == "__main__":
    sys.exit(main())
