"""Compaction and watch replay, pinned to etcd 3.4 (mvcc/kvstore.go updateCompactRev,
mvcc/key_index.go compact, mvcc/watchable_store.go kvsToEvents, v3rpc/watch.go prev_kv)."""

import pytest

from kvserver.mvcc import (
    CompactedError,
    CompactionRequest,
    DeleteRangeRequest,
    Event,
    EventType,
    FutureRevisionError,
    KeyValue,
    MVCCStore,
    PutRequest,
)


def test_compact_errors_match_etcd():
    """etcd updateCompactRev (observed): compact(0) on a new store succeeds once (the compact
    revision starts at -1); compacting at or below the compact revision again is
    `compacted`; above the current revision is `future revision`; compaction does not
    change the revision."""
    s = MVCCStore()
    assert s.compact(0).revision == 1
    with pytest.raises(CompactedError):
        s.compact(0)
    with pytest.raises(CompactedError):
        s.compact(-5)
    s.put(b"a", b"1")
    with pytest.raises(FutureRevisionError, match="future revision"):
        s.compact(3)
    assert s.compact(2).revision == 2
    assert s.compact_revision == 2
    with pytest.raises(CompactedError) as info:
        s.compact(2)
    assert info.value.compact_revision == 2
    assert s.revision == 2


def test_compaction_keeps_newest_version_at_or_below_and_drops_older():
    """etcd keyIndex.compact: per key, keep the newest version <= the compact revision (unless
    it is a tombstone) and everything after it; reads in [compact, current] stay exact."""
    s = MVCCStore()
    s.put(b"a", b"1")  # 2
    s.put(b"a", b"2")  # 3
    s.put(b"b", b"1")  # 4
    s.delete_range(b"b")  # 5
    s.put(b"a", b"3")  # 6
    s.put(b"c", b"1")  # 7
    s.delete_range(b"c")  # 8
    want = {rev: s.range(b"\0", b"\0", revision=rev).kvs for rev in range(5, 9)}
    s.compact(5)
    for rev in range(5, 9):
        assert s.range(b"\0", b"\0", revision=rev).kvs == want[rev]
    # a keeps versions 3 (the newest <= 5) and 6; b's tombstone at 5 went; c is untouched
    assert s.history_size == 2 + 2
    s.compact(8)
    assert s.history_size == 1  # a@6 only: c's tombstone at 8 is dropped with its generation
    assert s.range(b"\0", b"\0", revision=8).kvs == (KeyValue(b"a", b"3", 2, 6, 3, 0),)


def test_compaction_via_apply_returns_header_and_no_events():
    """etcd Compaction: the response header carries the current revision; nothing is a
    change, so no watch events."""
    s = MVCCStore()
    s.put(b"a", b"1")
    res = s.apply(CompactionRequest(2))
    assert res.error is None and res.events == () and res.response.revision == 2


def test_apply_returns_events_with_prev_kv():
    """etcd watchableStoreTxnWrite.End: a put is a PUT event with the new kv; a delete is a
    DELETE event whose kv holds only key and mod_revision (= the deleting revision)."""
    s = MVCCStore()
    first = s.apply(PutRequest(b"k", b"1")).events
    assert first == (Event(EventType.PUT, KeyValue(b"k", b"1", 2, 2, 1, 0), None),)
    second = s.apply(PutRequest(b"k", b"2")).events
    assert second[0].prev_kv == first[0].kv
    res = s.apply(DeleteRangeRequest(b"k"))
    assert res.events == (Event(EventType.DELETE, KeyValue(b"k", b"", 0, 4, 0, 0), second[0].kv),)


def test_events_since_replays_history_in_revision_order():
    """etcd watch with start_revision: every event from that revision on, for the watched
    key/range, in revision order; prev_kv is the key at mod_revision - 1 (none for a create)."""
    s = MVCCStore()
    s.put(b"a", b"1")  # 2
    s.put(b"b", b"1")  # 3
    s.put(b"a", b"2")  # 4
    s.delete_range(b"a")  # 5
    s.put(b"c", b"1")  # 6
    evs = s.events_since(3, b"a", b"c", prev_kv=True)
    assert [(e.type, e.kv.key, e.kv.mod_revision) for e in evs] == [
        (EventType.PUT, b"b", 3),
        (EventType.PUT, b"a", 4),
        (EventType.DELETE, b"a", 5),
    ]
    assert evs[0].prev_kv is None
    assert evs[1].prev_kv.value == b"1"
    assert evs[2].prev_kv.value == b"2"
    assert [e.kv.key for e in s.events_since(0, b"a")] == [b"a", b"a", b"a"]
    assert [e.kv.key for e in s.events_since(2, b"\0", b"\0")] == [b"a", b"b", b"a", b"a", b"c"]
    assert s.events_since(7, b"\0", b"\0") == []
    assert all(e.prev_kv is None for e in s.events_since(2, b"\0", b"\0"))


def test_events_since_below_compact_revision_is_compacted():
    """etcd watcherGroup.chooseAll: a watcher whose start revision is below the compact
    revision gets a compaction response (CompactRevision)."""
    s = MVCCStore()
    for i in range(5):
        s.put(b"k", b"%d" % i)
    s.compact(4)
    with pytest.raises(CompactedError) as info:
        s.events_since(3, b"k")
    assert info.value.compact_revision == 4
    assert [e.kv.mod_revision for e in s.events_since(4, b"k")] == [4, 5, 6]


def test_events_at_compact_revision_keep_puts_only():
    """etcd compaction removes a tombstone at the compact revision from the backend, so a
    watch starting exactly at the compact revision replays that revision's puts but not its
    deletes; prev_kv below the compact revision is not available."""
    s = MVCCStore()
    s.put(b"a", b"1")  # 2
    s.put(b"b", b"1")  # 3
    s.txn((), [PutRequest(b"a", b"2"), DeleteRangeRequest(b"b")])
    s.compact(4)
    evs = s.events_since(4, b"\0", b"\0", prev_kv=True)
    assert [(e.type, e.kv.key) for e in evs] == [(EventType.PUT, b"a")]
    assert evs[0].prev_kv is None  # revision 3 is compacted


def test_events_since_max_events_never_splits_a_revision():
    """Paging for watch catch-up: stop after max_events but finish the revision."""
    s = MVCCStore()
    s.put(b"a", b"0")
    s.txn((), [PutRequest(b"a", b"1"), PutRequest(b"b", b"1"), PutRequest(b"c", b"1")])
    s.put(b"d", b"1")
    evs = s.events_since(2, b"\0", b"\0", max_events=2)
    assert [e.kv.mod_revision for e in evs] == [2, 3, 3, 3]
    rest = s.events_since(evs[-1].kv.mod_revision + 1, b"\0", b"\0", max_events=2)
    assert [e.kv.key for e in rest] == [b"d"]


def test_compaction_work_is_bounded_by_history_not_keys():
    """Compaction touches only keys changed at or below the compact revision; the log of
    changes is trimmed, so memory tracks live data plus uncompacted history."""
    s = MVCCStore()
    for i in range(2000):
        s.put(b"key%05d" % i, b"v")
    for _ in range(5):
        s.put(b"hot", b"x")
    s.compact(s.revision)
    assert s.history_size == 2001
    for _ in range(20000):
        s.put(b"hot", b"y")
    s.compact(s.revision)
    assert s.history_size == 2001
    # the change log was rebuilt: no unbounded leading garbage
    assert s._log_start == 0 and len(s._log) == 1
