"""``MVCCStore.db_size_bytes`` is a running total, equal to a full recount at every point.

``status()`` reports the store's size on every call (etcd's ``dbSize``), so the store keeps
it incrementally (put, delete, lease revoke, compaction, restore) instead of walking every
key. These tests check the running total against a recount of every stored record after
random operations; ``tests/mvcc/test_model.py`` checks it too after each step of its longer
model histories.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.mvcc import (
    CompactionRequest,
    DeleteRangeRequest,
    MVCCStore,
    PutRequest,
    RequestOp,
    TxnRequest,
)
from kvserver.mvcc.store import RECORD_OVERHEAD_BYTES, record_size_bytes

KEYS = [b"a", b"bb", b"ccc", b"d\xff", b"e" * 40]


def recount(store: MVCCStore) -> tuple[int, int]:
    records = [kv for hist in store._index.values() for kv in hist]
    return len(records), sum(map(record_size_bytes, records))


def test_empty_store_is_zero_and_each_record_counts_key_value_overhead():
    store = MVCCStore()
    assert (store.history_size, store.db_size_bytes) == (0, 0)
    store.put(b"k", b"vvv")
    assert store.db_size_bytes == 1 + 3 + RECORD_OVERHEAD_BYTES
    store.put(b"k", b"")  # a second version of the same key
    assert store.db_size_bytes == 2 * (1 + RECORD_OVERHEAD_BYTES) + 3
    store.delete_range(b"k")  # a tombstone is a record too
    assert store.history_size == 3
    store.compact(store.revision)  # everything of the deleted key goes
    assert (store.history_size, store.db_size_bytes) == (0, 0)


ops = st.one_of(
    st.tuples(
        st.just("put"), st.sampled_from(KEYS), st.binary(max_size=30), st.sampled_from([0, 0, 7])
    ),
    st.tuples(st.just("delete"), st.sampled_from(KEYS), st.sampled_from([b"", b"c", b"\0"])),
    st.tuples(
        st.just("txn"),
        st.lists(st.sampled_from(KEYS), max_size=3, unique=True),
        st.binary(max_size=10),
    ),
    st.tuples(st.just("compact"), st.integers(min_value=-3, max_value=1)),
    st.tuples(st.just("revoke"), st.just(7)),
    st.tuples(st.just("restore"), st.sampled_from([64, 4096])),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ops, min_size=1, max_size=60))
def test_running_size_equals_full_recount(operations):
    store = MVCCStore()
    for op in operations:
        kind = op[0]
        if kind == "put":
            store.apply(PutRequest(op[1], op[2], op[3]))
        elif kind == "delete":
            store.apply(DeleteRangeRequest(op[1], op[2]))
        elif kind == "txn":
            puts = tuple(RequestOp(request_put=PutRequest(k, op[2])) for k in op[1])
            store.apply(TxnRequest(success=puts))
        elif kind == "compact":
            store.apply(CompactionRequest(store.revision + op[1]))  # some fail: no change
        elif kind == "revoke":
            store.delete_keys_of_lease(op[1])
        else:
            store = MVCCStore.restore(store.serialize(chunk_size_bytes=op[1]))
        assert (store.history_size, store.db_size_bytes) == recount(store), op
