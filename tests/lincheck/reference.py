"""Independent oracles for testing the checker: brute force and witness validation.

``brute_force_linearizable`` decides linearizability of a small history by trying every
subset of the pending operations and every order of the chosen operations that respects real
time (an operation that returned strictly before another was called comes first). It uses the
model's ``step`` per key but neither the model's partitioning (and its pruning) nor the
checker's search, so agreement with ``check`` tests both. Exponential: keep histories tiny.

``validate_linearization`` re-checks a witness order returned for an OK partition.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import combinations

from tests.lincheck.history import Operation
from tests.lincheck.kv import KvModel


def brute_force_linearizable(ops: Sequence[Operation], model: KvModel | None = None) -> bool:
    model = model or KvModel()
    completed = [op for op in ops if not op.pending]
    pending = [op for op in ops if op.pending]
    for k in range(len(pending) + 1):
        for chosen in combinations(pending, k):
            if _some_order(model, completed + list(chosen), {}):
                return True
    return False


def _some_order(
    model: KvModel, remaining: list[Operation], states: dict[Hashable, Hashable]
) -> bool:
    if not remaining:
        return True
    for i, op in enumerate(remaining):
        # op can go next only if no other remaining operation returned before op was called
        if any(other.ret < op.call for other in remaining if other is not op):
            continue
        key = op.input.key
        ok, new_state = model.step(states.get(key, model.init()), op.input, op.output)
        if ok and _some_order(
            model, remaining[:i] + remaining[i + 1 :], {**states, key: new_state}
        ):
            return True
    return False


def validate_linearization(
    model: KvModel, operations: Sequence[Operation], order: Sequence[Operation]
) -> None:
    """Raise AssertionError unless ``order`` is a legal linearization of ``operations``."""
    assert sorted(op.op_id for op in order) == sorted(op.op_id for op in operations), (
        "a witness must order every operation of its partition exactly once"
    )
    for i, earlier in enumerate(order):
        for later in order[i + 1 :]:
            assert not later.ret < earlier.call, (
                f"#{later.op_id} returned before #{earlier.op_id} was called "
                "but is ordered after it"
            )
    state = model.init()
    for op in order:
        ok, state = model.step(state, op.input, op.output)
        assert ok, f"the model rejects #{op.op_id} at its place in the witness"
