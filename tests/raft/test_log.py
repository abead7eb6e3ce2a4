"""The raft log (storage + unstable) and the Unstable tail, after etcd's log_test /
log_unstable_test."""

import pytest

from raft import (
    CompactedError,
    ConfState,
    Entry,
    MemoryStorage,
    Snapshot,
    SnapshotMetadata,
    UnavailableError,
)
from raft.config import NO_LIMIT
from raft.errors import RaftInvariantError
from raft.log import RaftLog
from raft.unstable import Unstable


def snap(index, term):
    return Snapshot(metadata=SnapshotMetadata(ConfState(voters=(1,)), index, term))


def ents(*pairs):
    """ents((index, term), ...)"""
    return [Entry(term=t, index=i) for i, t in pairs]


def new_log(stored=(), unstable=(), snapshot=None):
    s = MemoryStorage()
    if snapshot is not None:
        s.apply_snapshot(snapshot)
    s.append(list(stored))
    log = RaftLog(s, NO_LIMIT)
    log.append(list(unstable))
    return log


# --- Unstable ---


def test_unstable_maybe_first_and_last_index():
    u = Unstable(5)
    assert u.maybe_first_index() is None and u.maybe_last_index() is None
    u.entries = ents((5, 1))
    assert u.maybe_first_index() is None and u.maybe_last_index() == 5
    u.snapshot = snap(4, 1)
    assert u.maybe_first_index() == 5 and u.maybe_last_index() == 5
    u.entries = []
    assert u.maybe_last_index() == 4


def test_unstable_maybe_term():
    u = Unstable(5)
    u.entries = ents((5, 1))
    u.snapshot = snap(4, 1)
    assert u.maybe_term(5) == 1
    assert u.maybe_term(4) == 1  # from the snapshot
    assert u.maybe_term(6) is None
    assert u.maybe_term(3) is None


@pytest.mark.parametrize(
    "entries, offset, snapshot, index, term, want_offset, want_len",
    [
        ([], 0, None, 5, 1, 0, 0),
        (ents((5, 1)), 5, None, 5, 1, 6, 0),  # stable to the first entry
        (ents((5, 1), (6, 1)), 5, None, 5, 1, 6, 1),
        (ents((6, 2)), 6, None, 6, 1, 6, 1),  # term mismatch: ignored
        (ents((5, 1)), 5, None, 4, 1, 5, 1),  # old index: ignored
        (ents((5, 1)), 5, None, 4, 2, 5, 1),
        (ents((5, 1)), 5, snap(4, 1), 5, 1, 6, 0),
        (ents((5, 1), (6, 1)), 5, snap(4, 1), 5, 1, 6, 1),
        (ents((6, 2)), 6, snap(5, 1), 6, 1, 6, 1),
        (ents((5, 1)), 5, snap(4, 1), 4, 1, 5, 1),  # the snapshot's index: ignored
        (ents((5, 2)), 5, snap(4, 2), 4, 1, 5, 1),
    ],
)
def test_unstable_stable_to(entries, offset, snapshot, index, term, want_offset, want_len):
    u = Unstable(offset)
    u.entries = list(entries)
    u.snapshot = snapshot
    u.stable_to(index, term)
    assert (u.offset, len(u.entries)) == (want_offset, want_len)


@pytest.mark.parametrize(
    "entries, offset, to_append, want_offset, want",
    [
        (ents((5, 1)), 5, ents((6, 1), (7, 1)), 5, ents((5, 1), (6, 1), (7, 1))),  # append
        (ents((5, 1)), 5, ents((5, 2), (6, 2)), 5, ents((5, 2), (6, 2))),  # replace all
        (ents((5, 1)), 5, ents((4, 2), (5, 2), (6, 2)), 4, ents((4, 2), (5, 2), (6, 2))),
        (ents((5, 1), (6, 1), (7, 1)), 5, ents((6, 2)), 5, ents((5, 1), (6, 2))),  # truncate
        (
            ents((5, 1), (6, 1), (7, 1)),
            5,
            ents((7, 2), (8, 2)),
            5,
            ents((5, 1), (6, 1), (7, 2), (8, 2)),
        ),
    ],
)
def test_unstable_truncate_and_append(entries, offset, to_append, want_offset, want):
    u = Unstable(offset)
    u.entries = list(entries)
    u.truncate_and_append(to_append)
    assert u.offset == want_offset
    assert u.entries == want


def test_unstable_restore():
    u = Unstable(5)
    u.entries = ents((5, 1))
    u.snapshot = snap(4, 1)
    u.restore(snap(6, 2))
    assert u.offset == 7 and u.entries == [] and u.snapshot == snap(6, 2)
    u.stable_snap_to(5)
    assert u.snapshot is not None
    u.stable_snap_to(6)
    assert u.snapshot is None


