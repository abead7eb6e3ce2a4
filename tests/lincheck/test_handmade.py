"""Hand-made histories with a known verdict: the definition of linearizability, case by case.

Linearizability (Herlihy & Wing 1990): there is a total order of the operations that (a) is a
legal sequential execution of the key-value map and (b) puts an operation before every
operation called after it returned. A pending operation (no response) may be placed anywhere
after its call, or left out. Each case is also cross-checked against the brute-force oracle.
"""

from __future__ import annotations

import pytest

from tests.lincheck import INFINITY, KvModel, Operation, Verdict, check, kv
from tests.lincheck.reference import brute_force_linearizable, validate_linearization

P = INFINITY  # return time of a pending operation


def H(*rows: tuple) -> list[Operation]:
    """Rows of (client, call, return, input, output); op ids are the row numbers."""
    return [
        Operation(i, client, call, ret, inp, out)
        for i, (client, call, ret, inp, out) in enumerate(rows)
    ]


CASES: dict[str, tuple[list[Operation], Verdict]] = {
    "empty history": (H(), Verdict.OK),
    "read of an absent key": (H((0, 0, 1, kv.get("x"), kv.get_ok(None))), Verdict.OK),
    "read your completed write": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (0, 2, 3, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.OK,
    ),
    "stale read after a completed write": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (1, 2, 3, kv.put("x", "b"), kv.put_ok()),
            (2, 4, 5, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.ILLEGAL,
    ),
    "read of a value never written": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (1, 0, 9, kv.get("x"), kv.get_ok("zzz")),
        ),
        Verdict.ILLEGAL,
    ),
    "absent read after a completed write": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (1, 2, 3, kv.get("x"), kv.get_ok(None)),
        ),
        Verdict.ILLEGAL,
    ),
    "read concurrent with a write sees the old value": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (1, 2, 10, kv.put("x", "b"), kv.put_ok()),
            (2, 3, 4, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.OK,
    ),
    "read concurrent with a write sees the new value": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (1, 2, 10, kv.put("x", "b"), kv.put_ok()),
            (2, 3, 4, kv.get("x"), kv.get_ok("b")),
        ),
        Verdict.OK,
    ),
    "new value then old value, both inside one write (no going back)": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (1, 2, 10, kv.put("x", "b"), kv.put_ok()),
            (2, 3, 4, kv.get("x"), kv.get_ok("b")),
            (2, 5, 6, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.ILLEGAL,
    ),
    "concurrent writes, reads a then b during them": (
        H(
            (0, 0, 10, kv.put("x", "a"), kv.put_ok()),
            (1, 0, 10, kv.put("x", "b"), kv.put_ok()),
            (2, 1, 2, kv.get("x"), kv.get_ok("a")),
            (2, 3, 4, kv.get("x"), kv.get_ok("b")),
        ),
        Verdict.OK,
    ),
    "concurrent writes, reads b then a during them": (
        H(
            (0, 0, 10, kv.put("x", "a"), kv.put_ok()),
            (1, 0, 10, kv.put("x", "b"), kv.put_ok()),
            (2, 1, 2, kv.get("x"), kv.get_ok("b")),
            (2, 3, 4, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.OK,
    ),
    "concurrent writes, then a final value read consistently": (
        H(
            (0, 0, 10, kv.put("x", "a"), kv.put_ok()),
            (1, 0, 10, kv.put("x", "b"), kv.put_ok()),
            (2, 11, 12, kv.get("x"), kv.get_ok("a")),
            (3, 13, 14, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.OK,
    ),
    "concurrent writes, then both values read after both completed": (
        H(
            (0, 0, 10, kv.put("x", "a"), kv.put_ok()),
            (1, 0, 10, kv.put("x", "b"), kv.put_ok()),
            (2, 11, 12, kv.get("x"), kv.get_ok("a")),
            (3, 13, 14, kv.get("x"), kv.get_ok("b")),
        ),
        Verdict.ILLEGAL,
    ),
    "touching intervals count as overlapping": (
        H(
            (0, 0, 5, kv.put("x", "a"), kv.put_ok()),
            (1, 5, 6, kv.get("x"), kv.get_ok(None)),
        ),
        Verdict.OK,
    ),
    "pending write observed": (
        H(
            (0, 0, P, kv.put("x", "a"), None),
            (1, 5, 6, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.OK,
    ),
    "pending write never applied": (
        H(
            (0, 0, P, kv.put("x", "a"), None),
            (1, 5, 6, kv.get("x"), kv.get_ok(None)),
        ),
        Verdict.OK,
    ),
    "pending write applied late, long after its client gave up": (
        H(
            (0, 0, P, kv.put("x", "a"), None),
            (1, 5, 6, kv.get("x"), kv.get_ok(None)),
            (1, 100, 101, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.OK,
    ),
    "pending write cannot be un-applied": (
        H(
            (0, 0, P, kv.put("x", "a"), None),
            (1, 5, 6, kv.get("x"), kv.get_ok("a")),
            (1, 7, 8, kv.get("x"), kv.get_ok(None)),
        ),
        Verdict.ILLEGAL,
    ),
    "pending write cannot apply before its call": (
        H(
            (1, 0, 1, kv.get("x"), kv.get_ok("a")),
            (0, 2, P, kv.put("x", "a"), None),
        ),
        Verdict.ILLEGAL,
    ),
    "pending write read, then overwritten by a completed write": (
        H(
            (0, 0, P, kv.put("x", "a"), None),
            (1, 1, 2, kv.get("x"), kv.get_ok("a")),
            (1, 3, 4, kv.put("x", "b"), kv.put_ok()),
            (1, 5, 6, kv.get("x"), kv.get_ok("b")),
        ),
        Verdict.OK,
    ),
    "pending read is ignored": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (1, 2, P, kv.get("x"), None),
        ),
        Verdict.OK,
    ),
    "delete then absent": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (0, 2, 3, kv.delete("x"), kv.delete_ok(1)),
            (1, 4, 5, kv.get("x"), kv.get_ok(None)),
        ),
        Verdict.OK,
    ),
    "read of the old value after a completed delete": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (0, 2, 3, kv.delete("x"), kv.delete_ok(1)),
            (1, 4, 5, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.ILLEGAL,
    ),
    "delete reports nothing deleted although the key exists": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (0, 2, 3, kv.delete("x"), kv.delete_ok(0)),
        ),
        Verdict.ILLEGAL,
    ),
    "two deletes cannot both delete": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (0, 2, 5, kv.delete("x"), kv.delete_ok(1)),
            (1, 2, 5, kv.delete("x"), kv.delete_ok(1)),
        ),
        Verdict.ILLEGAL,
    ),
    "pending delete may apply": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (0, 2, P, kv.delete("x"), None),
            (1, 4, 5, kv.get("x"), kv.get_ok("a")),
            (1, 6, 7, kv.get("x"), kv.get_ok(None)),
        ),
        Verdict.OK,
    ),
    "cas on the current value succeeds": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (0, 2, 3, kv.cas("x", "a", "b"), kv.cas_ok(True)),
            (1, 4, 5, kv.get("x"), kv.get_ok("b")),
        ),
        Verdict.OK,
    ),
    "two concurrent cas from the same value cannot both succeed": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (0, 2, 5, kv.cas("x", "a", "b"), kv.cas_ok(True)),
            (1, 2, 5, kv.cas("x", "a", "c"), kv.cas_ok(True)),
        ),
        Verdict.ILLEGAL,
    ),
    "cas failing although the value matched": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (0, 2, 3, kv.cas("x", "a", "b"), kv.cas_ok(False)),
        ),
        Verdict.ILLEGAL,
    ),
    "create-if-absent cas": (
        H(
            (0, 0, 3, kv.cas("x", None, "a"), kv.cas_ok(True)),
            (1, 0, 3, kv.cas("x", None, "b"), kv.cas_ok(False)),
            (2, 4, 5, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.OK,
    ),
    "revisions of successive writes must increase": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok(5)),
            (0, 2, 3, kv.put("x", "b"), kv.put_ok(3)),
        ),
        Verdict.ILLEGAL,
    ),
    "concurrent writes order themselves by revision": (
        H(
            (0, 0, 10, kv.put("x", "a"), kv.put_ok(7)),
            (1, 0, 10, kv.put("x", "b"), kv.put_ok(4)),
            (2, 11, 12, kv.get("x"), kv.get_ok("a", 7)),
        ),
        Verdict.OK,
    ),
    "final read contradicts the revision order": (
        H(
            (0, 0, 10, kv.put("x", "a"), kv.put_ok(7)),
            (1, 0, 10, kv.put("x", "b"), kv.put_ok(4)),
            (2, 11, 12, kv.get("x"), kv.get_ok("b", 4)),
        ),
        Verdict.ILLEGAL,
    ),
    "read reports a revision no write of that value had": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok(5)),
            (1, 2, 3, kv.get("x"), kv.get_ok("a", 6)),
        ),
        Verdict.ILLEGAL,
    ),
    "read teaches the revision of a pending write": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok(5)),
            (0, 2, P, kv.put("x", "b"), None),
            (1, 3, 4, kv.get("x"), kv.get_ok("b", 9)),
            (1, 5, 6, kv.get("x"), kv.get_ok("b", 9)),
        ),
        Verdict.OK,
    ),
    "pending write's revision must exceed the one it overwrote": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok(5)),
            (0, 2, P, kv.put("x", "b"), None),
            (1, 3, 4, kv.get("x"), kv.get_ok("b", 5)),
        ),
        Verdict.ILLEGAL,
    ),
    "keys are independent": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (1, 0, 1, kv.put("y", "b"), kv.put_ok()),
            (2, 2, 3, kv.get("y"), kv.get_ok("b")),
            (2, 4, 5, kv.get("x"), kv.get_ok("a")),
        ),
        Verdict.OK,
    ),
    "a value of another key is not visible": (
        H(
            (0, 0, 1, kv.put("x", "a"), kv.put_ok()),
            (1, 2, 3, kv.get("y"), kv.get_ok("a")),
        ),
        Verdict.ILLEGAL,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_handmade_verdict(name: str) -> None:
    history, expected = CASES[name]
    result = check(KvModel(), history)
    assert result.verdict is expected, result.explanation
    assert brute_force_linearizable(history) == (expected is Verdict.OK), "oracle disagrees"
    if result.ok:
        for p in result.partitions:
            assert p.linearization is not None
            validate_linearization(KvModel(), p.operations, p.linearization)


def test_stale_read_explanation_names_prefix_blocked_operation_and_times() -> None:
    history, _ = CASES["stale read after a completed write"]
    result = check(KvModel(), history)
    text = result.explanation
    assert result.verdict is Verdict.ILLEGAL
    assert "key 'x': NOT LINEARIZABLE" in text
    assert "longest linearizable prefix found: 2 of 3 operations" in text
    assert "1. #0 client 0: put('x', 'a') -> ok  [call 0, return 1]" in text
    assert "2. #1 client 1: put('x', 'b') -> ok  [call 2, return 3]" in text
    assert "state after the prefix: 'b'" in text
    assert "cannot place: #2 client 2: get('x') -> 'a'  [call 4, return 5]" in text
    assert "the model rejects it in this state" in text
    cx = result.partitions[0].counterexample
    assert cx is not None
    assert [op.op_id for op in cx.prefix] == [0, 1]
    assert cx.blocked.op_id == 2
    assert [(c.operation.op_id, c.accepted) for c in cx.candidates] == [(2, False)]


def test_explanation_lists_candidates_accepted_but_dead_ends() -> None:
    history, _ = CASES["concurrent writes, then both values read after both completed"]
    result = check(KvModel(), history)
    assert result.verdict is Verdict.ILLEGAL
    cx = result.partitions[0].counterexample
    assert cx is not None
    # both orders of the two writes place three operations; the last read cannot follow
    assert len(cx.prefix) == 3
    assert cx.blocked.op_id == 3
    assert "pending" not in result.explanation
    assert "never" not in result.explanation


def test_pending_operation_shows_unknown_outcome_and_never_returning() -> None:
    history, _ = CASES["pending write cannot be un-applied"]
    result = check(KvModel(), history)
    assert result.verdict is Verdict.ILLEGAL
    assert "put('x', 'a') -> ? (unknown outcome)  [call 0, return never]" in result.explanation


def test_only_the_violating_key_is_reported() -> None:
    history = H(
        (0, 0, 1, kv.put("good", "a"), kv.put_ok()),
        (1, 2, 3, kv.get("good"), kv.get_ok("a")),
        (0, 0, 1, kv.put("bad", "a"), kv.put_ok()),
        (1, 2, 3, kv.get("bad"), kv.get_ok("b")),
    )
    result = check(KvModel(), history)
    verdicts = {p.title: p.verdict for p in result.partitions}
    assert verdicts == {"key 'good'": Verdict.OK, "key 'bad'": Verdict.ILLEGAL}
    assert "key 'bad': NOT LINEARIZABLE" in result.explanation
    assert "key 'good'" not in result.explanation
