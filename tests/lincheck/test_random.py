"""Randomized tests: generated linearizable histories, mutations, and a brute-force oracle.

- Histories produced by a real sequential execution with overlapping intervals must be OK,
  with a valid witness order.
- The same histories with one completed read changed to a value nobody wrote must be ILLEGAL,
  and the explanation must point at that read's key.
- Tiny random histories (arbitrary outputs, repeated values, touching intervals, pending
  operations, revisions) must get the same verdict from the checker as from exhaustive
  enumeration -- with and without the pending-write pruning.
"""

from __future__ import annotations

import random

import pytest

from tests.lincheck import INFINITY, KvModel, Operation, Verdict, assert_linearizable, check, kv
from tests.lincheck.generate import NEVER_WRITTEN, generate_kv_history, impossible_read
from tests.lincheck.reference import brute_force_linearizable, validate_linearization

CONFIGS = {
    "3 keys, 4 clients": dict(operations=200, keys=3, clients=4),
    "1 key, 6 clients": dict(operations=150, keys=1, clients=6),
    "5 keys, 8 clients, timeouts": dict(operations=300, keys=5, clients=8, pending_fraction=0.03),
    "4 keys, 8 clients, leader crashes": dict(operations=300, keys=4, clients=8, crashes=3),
    "2 keys, no revisions": dict(operations=200, keys=2, clients=5, revisions=False),
}
SEEDS = range(6)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_histories_from_a_sequential_execution_are_linearizable(config: str) -> None:
    for seed in SEEDS:
        ops = generate_kv_history(random.Random(seed), **CONFIGS[config])
        result = check(KvModel(), ops)
        assert result.verdict is Verdict.OK, f"seed {seed}\n{result.explanation}"
        for p in result.partitions:
            assert p.linearization is not None
            validate_linearization(KvModel(), p.operations, p.linearization)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_read_of_a_value_never_written_is_illegal(config: str) -> None:
    for seed in SEEDS:
        rng = random.Random(seed)
        ops = generate_kv_history(rng, **CONFIGS[config])
        mutated, victim_id = impossible_read(ops, rng)
        victim = mutated[victim_id]
        result = check(KvModel(), mutated)
        assert result.verdict is Verdict.ILLEGAL, f"seed {seed}\n{result.explanation}"
        (bad,) = [p for p in result.partitions if p.verdict is Verdict.ILLEGAL]
        assert bad.title == f"key {victim.input.key!r}"
        cx = bad.counterexample
        assert cx is not None
        assert victim_id in {cx.blocked.op_id, *(c.operation.op_id for c in cx.candidates)}
        assert repr(NEVER_WRITTEN) in result.explanation


def _tiny_history(rng: random.Random, keys: str = "xy", max_ops: int = 6) -> list[Operation]:
    """A few operations with arbitrary (often wrong) outputs over few keys and two values."""
    ops = []
    for i in range(rng.randint(1, max_ops)):
        key = rng.choice(keys)
        call = rng.randint(0, 8)
        ret = INFINITY if rng.random() < 0.2 else call + rng.randint(0, 4)
        value = rng.choice("ab")
        revision = rng.choice([None, None, 1, 2, 3])
        kind = rng.randrange(4)
        if kind == 0:
            inp, out = kv.put(key, value), kv.put_ok(revision)
        elif kind == 1:
            inp, out = kv.get(key), kv.get_ok(rng.choice([None, "a", "b"]), revision)
        elif kind == 2:
            inp, out = kv.delete(key), kv.delete_ok(rng.choice([None, 0, 1]))
        else:
            expected = rng.choice([None, "a", "b"])
            inp, out = kv.cas(key, expected, value), kv.cas_ok(rng.choice([None, True, False]))
        ops.append(Operation(i, i, call, ret, inp, None if ret == INFINITY else out))
    return ops


@pytest.mark.parametrize("prune", [True, False], ids=["pruned", "unpruned"])
@pytest.mark.parametrize(
    "shape", [("xy", 6, 1500), ("x", 8, 800)], ids=["two-keys", "one-key-dense"]
)
def test_checker_agrees_with_brute_force_on_tiny_histories(
    prune: bool, shape: tuple[str, int, int]
) -> None:
    keys, max_ops, cases = shape
    rng = random.Random(2024)
    model = KvModel(prune_unobserved_pending_writes=prune)
    verdicts = {True: 0, False: 0}
    for case in range(cases):
        ops = _tiny_history(rng, keys, max_ops)
        expected = brute_force_linearizable(ops)
        result = check(model, ops)
        assert result.verdict is not Verdict.UNKNOWN
        assert result.ok == expected, f"case {case}: {ops}\n{result.explanation}"
        verdicts[expected] += 1
        if result.ok:
            for p in result.partitions:
                assert p.linearization is not None
                validate_linearization(model, p.operations, p.linearization)
    # the generator must exercise both outcomes substantially, or this test proves little
    assert min(verdicts.values()) > cases // 10, verdicts


def test_step_budget_gives_unknown_not_a_guess() -> None:
    rng = random.Random(3)
    ops = generate_kv_history(rng, operations=300, keys=1, clients=8)
    mutated, _ = impossible_read(ops, rng)
    full = check(KvModel(), mutated)
    assert full.verdict is Verdict.ILLEGAL
    assert full.steps > 100
    capped = check(KvModel(), mutated, max_steps_per_partition=100)
    assert capped.verdict is Verdict.UNKNOWN
    assert capped.steps == 100
    assert "UNKNOWN -- search stopped after 100 steps" in capped.explanation
    # an OK history under the same cap is UNKNOWN too: no partial answer passes as OK
    assert check(KvModel(), ops, max_steps_per_partition=100).verdict is Verdict.UNKNOWN
    with pytest.raises(AssertionError, match="UNKNOWN"):
        assert_linearizable(KvModel(), ops, max_steps_per_partition=100)


def test_expired_timeout_gives_unknown() -> None:
    ops = generate_kv_history(random.Random(4), operations=50, keys=2, clients=3)
    result = check(KvModel(), ops, timeout_s=0.0)
    assert result.verdict is Verdict.UNKNOWN
    assert result.steps == 0


def test_timeout_is_checked_during_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.lincheck import checker

    rng = random.Random(1)
    ops = generate_kv_history(rng, operations=2000, keys=1, clients=8)
    mutated, _ = impossible_read(ops, rng)
    full = check(KvModel(), mutated)
    assert full.verdict is Verdict.ILLEGAL and full.steps > 10_000
    ticks = iter(range(1_000_000))  # a fake clock: one unit per look
    monkeypatch.setattr(checker.time, "monotonic", lambda: next(ticks))
    # deadline at 5: set at tick 0, partition start at tick 1, then one look per ~1024
    # steps; the fifth look (tick 6) is past the deadline
    result = check(KvModel(), mutated, timeout_s=5)
    assert result.verdict is Verdict.UNKNOWN
    assert 4 * 1024 < result.steps <= 5 * 1025 < full.steps
