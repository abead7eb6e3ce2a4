"""A range at the current revision touches only the keys it returns (etcd's count + limit).

The store keeps an order-statistics index of its live keys, so ``count`` is two bisects and a
page of ``limit`` keys reads ``limit`` histories, however many keys the range holds. Pinned by
counting the histories read (never by timing); answers are compared with a plain recount.
"""

from kvserver.kvpb.kv import (
    DeleteRangeRequest,
    PutRequest,
    RangeRequest,
    RequestOp,
    TxnRequest,
    prefix_range_end,
)
from kvserver.mvcc.keyindex import KeyIndex
from kvserver.mvcc.store import MVCCStore

N_KEYS = 20_000


class CountingIndex(KeyIndex):
    """The store's key -> history index, counting the histories read by key."""

    __slots__ = ()
    reads = 0

    def __getitem__(self, key):
        CountingIndex.reads += 1
        return super().__getitem__(key)

    def get(self, key, default=None):
        CountingIndex.reads += 1
        return super().get(key, default)

    def values_of(self, keys):
        CountingIndex.reads += len(keys)
        return super().values_of(keys)


def loaded_store() -> MVCCStore:
    store = MVCCStore()
    for i in range(0, N_KEYS, 100):  # txns within the default 128 ops
        ops = tuple(
            RequestOp(request_put=PutRequest(b"k/%06d" % j, b"v")) for j in range(i, i + 100)
        )
        store.apply(TxnRequest((), ops, ()))
    store.apply(DeleteRangeRequest(b"k/000100", b"k/000200"))  # tombstones inside the range
    store._index.__class__ = CountingIndex
    return store


def test_a_page_reads_only_its_keys_and_counts_them_all():
    store = loaded_store()
    CountingIndex.reads = 0
    resp = store.apply(RangeRequest(b"k/", prefix_range_end(b"k/"), limit=1000)).response
    assert len(resp.kvs) == 1000 and resp.more
    assert resp.count == N_KEYS - 100
    assert CountingIndex.reads <= 1001  # the page (one extra for `more`), not the range


def test_count_only_of_the_whole_store_reads_no_history():
    store = loaded_store()
    CountingIndex.reads = 0
    resp = store.apply(RangeRequest(b"\0", b"\0", count_only=True)).response
    assert resp.count == N_KEYS - 100 and not resp.kvs
    assert CountingIndex.reads == 0


def test_pages_walk_the_range_exactly_once():
    store = loaded_store()
    seen = []
    start = b"k/"
    end = prefix_range_end(b"k/")
    while True:
        resp = store.apply(RangeRequest(start, end, limit=777)).response
        seen += [kv.key for kv in resp.kvs]
        if not resp.more:
            break
        start = resp.kvs[-1].key + b"\0"
    expected = [b"k/%06d" % j for j in range(N_KEYS) if not 100 <= j < 200]
    assert seen == expected


def test_reads_inside_a_txn_see_its_own_writes_through_the_index():
    store = loaded_store()
    txn = TxnRequest(
        (),
        (
            RequestOp(request_delete_range=DeleteRangeRequest(b"k/000000", b"k/000010")),
            RequestOp(request_put=PutRequest(b"k/000150", b"back")),
            RequestOp(request_range=RangeRequest(b"k/", prefix_range_end(b"k/"), limit=3)),
        ),
        (),
    )
    resp = store.apply(txn).response
    page = resp.responses[2].response_range
    assert [kv.key for kv in page.kvs] == [b"k/000010", b"k/000011", b"k/000012"]
    assert page.count == N_KEYS - 100 - 10 + 1
