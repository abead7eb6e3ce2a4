"""A large delete applied in steps is the one-shot delete, and nobody sees it half done.

``apply_in_steps`` tombstones a few keys per step. Its result and the store it leaves must be
those of ``apply`` (byte-equal snapshots), and between steps every reader — a range at the
current revision (read in steps, as RaftKV reads while a write is open), a watch replay, a
snapshot stream taken then — sees the store as it was before the delete.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import kvserver.mvcc.store as store_mod
from kvserver.kvpb.kv import DeleteRangeRequest, PutRequest, RangeRequest
from kvserver.mvcc.store import MVCCStore


def _loaded(n: int) -> MVCCStore:
    s = MVCCStore(compact_in_background=True)
    for i in range(n):
        s.apply(PutRequest(b"k%05d" % i, b"v%d" % i, lease=0))
    s.apply(DeleteRangeRequest(b"k00003"))  # a tombstone inside the range
    return s


def _snapshot(s: MVCCStore) -> bytes:
    return b"".join(s.serialize(chunk_size_bytes=4096))


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 3000),
    lo=st.integers(0, 3000),
    span=st.integers(1, 3000),
    prev_kv=st.booleans(),
    dedup=st.booleans(),
)
def test_a_delete_in_steps_equals_the_one_shot_delete(n, lo, span, prev_kv, dedup):
    req = DeleteRangeRequest(b"k%05d" % lo, b"k%05d" % (lo + span), prev_kv)
    ids = (7, 11) if dedup else (0, 0)
    one_shot, stepped = _loaded(n), _loaded(n)
    expected = one_shot.apply(req, *ids)
    steps = stepped.apply_in_steps(req, *ids)
    try:
        while next(steps) is None:
            pass
    except StopIteration as stop:
        got = stop.value
    assert got == expected
    assert _snapshot(stepped) == _snapshot(one_shot)
    if dedup:  # a retry of the same pair is answered the first outcome, changing nothing
        again = stepped.apply_in_steps(req, *ids)
        try:
            next(again)
        except StopIteration as stop:
            assert stop.value.duplicate and stop.value.response == expected.response


def test_readers_between_steps_see_the_store_before_the_delete():
    n = 3 * store_mod.WRITE_STEP_KEYS + 5
    s = _loaded(n)
    req = DeleteRangeRequest(b"k", b"l")
    assert s.write_is_large(req)
    before_rev = s.revision
    everything = RangeRequest(b"k", b"l")
    before = s.apply(everything).response
    before_events = s.events_since(2, b"k", b"l")
    before_snapshot = _snapshot(s)
    steps = s.apply_in_steps(req)
    assert next(steps) is None  # one step done: some keys are tombstoned already
    seen_steps = 0
    while True:
        seen_steps += 1
        assert s.revision == before_rev
        assert not s.range_is_bounded(RangeRequest(b"k", b"l", limit=10))
        reader = s.range_in_steps(everything)
        answer = next(reader)
        while answer is None:
            answer = next(reader)
        assert answer == before
        assert s.apply(RangeRequest(b"k", b"l", count_only=True)).response.count == before.count
        assert s.events_since(2, b"k", b"l") == before_events
        assert _snapshot(s) == before_snapshot
        try:
            assert next(steps) is None
        except StopIteration as stop:
            result = stop.value
            break
    assert seen_steps >= 3
    assert s.revision == before_rev + 1
    assert result.response.deleted == before.count and len(result.events) == before.count
    assert s.apply(RangeRequest(b"k", b"l", count_only=True)).response.count == 0


def test_small_or_single_key_deletes_are_not_large():
    s = _loaded(100)
    assert not s.write_is_large(DeleteRangeRequest(b"k", b"l"))
    assert not s.write_is_large(DeleteRangeRequest(b"k00001"))
    assert not s.write_is_large(PutRequest(b"k", b"v"))
