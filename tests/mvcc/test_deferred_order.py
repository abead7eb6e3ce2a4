"""A store whose key order is deferred (``MVCCStore.defer_key_order``, a restart's replay)
answers exactly as one that keeps its keys in order all along.

Two stores get the same random operations: one inserts every new key in order at once, the
other has key order deferred from the start (and again after each ``settle_key_order`` the
sequence asks for). Every answer, event and error must be the same, and so must the
snapshot bytes at the end. The key space is large enough for both ways of merging the
deferred keys: one ordered insert each when they are few against the live keys, one sort
when they are many.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserver.mvcc import (
    CompactionRequest,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    MVCCStore,
    PutRequest,
    RangeRequest,
    RequestOp,
    TxnRequest,
)

KEY_SPACE = 400


def key(i: int) -> bytes:
    return b"k/%04d" % i


keys = st.integers(0, KEY_SPACE - 1).map(key)
puts = st.builds(
    PutRequest,
    key=keys,
    value=st.sampled_from([b"", b"v", b"w" * 20]),
    lease=st.sampled_from([0, 0, 0, 5, 6]),
    prev_kv=st.booleans(),
)
# a put of a run of fresh keys: many new keys at once, so a merge by sort happens too
bulk_puts = st.tuples(st.just("bulk"), st.integers(0, KEY_SPACE - 1), st.integers(1, 300))


@st.composite
def ranges(draw):
    lo = draw(st.integers(0, KEY_SPACE - 1))
    hi = draw(st.integers(lo, KEY_SPACE))
    return RangeRequest(
        key=key(lo),
        range_end=draw(st.sampled_from([b"", key(hi), b"\0"])),
        limit=draw(st.sampled_from([0, 1, 3, 50])),
        count_only=draw(st.booleans()),
        revision=draw(st.sampled_from([0, 0, -1, -5])),  # < 0: that far behind the head
    )


@st.composite
def deletes(draw):
    lo = draw(st.integers(0, KEY_SPACE - 1))
    span = draw(st.sampled_from([0, 1, 10, 100]))
    end = b"" if span == 0 else key(min(lo + span, KEY_SPACE))
    return DeleteRangeRequest(key=key(lo), range_end=end, prev_kv=draw(st.booleans()))


@st.composite
def txns(draw):
    cmp = Compare(
        key=draw(keys),
        target=CompareTarget.VERSION,
        result=draw(st.sampled_from([CompareResult.EQUAL, CompareResult.GREATER])),
        version=0,
    )
    then = draw(st.lists(st.one_of(puts, ranges()), min_size=1, max_size=4))
    # a txn writes a key at most once
    seen: set[bytes] = set()
    ops = []
    for r in then:
        if isinstance(r, PutRequest):
            if r.key in seen:
                continue
            seen.add(r.key)
        ops.append(RequestOp.of(r))
    return TxnRequest((cmp,), tuple(ops), ())


operations = st.one_of(
    puts.map(lambda r: ("apply", r)),
    puts.map(lambda r: ("apply", r)),
    bulk_puts,
    ranges().map(lambda r: ("apply", r)),
    deletes().map(lambda r: ("apply", r)),
    txns().map(lambda r: ("apply", r)),
    st.tuples(st.just("compact"), st.integers(-8, 0)),
    st.tuples(st.just("revoke"), st.sampled_from([5, 6])),
    st.tuples(st.just("events"), st.integers(-6, 0)),
    st.tuples(st.just("count"), st.just(0)),
    st.tuples(st.just("settle"), st.just(0)),
)


def _resolve(req, rev: int):
    if isinstance(req, RangeRequest) and req.revision < 0:
        return RangeRequest(
            req.key,
            req.range_end,
            limit=req.limit,
            count_only=req.count_only,
            revision=max(1, rev + req.revision),
        )
    return req


def _answer(store: MVCCStore, op):
    kind = op[0]
    if kind == "apply":
        res = store.apply(_resolve(op[1], store.revision))
        return res.response, res.error and (type(res.error), str(res.error)), res.events
    if kind == "bulk":
        first, n = op[1], op[2]
        return [
            store.apply(PutRequest(b"fresh/%04d/%04d" % (first, i), b"x")).events for i in range(n)
        ]
    if kind == "compact":
        res = store.apply(CompactionRequest(max(1, store.revision + op[1])))
        return res.response, res.error and str(res.error)
    if kind == "revoke":
        res = store.delete_keys_of_lease(op[1])
        return res.response, res.events
    if kind == "events":
        rev = max(store.compact_revision + 1, store.revision + op[1], 1)
        return store.events_since(rev, b"\0", b"\0", prev_kv=True)
    if kind == "count":
        return store.key_count, store.history_size, store.db_size_bytes
    if kind == "settle":
        store.settle_key_order()
        store.defer_key_order()
        return None
    raise AssertionError(kind)


_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


@settings(max_examples=60, **_SETTINGS)
@given(
    base=st.integers(0, KEY_SPACE),
    ops=st.lists(operations, min_size=10, max_size=60),
)
def test_deferred_key_order_answers_as_ordered_inserts(base, ops):
    ordered = MVCCStore()
    deferred = MVCCStore()
    for store in (ordered, deferred):
        for i in range(0, base, 2):  # every other key exists at the start
            store.apply(PutRequest(key(i), b"base"))
    deferred.defer_key_order()
    for op in ops:
        assert _answer(deferred, op) == _answer(ordered, op), op
    deferred.settle_key_order()
    assert b"".join(deferred.serialize()) == b"".join(ordered.serialize())
    assert deferred.range(b"\0", b"\0").kvs == ordered.range(b"\0", b"\0").kvs


def test_many_new_keys_wait_out_of_order_until_a_reader_needs_order():
    store = MVCCStore()
    for i in range(0, 1000, 2):
        store.apply(PutRequest(key(i), b"old"))
    store.defer_key_order()
    for i in range(999, 0, -2):  # new keys, in descending order
        store.apply(PutRequest(key(i), b"new"))
    # nothing was inserted in order yet, but point reads and counts see the keys
    assert len(store._live_sorted) == 500 and len(store._new_live) == 500
    assert store.key_count == 1000
    assert store.get(key(1)).value == b"new"  # reads the index: merges its new keys
    assert not store._new_histories and len(store._new_live) == 500
    got = store.range(key(0), b"\0", limit=5)  # counts the live keys: merges them
    assert not store._new_live
    assert [kv.key for kv in got.kvs] == [key(i) for i in range(5)] and got.count == 1000
    # still deferred: a few new keys are merged by ordered inserts
    store.apply(PutRequest(b"k/0000a", b"x"))
    assert store._new_live == [b"k/0000a"]
    assert store.range(key(0), key(1)).count == 2
    store.settle_key_order()
    store.apply(PutRequest(b"k/0000b", b"x"))
    assert not store._new_live and b"k/0000b" in store._live_sorted
