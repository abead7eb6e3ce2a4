"""MemoryStorage: the Storage contract (indexes, compaction, snapshots), as etcd's storage_test."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# --- data sizes: checked against a model that keeps (index, size) pairs and walks them ---


class _SizeModel:
    """The log as a dict index -> data size, and its first index; sums by walking."""

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}
        self.first = 1

    def append(self, start: int, sizes: list[int]) -> None:
        if not sizes:  # nothing to append: nothing is replaced either
            return
        for i in [i for i in self.sizes if i >= start]:
            del self.sizes[i]
        for k, size in enumerate(sizes):
            if start + k >= self.first:
                self.sizes[start + k] = size

    def compact(self, index: int) -> None:
        self.sizes = {i: s for i, s in self.sizes.items() if i > index}
        self.first = index + 1

    def restart_at(self, index: int) -> None:
        self.sizes, self.first = {}, index + 1

    def data_bytes(self, lo: int, hi: int) -> int:
        return sum(s for i, s in self.sizes.items() if lo <= i < hi)

    def first_index_within(self, hi: int, budget: int) -> int:
        i = min(hi, max(self.sizes, default=self.first - 1) + 1)
        while i - 1 >= self.first and self.data_bytes(i - 1, hi) <= budget:
            i -= 1
        return i


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 6), st.lists(st.integers(0, 50), max_size=8)),
        st.tuples(st.just("compact"), st.integers(0, 10)),
        st.tuples(st.just("snapshot"), st.integers(1, 5)),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(_ops, st.integers(0, 120))
def test_data_sizes_match_a_walk_over_the_entries(ops, budget):
    s, model = MemoryStorage(), _SizeModel()
    term = 1
    for op in ops:
        if op[0] == "append":
            _, back, sizes = op
            start = max(s.first_index(), s.last_index() + 1 - back)
            term += 1
            s.append([Entry(term, start + k, data=b"x" * n) for k, n in enumerate(sizes)])
            model.append(start, sizes)
        elif op[0] == "compact":
            index = s.first_index() + op[1]
            if index <= s.last_index():
                s.compact(index)
                model.compact(index)
        else:
            index = s.last_index() + op[1]
            s.apply_snapshot(Snapshot(metadata=SnapshotMetadata(ConfState(), index, term)))
            model.restart_at(index)
        first, last = s.first_index(), s.last_index()
        for lo in range(first, last + 2):
            for hi in range(lo, last + 2):
                assert s.data_bytes(lo, hi) == model.data_bytes(lo, hi), (lo, hi)
        for hi in range(first, last + 2):
            assert s.first_index_within(hi, budget) == model.first_index_within(hi, budget)
