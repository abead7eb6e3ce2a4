"""Throughput of the checker on the benchmark history (not a test; prints numbers).

    .venv/bin/python -m tests.lincheck.bench [--operations 2000 --keys 10 --clients 8]

The benchmark history: 2,000 operations over 10 keys by 8 concurrent clients, generated from
a sequential execution (see ``generate``), with 3 leader crashes (every in-flight operation
loses its response). Reports steps and operations checked per second for the linearizable
history and for the same history with one impossible read (exhaustive up to the violation).
"""

from __future__ import annotations

import argparse
import random
import time

from tests.lincheck import KvModel, check
from tests.lincheck.generate import generate_kv_history, impossible_read

BENCH_SEED = 1


def benchmark_history(
    operations: int = 2000, keys: int = 10, clients: int = 8, crashes: int = 3, seed: int = 1
):
    rng = random.Random(seed)
    ops = generate_kv_history(
        rng, operations=operations, keys=keys, clients=clients, crashes=crashes
    )
    mutated, _ = impossible_read(ops, rng)
    return ops, mutated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=2000)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--crashes", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ops, mutated = benchmark_history(args.operations, args.keys, args.clients, args.crashes)
    pending = sum(op.pending for op in ops)
    print(
        f"history: {len(ops)} operations, {args.keys} keys, {args.clients} clients, {pending} pending"
    )
    for name, history in (("linearizable", ops), ("one impossible read", mutated)):
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = check(KvModel(), history)
            best = min(best, time.perf_counter() - start)
        print(
            f"{name:>20}: {result.verdict.name:<8} {result.steps:>8} steps  "
            f"{best * 1000:8.1f} ms  {len(history) / best:>10,.0f} ops/s  "
            f"{result.steps / best:>10,.0f} steps/s"
        )


if __name__ == "__main__":
    main()
