"""``MVCCStore(keep_history=False)``: one record per key, the same writes as a whole store.

The random equivalence over members' logs lives in ``tests/changefeed`` (the changefeed's cold
tier is this mode's user); here: what the mode keeps, what it refuses, and a restore."""

import pytest

from kvserver.kvpb.errors import CompactedError
from kvserver.kvpb.kv import PutRequest, RangeRequest
from kvserver.mvcc.store import MVCCStore, record_size_bytes


def _writes(store: MVCCStore) -> list:
    out = []
    for i in range(20):
        out.append(store.apply(_put(b"k%d" % (i % 5), b"v%d" % i)))
    store.delete_range(b"k1")
    store.delete_range(b"k3", b"k5")
    out.append(store.apply(_put(b"k3", b"again")))
    store.compact(10)
    return out


def _put(key: bytes, value: bytes) -> PutRequest:
    return PutRequest(key, value, prev_kv=True)


def test_the_same_results_with_one_record_per_key():
    whole, latest = MVCCStore(), MVCCStore(keep_history=False)
    assert [r.events for r in _writes(whole)] == [r.events for r in _writes(latest)]
    assert latest.revision == whole.revision
    assert latest.compact_revision == whole.compact_revision
    everything = RangeRequest(b"\x00", b"\0")
    assert latest.apply(everything).response.kvs == whole.apply(everything).response.kvs
    # one record per key ever written (a deleted key keeps its tombstone), counted right
    assert latest.history_size == 5 < whole.history_size
    records = [latest._index[k][-1] for k in latest._index]
    assert latest.db_size_bytes == sum(map(record_size_bytes, records))
    # the compact revision still refuses what the whole store refuses
    with pytest.raises(CompactedError):
        latest.range(b"k0", revision=5)


def test_no_snapshot_and_no_watch_replay_without_history():
    latest = MVCCStore(keep_history=False)
    _writes(latest)
    with pytest.raises(ValueError, match="history"):
        list(latest.serialize())
    with pytest.raises(ValueError, match="history"):
        latest.events_since(11, b"k0")


def test_a_restore_keeps_the_current_records():
    whole = MVCCStore()
    _writes(whole)
    latest = MVCCStore.restore(whole.serialize(), keep_history=False)
    assert latest.revision == whole.revision
    assert latest.compact_revision == whole.compact_revision
    assert latest.range(b"\x00", b"\0").kvs == whole.range(b"\x00", b"\0").kvs
    assert latest.history_size == 5
    # and it goes on as the whole store does
    a, b = whole.apply(_put(b"k1", b"x")), latest.apply(_put(b"k1", b"x"))
    assert a.events == b.events
