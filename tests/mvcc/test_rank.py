"""``MVCCStore.key_ranks``: the live keys at given ranks of a range, against a plain model.

The model is a dict of live keys, changed by the same random puts, deletes (single keys and
ranges) and compactions; its answer is ``sorted(keys in the range)[rank]``, written from
etcd's range rules without the store's order-statistics index. The store must agree after
every operation, for random ranges (one key, ``[key, range_end)``, every key >= ``key``) and
random ranks (inside and past the end), and must visit no key it does not return.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.mvcc import MVCCStore

KEYS = [b"a", b"ab", b"abc", b"b", b"ba", b"c", b"d", b"\xff", b"\xff\x00"]

keys = st.sampled_from(KEYS)
op = st.one_of(
    st.tuples(st.just("put"), keys),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("delete_range"), keys, st.sampled_from([*KEYS, b"\0"])),
    st.tuples(st.just("compact"), st.just(b"")),
)
query = st.tuples(keys, st.sampled_from([b"", b"\0", *KEYS]), st.lists(st.integers(0, 12)))


def model_in_range(live: set[bytes], key: bytes, range_end: bytes) -> list[bytes]:
    if range_end == b"":
        return [key] if key in live else []
    if range_end == b"\0":
        return sorted(k for k in live if k >= key)
    return sorted(k for k in live if key <= k < range_end)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=40), st.lists(query, min_size=1, max_size=6))
def test_key_ranks_match_a_sorted_model(ops, queries) -> None:
    store = MVCCStore()
    live: set[bytes] = set()
    for step in ops:
        if step[0] == "put":
            store.put(step[1], b"v")
            live.add(step[1])
        elif step[0] == "delete":
            store.delete_range(step[1])
            live.discard(step[1])
        elif step[0] == "delete_range":
            key, end = step[1], step[2]
            if end != b"\0" and end <= key:
                continue
            store.delete_range(key, end)
            live -= set(model_in_range(live, key, end))
        elif store.revision > store.compact_revision:
            store.compact(store.revision)
        for key, end, ranks in queries:
            want = model_in_range(live, key, end)
            count, got = store.key_ranks(key, end, ranks)
            assert count == len(want)
            assert got == [want[r] if r < len(want) else None for r in ranks]


def test_a_range_that_ends_before_it_starts_is_empty() -> None:
    store = MVCCStore()
    store.put(b"b", b"1")
    assert store.key_ranks(b"c", b"a", [0]) == (0, [None])


def test_a_negative_rank_is_refused() -> None:
    store = MVCCStore()
    store.put(b"b", b"1")
    with pytest.raises(ValueError, match="negative"):
        store.key_ranks(b"a", b"\0", [-1])


def test_ranks_touch_only_the_keys_they_return() -> None:
    """O(log N) per rank: the history index is not walked (no history list is read)."""
    store = MVCCStore()
    for i in range(2000):
        store.put(b"k%05d" % i, b"v")
    reads = 0
    index = store._index
    base = type(index)

    class Counting(base):  # type: ignore[misc,valid-type]
        __slots__ = ()

        def __getitem__(self, k):
            nonlocal reads
            reads += 1
            return base.__getitem__(self, k)

        def get(self, k, default=None):
            nonlocal reads
            reads += 1
            return base.get(self, k, default)

        def values_of(self, keys):
            nonlocal reads
            reads += len(keys)
            return base.values_of(self, keys)

    index.__class__ = Counting
    try:
        count, got = store.key_ranks(b"k", b"l", [0, 500, 1999, 2000])
    finally:
        index.__class__ = base
    assert count == 2000
    assert got == [b"k00000", b"k00500", b"k01999", None]
    assert reads == 0