# --- RaftLog ---


@pytest.mark.parametrize(
    "new, want",
    [
        ([], 0),
        (ents((1, 1), (2, 2), (3, 3)), 0),  # no conflict
        (ents((2, 2), (3, 3)), 0),
        (ents((3, 3)), 0),
        (ents((1, 1), (2, 2), (3, 3), (4, 4), (5, 4)), 4),  # new entries
        (ents((2, 2), (3, 3), (4, 4), (5, 4)), 4),
        (ents((4, 4), (5, 4)), 4),
        (ents((1, 4), (2, 4)), 1),  # conflicts
        (ents((2, 1), (3, 4), (4, 4)), 2),
        (ents((3, 1), (4, 2), (5, 4), (6, 4)), 3),
    ],
)
def test_find_conflict(new, want):
    log = new_log(unstable=ents((1, 1), (2, 2), (3, 3)))
    assert log.find_conflict(new) == want


@pytest.mark.parametrize(
    "index, term, want",
    [
        (3, 1, 1),  # our term at 1..3 is 1,2,3: the last index whose term <= 1 is 1
        (3, 2, 2),
        (3, 3, 3),
        (3, 0, 0),
        (10, 2, 10),  # beyond the log: unknown, returned as is
    ],
)
def test_find_conflict_by_term(index, term, want):
    log = new_log(unstable=ents((1, 1), (2, 2), (3, 3)))
    assert log.find_conflict_by_term(index, term) == want


def test_find_conflict_by_term_stops_at_compaction():
    log = new_log(stored=ents((6, 4), (7, 5)), snapshot=snap(5, 3))
    # term(5) = 3 > 2 and the term of 4 is unknown (compacted): 4 is where the search ends
    assert log.find_conflict_by_term(7, 2) == 4
    assert log.find_conflict_by_term(7, 4) == 6


@pytest.mark.parametrize(
    "last_index, term, want",
    [
        (2, 4, True),  # greater term wins regardless of index
        (3, 4, True),
        (4, 4, True),
        (2, 2, False),  # smaller term loses regardless of index
        (3, 2, False),
        (4, 2, False),
        (2, 3, False),  # equal term: longer or equal wins
        (3, 3, True),
        (4, 3, True),
    ],
)
def test_is_up_to_date(last_index, term, want):
    """§5.4.1: compare last terms, then lengths."""
    log = new_log(unstable=ents((1, 1), (2, 2), (3, 3)))
    assert log.is_up_to_date(last_index, term) == want


@pytest.mark.parametrize(
    "new, want_last, want_unstable_offset, want_terms",
    [
        ([], 2, 3, [1, 2]),
        (ents((3, 2)), 3, 3, [1, 2, 2]),
        (ents((1, 2)), 1, 1, [2]),  # conflicts with index 1
        (ents((2, 3), (3, 3)), 3, 2, [1, 3, 3]),  # conflicts with index 2
    ],
)
def test_append_truncates_conflicts(new, want_last, want_unstable_offset, want_terms):
    log = new_log(stored=ents((1, 1), (2, 2)))
    assert log.append(new) == want_last
    assert [log.term(i) for i in range(1, log.last_index() + 1)] == want_terms
    assert log.unstable.offset == want_unstable_offset


@pytest.mark.parametrize(
    "log_term, index, committed, new, want_last, want_commit",
    [
        # not a match: log term does not match at index
        (2, 3, 3, ents((4, 4)), None, 1),
        (3, 4, 3, ents((5, 4)), None, 1),  # index out of range
        # match with the last existing entry
        (3, 3, 3, [], 3, 3),
        (3, 3, 4, [], 3, 3),  # commit up to the last new entry only
        (3, 3, 2, [], 3, 2),
        (3, 3, 0, [], 3, 1),  # commit never decreases
        (3, 3, 3, ents((4, 4)), 4, 3),
        (3, 3, 4, ents((4, 4)), 4, 4),
        (3, 3, 5, ents((4, 4), (5, 4)), 5, 5),
        # match with an entry in the middle
        (2, 2, 3, ents((3, 4)), 3, 3),
        (1, 1, 4, ents((2, 4), (3, 4)), 3, 3),
    ],
)
def test_maybe_append(log_term, index, committed, new, want_last, want_commit):
    log = new_log(unstable=ents((1, 1), (2, 2), (3, 3)))
    log.commit_to(1)
    assert log.maybe_append(index, log_term, committed, new) == want_last
    assert log.committed == want_commit
    if want_last is not None and new:
        assert log.slice(log.last_index() - len(new) + 1, log.last_index() + 1, None) == new


