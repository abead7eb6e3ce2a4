"""MemoryStorage: the Storage contract (indexes, compaction, snapshots), as etcd's storage_test."""

import pytest

from raft import (
    CompactedError,
    ConfState,
    Entry,
    HardState,
    MemoryStorage,
    SnapOutOfDateError,
    Snapshot,
    SnapshotMetadata,
    UnavailableError,
)
from raft.errors import RaftInvariantError


def storage_3_4_5() -> MemoryStorage:
    """Snapshot at 3 (term 3), entries 4 and 5 (terms 4, 5) — etcd's fixture."""
    s = MemoryStorage()
    s.apply_snapshot(Snapshot(metadata=SnapshotMetadata(ConfState(voters=(1,)), 3, 3)))
    s.append([Entry(4, 4), Entry(5, 5)])
    return s


def test_fresh_storage():
    s = MemoryStorage()
    assert s.first_index() == 1
    assert s.last_index() == 0
    assert s.term(0) == 0
    assert s.initial_state() == (HardState(), ConfState())
    with pytest.raises(UnavailableError):
        s.entries(1, 1)
    with pytest.raises(UnavailableError):
        s.term(1)


def test_term():
    s = storage_3_4_5()
    with pytest.raises(CompactedError):
        s.term(2)
    assert [s.term(i) for i in (3, 4, 5)] == [3, 4, 5]
    with pytest.raises(UnavailableError):
        s.term(6)


def test_entries_bounds_and_size_cap():
    s = MemoryStorage()
    s.append([Entry(i, i, data=b"x" * 4) for i in range(1, 7)])
    s.compact(3)  # entries 4, 5, 6 left
    one = Entry(4, 4, data=b"x" * 4).size_bytes()
    with pytest.raises(CompactedError):
        s.entries(2, 6)
    with pytest.raises(CompactedError):
        s.entries(3, 4)
    assert [e.index for e in s.entries(4, 5)] == [4]
    assert [e.index for e in s.entries(4, 7)] == [4, 5, 6]
    assert [e.index for e in s.entries(4, 7, max_size_bytes=0)] == [4]  # at least one
    assert [e.index for e in s.entries(4, 7, max_size_bytes=2 * one)] == [4, 5]
    assert [e.index for e in s.entries(4, 7, max_size_bytes=3 * one - 1)] == [4, 5]
    with pytest.raises(RaftInvariantError):
        s.entries(4, 8)


def test_first_last_index_and_compact():
    s = storage_3_4_5()
    assert (s.first_index(), s.last_index()) == (4, 5)
    s.compact(4)
    assert (s.first_index(), s.last_index()) == (5, 5)
    assert s.term(4) == 4
    with pytest.raises(CompactedError):
        s.compact(4)
    with pytest.raises(CompactedError):
        s.compact(2)
    with pytest.raises(RaftInvariantError):
        s.compact(6)
    s.compact(5)
    assert (s.first_index(), s.last_index()) == (6, 5)


def test_create_snapshot():
    s = storage_3_4_5()
    cs = ConfState(voters=(1, 2, 3))
    snap = s.create_snapshot(4, cs, b"data")
    assert snap == Snapshot(b"data", SnapshotMetadata(cs, 4, 4))
    assert s.snapshot() == snap
    with pytest.raises(SnapOutOfDateError):
        s.create_snapshot(3, cs, b"")
    with pytest.raises(RaftInvariantError):
        s.create_snapshot(6, cs, b"")
    # Creating a snapshot does not compact.
    assert s.first_index() == 4


def test_apply_snapshot():
    s = MemoryStorage()
    s.apply_snapshot(Snapshot(metadata=SnapshotMetadata(ConfState(voters=(1, 2)), 4, 4)))
    assert (s.first_index(), s.last_index(), s.term(4)) == (5, 4, 4)
    assert s.initial_state()[1] == ConfState(voters=(1, 2))
    with pytest.raises(SnapOutOfDateError):
        s.apply_snapshot(Snapshot(metadata=SnapshotMetadata(index=3, term=3)))
    with pytest.raises(SnapOutOfDateError):
        s.apply_snapshot(Snapshot(metadata=SnapshotMetadata(index=4, term=4)))


@pytest.mark.parametrize(
    "entries, want",
    [
        # all compacted: nothing changes
        ([Entry(3, 3)], [(3, 3), (4, 4), (5, 5)]),
        # same entries
        ([Entry(3, 3), Entry(4, 4), Entry(5, 5)], [(3, 3), (4, 4), (5, 5)]),
        # conflicting suffix is truncated
        ([Entry(3, 3), Entry(6, 4), Entry(6, 5)], [(3, 3), (4, 6), (5, 6)]),
        ([Entry(3, 3), Entry(4, 4), Entry(5, 5), Entry(5, 6)], [(3, 3), (4, 4), (5, 5), (6, 5)]),
        # starts before the snapshot: the compacted part is skipped
        ([Entry(2, 2), Entry(3, 3), Entry(5, 4)], [(3, 3), (4, 5)]),
        # truncate and append in the middle
        ([Entry(5, 4)], [(3, 3), (4, 5)]),
        # plain append
        ([Entry(5, 6)], [(3, 3), (4, 4), (5, 5), (6, 5)]),
    ],
)
def test_append(entries, want):
    s = storage_3_4_5()
    s.append(entries)
    got = [(i, s.term(i)) for i in range(s.first_index() - 1, s.last_index() + 1)]
    assert got == want


def test_append_with_a_gap_is_refused():
    s = storage_3_4_5()
    with pytest.raises(RaftInvariantError):
        s.append([Entry(5, 7)])


def test_hard_state():
    s = MemoryStorage()
    s.set_hard_state(HardState(3, 2, 1))
    assert s.initial_state()[0] == HardState(3, 2, 1)
