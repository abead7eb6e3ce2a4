"""A range read in steps answers exactly what the one-shot read answers at its revision.

``range_in_steps`` visits a few keys per step and lets the store apply writes (and
compactions) between steps; its answer must still be that of ``apply(range)`` at the
revision it started at: the same kvs, count and ``more``, sorted, filtered and keys-only
alike. The reference is the one-shot answer taken before any write of the run.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserver.kvpb.kv import (
    CompactionRequest,
    DeleteRangeRequest,
    PutRequest,
    RangeRequest,
    SortOrder,
    SortTarget,
)
from kvserver.mvcc.store import MVCCStore

KEYS = [b"k%02d" % i for i in range(24)]
key = st.sampled_from(KEYS)

writes = st.lists(
    st.one_of(
        st.builds(lambda k, v: PutRequest(k, v), key, st.binary(max_size=3)),
        st.builds(lambda k: DeleteRangeRequest(k), key),
        st.builds(lambda a, b: DeleteRangeRequest(min(a, b), max(a, b) + b"\0"), key, key),
    ),
    min_size=1,
    max_size=60,
)


@st.composite
def ranges(draw, top: int):
    lo = draw(key)
    end = draw(st.sampled_from([b"", b"\0", b"k05", b"k12", b"k99", b"l"]))
    return RangeRequest(
        lo,
        end,
        limit=draw(st.integers(0, 8)),
        revision=draw(st.integers(0, top)),
        sort_order=draw(st.sampled_from(list(SortOrder))),
        sort_target=draw(st.sampled_from(list(SortTarget))),
        keys_only=draw(st.booleans()),
        count_only=draw(st.booleans()),
        min_mod_revision=draw(st.sampled_from([0, 0, 3, 10])),
        max_create_revision=draw(st.sampled_from([0, 0, 8, 20])),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=writes,
    during=writes,
    data=st.data(),
    background=st.booleans(),
    compact_at=st.integers(0, 30),
    step=st.integers(1, 5),
)
def test_a_stepped_read_equals_the_one_shot_read(
    before, during, data, background, compact_at, step
):
    store = MVCCStore(compact_in_background=background)
    for w in before:
        store.apply(w)
    if 1 < compact_at < store.revision:
        store.apply(CompactionRequest(compact_at))
    r = data.draw(ranges(store.revision))
    if 0 < r.revision < store.compact_revision:
        return  # both fail alike: pinned by the compacted test below
    expected = store.apply(r).response
    steps = store.range_in_steps(r, step_keys=step)
    answer = next(steps)
    pending = iter(during)
    while answer is None:
        w = next(pending, None)
        if w is not None:
            store.apply(w)
            # Compact everything the read has not seen yet: only the hold on cutting old
            # versions keeps the versions it still needs.
            if store.revision > store.compact_revision:
                store.apply(CompactionRequest(store.revision))
            if background:
                store.compact_step(100)
        answer = next(steps)
    assert answer == expected


def test_a_stepped_read_below_the_compact_revision_fails_at_once():
    store = MVCCStore()
    for i in range(5):
        store.apply(PutRequest(b"k", b"%d" % i))
    store.apply(CompactionRequest(4))
    steps = store.range_in_steps(RangeRequest(b"k", revision=2))
    try:
        next(steps)
    except Exception as exc:
        assert "compacted" in str(exc)
    else:
        raise AssertionError("a read below the compact revision must fail")


def test_bounded_reads_are_those_of_the_order_statistics_index():
    store = MVCCStore()
    for i in range(10):
        store.apply(PutRequest(b"k%d" % i, b"v"))
    assert store.range_is_bounded(RangeRequest(b"k1"))
    assert store.range_is_bounded(RangeRequest(b"k", b"l", limit=100))
    assert store.range_is_bounded(RangeRequest(b"k", b"l", count_only=True))
    assert not store.range_is_bounded(RangeRequest(b"k", b"l"))  # no limit
    assert not store.range_is_bounded(RangeRequest(b"k", b"l", limit=100, revision=3))
    assert not store.range_is_bounded(
        RangeRequest(b"k", b"l", limit=5, sort_order=SortOrder.DESCEND)
    )