def test_maybe_append_refuses_to_overwrite_committed():
    log = new_log(unstable=ents((1, 1), (2, 2), (3, 3)))
    log.commit_to(2)
    with pytest.raises(RaftInvariantError):
        log.maybe_append(0, 0, 3, ents((1, 4)))


def test_commit_to_never_decreases_and_stays_in_range():
    log = new_log(unstable=ents((1, 1), (2, 2), (3, 3)))
    log.commit_to(3)
    log.commit_to(1)
    assert log.committed == 3
    with pytest.raises(RaftInvariantError):
        log.commit_to(4)


def test_maybe_commit_only_of_the_given_term():
    """§5.4.2: the commit index moves only to an entry of the leader's term."""
    log = new_log(unstable=ents((1, 1), (2, 2), (3, 3)))
    assert not log.maybe_commit(2, 3)
    assert log.committed == 0
    assert log.maybe_commit(3, 3)
    assert log.committed == 3


def test_term_bounds():
    log = new_log(stored=ents((4, 4), (5, 5)), snapshot=snap(3, 3))
    with pytest.raises(CompactedError):
        log.term(2)
    assert [log.term(i) for i in (3, 4, 5)] == [3, 4, 5]
    with pytest.raises(UnavailableError):
        log.term(6)
    assert log.term_or_zero(2) == 0 and log.term_or_zero(6) == 0


def test_slice_across_storage_and_unstable_with_size_cap():
    log = new_log(stored=[Entry(1, i, data=b"x" * 8) for i in range(4, 7)], snapshot=snap(3, 1))
    log.append([Entry(1, i, data=b"x" * 8) for i in range(7, 10)])
    one = Entry(1, 4, data=b"x" * 8).size_bytes()
    assert log.unstable.offset == 7
    with pytest.raises(CompactedError):
        log.slice(3, 5, None)
    assert [e.index for e in log.slice(4, 10, None)] == [4, 5, 6, 7, 8, 9]
    assert [e.index for e in log.slice(5, 9, 0)] == [5]
    assert [e.index for e in log.slice(5, 9, 2 * one)] == [5, 6]
    assert [e.index for e in log.slice(5, 9, 3 * one)] == [5, 6, 7]  # crosses into unstable
    assert [e.index for e in log.slice(7, 9, one)] == [7]
    with pytest.raises(RaftInvariantError):
        log.slice(4, 11, None)


def test_next_committed_entries_and_applied():
    log = new_log(stored=ents((4, 1), (5, 1), (6, 1)), snapshot=snap(3, 1))
    assert log.applied == 3 and log.committed == 3
    log.commit_to(5)
    assert log.has_next_committed_entries()
    assert [e.index for e in log.next_committed_entries()] == [4, 5]
    log.applied_to(4)
    assert [e.index for e in log.next_committed_entries()] == [5]
    log.applied_to(5)
    assert not log.has_next_committed_entries()
    with pytest.raises(RaftInvariantError):
        log.applied_to(6)  # beyond commit
    with pytest.raises(RaftInvariantError):
        log.applied_to(4)  # backwards


def test_next_committed_entries_respect_the_size_bound():
    s = MemoryStorage()
    s.append([Entry(1, i, data=b"y" * 10) for i in range(1, 6)])
    log = RaftLog(s, max_applying_size_bytes=2 * Entry(1, 1, data=b"y" * 10).size_bytes())
    log.commit_to(5)
    assert [e.index for e in log.next_committed_entries()] == [1, 2]


def test_restore_from_snapshot():
    log = new_log(stored=ents((1, 1), (2, 1)))
    log.restore(snap(100, 5))
    assert log.committed == 100
    assert log.first_index() == 101 and log.last_index() == 100
    assert log.term(100) == 5
    assert log.has_pending_snapshot()
    assert log.snapshot() == snap(100, 5)
    # committed entries never include anything below the snapshot
    assert not log.has_next_committed_entries()


def test_stable_to_moves_entries_out_of_unstable():
    log = new_log(unstable=ents((1, 1), (2, 1), (3, 2)))
    log.stable_to(2, 1)
    assert log.unstable.offset == 3 and len(log.unstable.entries) == 1
    log.stable_to(3, 1)  # wrong term (replaced since): ignored
    assert log.unstable.offset == 3


def test_pending_conf_changes_counts_conf_entries():
    from raft import EntryType

    log = new_log(
        unstable=[
            Entry(1, 1),
            Entry(1, 2, EntryType.CONF_CHANGE),
            Entry(1, 3, EntryType.CONF_CHANGE_V2),
        ]
    )
    assert log.pending_conf_changes(1, 4) == 2
    assert log.pending_conf_changes(3, 3) == 0
