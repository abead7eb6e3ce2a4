"""The checker's cost, measured in search steps (``model.step`` calls), never in seconds.

The benchmark history is the one ``python -m tests.lincheck.bench`` times: 2,000 operations
over 10 keys by 8 concurrent clients with 3 leader crashes. The bounds below have about 50%
headroom over the measured counts; a regression in the search (lost memoization, lost greedy
reads, lost partitioning) multiplies the counts and fails these tests.
"""

from __future__ import annotations

import random

from tests.lincheck import KvModel, Operation, Verdict, check, kv
from tests.lincheck.bench import benchmark_history
from tests.lincheck.generate import generate_kv_history, impossible_read


def test_benchmark_history_checks_in_about_one_step_per_operation() -> None:
    ops, mutated = benchmark_history()
    assert len(ops) == 2000 and sum(op.pending for op in ops) > 0
    ok = check(KvModel(), ops)
    assert ok.verdict is Verdict.OK
    assert len(ok.partitions) == 10
    assert ok.steps <= 4_000  # measured 2,511
    bad = check(KvModel(), mutated)
    assert bad.verdict is Verdict.ILLEGAL
    assert bad.steps <= 4_000  # measured 2,312


def test_one_hot_key_with_eight_clients_stays_within_budget() -> None:
    rng = random.Random(1)
    ops = generate_kv_history(rng, operations=2000, keys=1, clients=8)
    mutated, _ = impossible_read(ops, rng)
    ok = check(KvModel(), ops)
    assert ok.verdict is Verdict.OK
    assert ok.steps <= 30_000  # measured 17,851
    bad = check(KvModel(), mutated)
    assert bad.verdict is Verdict.ILLEGAL
    assert bad.steps <= 100_000  # measured 59,642


class _NoObserverKvModel(KvModel):
    """The same specification without the observer hint (ablation for the test below)."""

    is_observer = None  # type: ignore[assignment]


def _read_storms(rounds: int, readers: int) -> list[Operation]:
    """Each round: a write, then ``readers`` fully overlapping reads of it; at the very end
    a read of the first value, which is stale -- so the search must be exhaustive."""
    ops: list[Operation] = []
    t = 0
    for r in range(rounds):
        ops.append(Operation(len(ops), "w", t, t + 1, kv.put("x", f"v{r}"), kv.put_ok()))
        for c in range(readers):
            ops.append(Operation(len(ops), c, t + 2, t + 3, kv.get("x"), kv.get_ok(f"v{r}")))
        t += 4
    ops.append(Operation(len(ops), "late", t, t + 1, kv.get("x"), kv.get_ok("v0")))
    return ops


def test_concurrent_reads_are_not_permuted() -> None:
    history = _read_storms(rounds=5, readers=10)
    greedy = check(KvModel(), history)
    exhaustive = check(_NoObserverKvModel(), history)
    assert greedy.verdict is exhaustive.verdict is Verdict.ILLEGAL
    # with the hint each read is placed once; without it every subset of each round's
    # ten reads is a distinct configuration (2**10 per round)
    assert greedy.steps <= 2 * len(history)
    assert exhaustive.steps >= 100 * greedy.steps


def test_hot_key_with_crashes_stays_within_budget() -> None:
    # every crash leaves up to eight operations pending forever: the hard case
    ops, mutated = benchmark_history(keys=1)
    ok = check(KvModel(), ops)
    assert ok.verdict is Verdict.OK
    assert ok.steps <= 30_000  # measured 18,021
    bad = check(KvModel(), mutated)
    assert bad.verdict is Verdict.ILLEGAL
    assert bad.steps <= 1_300_000  # measured 834,649
