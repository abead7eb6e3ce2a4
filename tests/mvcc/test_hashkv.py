"""``kvserver.mvcc.hashkv``: what the hash covers, what it does not depend on, and its steps."""

from __future__ import annotations

import pytest

from kvserver.kvpb.errors import CompactedError, FutureRevisionError
from kvserver.mvcc.hashkv import hash_kv, hash_kv_steps
from kvserver.mvcc.store import MVCCStore


def store_with_history() -> MVCCStore:
    s = MVCCStore(compact_in_background=True)
    for i in range(40):
        s.put(b"k%02d" % (i % 16), b"v%d" % i, lease=i % 3)
    s.delete_range(b"k03", b"k06")
    s.put(b"k04", b"again")
    return s


def test_same_log_same_hash_at_every_revision():
    a, b = store_with_history(), store_with_history()
    for rev in range(2, a.revision + 1):
        assert hash_kv(a, rev) == hash_kv(b, rev)
    assert len({hash_kv(a, rev).hash for rev in range(2, a.revision + 1)}) == a.revision - 1


def test_response_fields_and_errors():
    s = store_with_history()
    now = hash_kv(s)
    assert (now.header.revision, now.hash_revision, now.compact_revision) == (
        s.revision,
        s.revision,
        -1,
    )
    assert hash_kv(s, 10).hash_revision == 10 and hash_kv(s, 10).header.revision == s.revision
    assert 0 <= now.hash < 2**32
    with pytest.raises(FutureRevisionError):
        hash_kv(s, s.revision + 1)
    s.compact(20)
    with pytest.raises(CompactedError):
        hash_kv(s, 20)  # etcd: a revision at the compact revision is compacted too
    assert hash_kv(s, 21).compact_revision == 20


def test_a_different_value_lease_or_key_changes_it():
    def with_last(key: bytes, value: bytes, lease: int = 0) -> MVCCStore:
        s = store_with_history()
        s.put(key, value, lease=lease)
        return s

    base = hash_kv(with_last(b"k01", b"same"))
    for other in (
        with_last(b"k01", b"other"),
        with_last(b"k01", b"same", lease=7),
        with_last(b"k02", b"same"),
    ):
        assert hash_kv(other).hash != base.hash
    assert hash_kv(MVCCStore()).hash != base.hash


def test_independent_of_compaction_progress_restore_and_later_writes():
    s = store_with_history()
    s.compact(25)
    pending = hash_kv(s)
    assert s.compaction_pending
    while s.compact_step(2):
        pass
    assert hash_kv(s) == pending
    restored = MVCCStore.restore(s.serialize(), compact_in_background=True)
    assert hash_kv(restored) == pending
    rev = s.revision
    s.put(b"later", b"x")
    assert hash_kv(s, rev).hash == pending.hash
    # A member that compacted at another revision hashes another set (compare only where
    # compact_revision matches, as with etcd).
    t = store_with_history()
    t.compact(24)
    assert hash_kv(t).hash != pending.hash


def test_bounded_steps_and_writes_between_them():
    s = MVCCStore(compact_in_background=True)
    for i in range(5000):
        s.put(b"key/%05d" % i, b"x" * 50)
    expected = hash_kv(s)
    steps = hash_kv_steps(s, 0, 4096)
    next(steps)  # the store's view is taken here
    n = 1
    while True:
        s.put(b"key/%05d" % n, b"meanwhile")  # the store keeps applying between steps
        if n == 3:
            s.compact(s.revision - 1)
        try:
            next(steps)
        except StopIteration as done:
            result = done.value
            break
        n += 1
    assert result == expected
    assert n > 50  # 5000 records of ~70 bytes in 4 KiB chunks, a chunk per step
    assert s._open_streams == 0  # the stream was closed: compaction may cut again


def test_closing_early_closes_the_stream():
    s = store_with_history()
    steps = hash_kv_steps(s, 0, 16)
    next(steps)
    assert s._open_streams == 1
    steps.close()
    assert s._open_streams == 0
