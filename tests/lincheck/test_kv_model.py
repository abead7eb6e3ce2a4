"""The key-value model's sequential specification, its partitioning and its pruning rule."""

from __future__ import annotations

import pytest

from tests.lincheck import INFINITY, KvModel, Operation, Verdict, check, kv
from tests.lincheck.reference import brute_force_linearizable

M = KvModel()
ABSENT = M.init()


def test_initial_state_is_absent_with_no_revision() -> None:
    assert ABSENT == (None, None, 0)
    assert M.describe_state(ABSENT) == "absent"


def test_put_then_get_with_revisions() -> None:
    ok, s = M.step(ABSENT, kv.put("x", "a"), kv.put_ok(3))
    assert ok and s == ("a", 3, 3)
    assert M.step(s, kv.get("x"), kv.get_ok("a", 3)) == (True, s)
    assert M.step(s, kv.get("x"), kv.get_ok("a")) == (True, s)  # revision not reported
    assert M.step(s, kv.get("x"), kv.get_ok("a", 4))[0] is False
    assert M.step(s, kv.get("x"), kv.get_ok("b", 3))[0] is False
    assert M.step(s, kv.put("x", "b"), kv.put_ok(3))[0] is False  # revisions strictly increase
    assert M.step(s, kv.put("x", "b"), kv.put_ok(9)) == (True, ("b", 9, 9))


def test_unknown_put_keeps_the_floor_and_a_read_learns_the_revision() -> None:
    _, s = M.step(ABSENT, kv.put("x", "a"), kv.put_ok(3))
    ok, s = M.step(s, kv.put("x", "b"), None)
    assert ok and s == ("b", None, 3)
    assert M.step(s, kv.get("x"), kv.get_ok("b", 3))[0] is False
    assert M.step(s, kv.get("x"), kv.get_ok("b", 4)) == (True, ("b", 4, 4))


def test_delete_reports_and_clears() -> None:
    _, s = M.step(ABSENT, kv.put("x", "a"), kv.put_ok(3))
    assert M.step(s, kv.delete("x"), kv.delete_ok(1)) == (True, (None, None, 3))
    assert M.step(s, kv.delete("x"), kv.delete_ok(0))[0] is False
    assert M.step(s, kv.delete("x"), kv.delete_ok()) == (True, (None, None, 3))
    assert M.step(ABSENT, kv.delete("x"), kv.delete_ok(0)) == (True, ABSENT)
    assert M.step(ABSENT, kv.delete("x"), kv.delete_ok(1))[0] is False


def test_cas_outcome_must_match_the_comparison() -> None:
    _, s = M.step(ABSENT, kv.put("x", "a"), kv.put_ok())
    assert M.step(s, kv.cas("x", "a", "b"), kv.cas_ok(True)) == (True, ("b", None, 0))
    assert M.step(s, kv.cas("x", "a", "b"), kv.cas_ok(False))[0] is False
    assert M.step(s, kv.cas("x", "z", "b"), kv.cas_ok(False)) == (True, s)
    assert M.step(s, kv.cas("x", "z", "b"), kv.cas_ok(True))[0] is False
    assert M.step(s, kv.cas("x", "a", "b"), None) == (True, ("b", None, 0))  # pending: applies
    assert M.step(s, kv.cas("x", "z", "b"), None) == (True, s)
    assert M.step(ABSENT, kv.cas("x", None, "b"), kv.cas_ok(True, 2)) == (True, ("b", 2, 2))


def test_none_is_not_a_value() -> None:
    with pytest.raises(ValueError):
        kv.put("x", None)
    with pytest.raises(ValueError):
        kv.cas("x", "a", None)


