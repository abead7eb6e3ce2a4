"""CLI: ``python -m tests.sim --seeds N [--start S] [--nodes 3|5]`` (soak) or
``python -m tests.sim --seed S [--nodes 3|5] [--verbose]`` (replay one seed).

Exit status 0 when every seed passed, 1 otherwise; each failing seed prints its replay
command. Without ``--nodes`` even seeds run 3 nodes and odd seeds 5.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.sim.runner import failure_report, replay_command, run_seed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    p.add_argument("--seeds", type=int, help="run this many seeds")
    p.add_argument("--start", type=int, default=0, help="first seed of --seeds (default 0)")
    p.add_argument("--seed", type=int, help="run one seed")
    p.add_argument("--nodes", type=int, choices=(3, 5), help="cluster size (default: by seed)")
    p.add_argument("--verbose", action="store_true", help="print every event of --seed")
    args = p.parse_args(argv)
    if (args.seed is None) == (args.seeds is None):
        p.error("give exactly one of --seed and --seeds")

    if args.seed is not None:
        log = print if args.verbose else None
        r = run_seed(args.seed, args.nodes, log=log)
        if r.ok:
            print(f"seed {r.seed} nodes {r.nodes}: ok digest={r.digest:08x} {r.stats}")
            return 0
        print(f"seed {r.seed} nodes {r.nodes}: FAILED digest={r.digest:08x}\n{r.error}")
        print(f"replay: {replay_command(r.seed, r.nodes)}")
        return 1

    started = time.perf_counter()
    failures = []
    totals: dict[str, int] = {}
    for seed in range(args.start, args.start + args.seeds):
        r = run_seed(seed, args.nodes)
        if not r.ok:
            failures.append(r)
            print(f"FAIL seed {seed} nodes {r.nodes}: {r.error.splitlines()[0]}", flush=True)
            print(f"  replay: {replay_command(seed, r.nodes)}", flush=True)
        for k, v in r.stats.items():
            totals[k] = totals.get(k, 0) + v
    elapsed = time.perf_counter() - started
    print(
        f"{args.seeds} seeds ({args.start}..{args.start + args.seeds - 1}) in {elapsed:.1f} s "
        f"({args.seeds / elapsed:.1f} seeds/s), {len(failures)} failed"
    )
    print("totals: " + " ".join(f"{k}={v}" for k, v in sorted(totals.items())))
    if failures:
        print(failure_report(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