def test_describe_operation() -> None:
    assert M.describe_operation(kv.put("x", "a"), kv.put_ok(4)) == "put('x', 'a') -> ok rev=4"
    assert M.describe_operation(kv.get("x"), kv.get_ok(None)) == "get('x') -> absent"
    assert M.describe_operation(kv.delete("x"), kv.delete_ok(1)) == "delete('x') -> deleted=1"
    assert (
        M.describe_operation(kv.cas("x", None, "b"), kv.cas_ok(False))
        == "cas('x', None -> 'b') -> failed"
    )
    assert M.describe_operation(kv.put("x", "a"), None) == "put('x', 'a') -> ? (unknown outcome)"


def _op(i: int, call: int, ret: float, inp: kv.KvInput, out: kv.KvOutput | None) -> Operation:
    return Operation(i, i, call, ret, inp, out)


def test_partition_by_key_drops_pending_reads() -> None:
    ops = [
        _op(0, 0, 1, kv.put("x", "a"), kv.put_ok()),
        _op(1, 0, 1, kv.put("y", "a"), kv.put_ok()),
        _op(2, 0, INFINITY, kv.get("x"), None),
        _op(3, 2, 3, kv.get("x"), kv.get_ok("a")),
    ]
    parts = M.partition(ops)
    assert [[op.op_id for op in p] for p in parts] == [[0, 3], [1]]


def test_unobserved_pending_write_is_pruned() -> None:
    ops = [
        _op(0, 0, INFINITY, kv.put("x", "never-read"), None),
        _op(1, 0, INFINITY, kv.put("x", "read"), None),
        _op(2, 5, 6, kv.get("x"), kv.get_ok("read")),
    ]
    (part,) = M.partition(ops)
    assert [op.op_id for op in part] == [1, 2]
    (unpruned,) = KvModel(prune_unobserved_pending_writes=False).partition(ops)
    assert len(unpruned) == 3


def test_pending_write_value_expected_by_a_cas_is_kept() -> None:
    ops = [
        _op(0, 0, INFINITY, kv.put("x", "a"), None),
        _op(1, 5, 6, kv.cas("x", "a", "b"), kv.cas_ok(True)),
    ]
    (part,) = M.partition(ops)
    assert len(part) == 2
    assert check(M, ops).ok


@pytest.mark.parametrize(
    "observer",
    [
        pytest.param((kv.delete("x"), kv.delete_ok(1)), id="delete-reporting-1"),
        pytest.param((kv.cas("x", None, "b"), kv.cas_ok(False)), id="failed-create-cas"),
    ],
)
def test_pending_write_kept_when_presence_is_observed_later(observer: tuple) -> None:
    # the observer needs the key present; only the pending write can make it so
    inp, out = observer
    ops = [
        _op(0, 0, INFINITY, kv.put("x", "unread"), None),
        _op(1, 5, 6, inp, out),
    ]
    (part,) = M.partition(ops)
    assert len(part) == 2
    assert check(M, ops).ok
    assert brute_force_linearizable(ops)


def test_pending_write_pruned_when_presence_observer_returned_before_its_call() -> None:
    ops = [
        _op(0, 0, 1, kv.put("x", "a"), kv.put_ok()),
        _op(1, 2, 3, kv.delete("x"), kv.delete_ok(1)),
        _op(2, 4, INFINITY, kv.put("x", "unread"), None),
        _op(3, 5, 6, kv.get("x"), kv.get_ok(None)),
    ]
    (part,) = M.partition(ops)
    assert [op.op_id for op in part] == [0, 1, 3]
    assert check(M, ops).verdict is Verdict.OK


def test_pruning_does_not_change_the_verdict_of_a_violation() -> None:
    ops = [
        _op(0, 0, 1, kv.put("x", "a"), kv.put_ok()),
        _op(1, 0, INFINITY, kv.put("x", "unread"), None),
        _op(2, 2, 3, kv.get("x"), kv.get_ok(None)),
    ]
    assert check(M, ops).verdict is Verdict.ILLEGAL
    assert check(KvModel(prune_unobserved_pending_writes=False), ops).verdict is Verdict.ILLEGAL
    assert not brute_force_linearizable(ops)
