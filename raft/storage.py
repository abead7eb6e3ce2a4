"""Stable storage as the raft core sees it: the ``Storage`` protocol and ``MemoryStorage``.

The core only reads storage; the caller writes to it while handling a Ready (append entries,
set the hard state, apply a snapshot) and compacts it after taking snapshots.

Index conventions (as etcd): the storage holds a snapshot at ``first_index() - 1`` (possibly
the empty snapshot at 0) followed by entries ``first_index() .. last_index()``. ``term(i)``
is answerable for ``first_index() - 1 <= i <= last_index()``; below that it raises
``CompactedError``, above it ``UnavailableError``. ``entries(lo, hi)`` returns entries
``lo .. hi-1``, raises ``CompactedError`` when ``lo < first_index()``, and returns at least
one entry even when that entry alone exceeds ``max_size_bytes``.

``MemoryStorage`` also knows how many bytes of entry data lie between two indexes
(``data_bytes``) and where a log holding at most some number of bytes would start
(``first_index_within``), both without walking the entries: a member decides where to cut
its log after each snapshot, and a log of small entries kept for slow followers holds
hundreds of thousands of them.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import Protocol

from raft.errors import (
    CompactedError,
    RaftInvariantError,
    SnapOutOfDateError,
    UnavailableError,
)
from raft.types import ConfState, Entry, HardState, Snapshot, SnapshotMetadata, limit_size


class Storage(Protocol):
    def initial_state(self) -> tuple[HardState, ConfState]: ...

    def entries(self, lo: int, hi: int, max_size_bytes: int | None = None) -> list[Entry]: ...

    def term(self, i: int) -> int: ...

    def last_index(self) -> int: ...

    def first_index(self) -> int: ...

    def snapshot(self) -> Snapshot: ...


class MemoryStorage:
    """An in-memory Storage (for tests, the simulator, and as the driver's log cache).

    ``_ents[0]`` is a dummy entry carrying the snapshot's index and term.
    """

    def __init__(self) -> None:
        self._hard_state = HardState()
        self._snapshot = Snapshot()
        # invariant: _ents[0].index == _snapshot.metadata.index; indexes are consecutive
        self._ents: list[Entry] = [Entry(term=0, index=0)]
        # invariant: len(_data_ends) == len(_ents), and _data_ends[k] - _data_ends[j] is the
        # size of the data of _ents[j+1 .. k] (running totals; only differences are used,
        # so a compaction keeps them as they are; 8 bytes each, not a Python int each)
        self._data_ends = array("q", [0])

    # --- Storage protocol ---

    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._hard_state, self._snapshot.metadata.conf_state

    def entries(self, lo: int, hi: int, max_size_bytes: int | None = None) -> list[Entry]:
        offset = self._ents[0].index
        if lo <= offset:
            raise CompactedError(f"entries({lo}, {hi}): compacted up to {offset}")
        if hi > self.last_index() + 1:
            raise RaftInvariantError(f"entries({lo}, {hi}) out of bound {self.last_index()}")
        if len(self._ents) == 1:  # only the dummy entry
            raise UnavailableError(f"entries({lo}, {hi}): no entries")
        return limit_size(self._ents[lo - offset : hi - offset], max_size_bytes)

    def term(self, i: int) -> int:
        offset = self._ents[0].index
        if i < offset:
            raise CompactedError(f"term({i}): compacted up to {offset}")
        if i - offset >= len(self._ents):
            raise UnavailableError(f"term({i}): last index is {self.last_index()}")
        return self._ents[i - offset].term

    def last_index(self) -> int:
        return self._ents[0].index + len(self._ents) - 1

    def first_index(self) -> int:
        return self._ents[0].index + 1

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # --- sizes (not part of the Storage protocol) ---

    def data_bytes(self, lo: int, hi: int) -> int:
        """The size of the data of entries ``lo .. hi-1``, in O(1); ``lo`` and ``hi`` are
        clamped to the entries held."""
        offset = self._ents[0].index
        last = len(self._ents) - 1
        lo_at = min(max(lo - offset - 1, 0), last)
        hi_at = min(max(hi - offset - 1, 0), last)
        return max(0, self._data_ends[hi_at] - self._data_ends[lo_at])

    def first_index_within(self, hi: int, max_bytes: int) -> int:
        """The smallest index ``i >= first_index()`` such that entries ``i .. hi-1`` hold at
        most ``max_bytes`` of data (``hi`` when even the entry before it alone holds more),
        in O(log n)."""
        offset = self._ents[0].index
        hi_at = min(max(hi - offset - 1, 0), len(self._ents) - 1)
        # the smallest j with _data_ends[hi_at] - _data_ends[j] <= max_bytes; entries after
        # position j (index offset + j + 1) are then within the budget
        j = bisect_left(self._data_ends, self._data_ends[hi_at] - max_bytes, 0, hi_at + 1)
        return offset + j + 1

    # --- writes (the caller's side) ---

    def hard_state(self) -> HardState:
        return self._hard_state

    def set_hard_state(self, hs: HardState) -> None:
        self._hard_state = hs

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Replace the contents with ``snap``; SnapOutOfDateError unless it is newer."""
        if snap.metadata.index <= self._snapshot.metadata.index:
            raise SnapOutOfDateError(
                f"snapshot {snap.metadata.index} not newer than {self._snapshot.metadata.index}"
            )
        self._snapshot = snap
        self._ents = [Entry(term=snap.metadata.term, index=snap.metadata.index)]
        self._data_ends = array("q", [0])

    def create_snapshot(self, index: int, conf_state: ConfState | None, data: bytes) -> Snapshot:
        """Record a snapshot of the state machine at ``index`` (does not compact)."""
        if index <= self._snapshot.metadata.index:
            raise SnapOutOfDateError(
                f"snapshot at {index} not newer than {self._snapshot.metadata.index}"
            )
        if index > self.last_index():
            raise RaftInvariantError(f"snapshot {index} is beyond last index {self.last_index()}")
        offset = self._ents[0].index
        cs = conf_state if conf_state is not None else self._snapshot.metadata.conf_state
        self._snapshot = Snapshot(
            data=data,
            metadata=SnapshotMetadata(
                conf_state=cs, index=index, term=self._ents[index - offset].term
            ),
        )
        return self._snapshot

    def compact(self, compact_index: int) -> None:
        """Discard entries before ``compact_index``; it becomes the new dummy entry.

        The caller must not compact beyond the applied index.
        """
        offset = self._ents[0].index
        if compact_index <= offset:
            raise CompactedError(f"compact({compact_index}): already compacted to {offset}")
        if compact_index > self.last_index():
            raise RaftInvariantError(
                f"compact({compact_index}) is beyond last index {self.last_index()}"
            )
        i = compact_index - offset
        dummy = Entry(term=self._ents[i].term, index=self._ents[i].index)
        self._ents = [dummy] + self._ents[i + 1 :]
        self._data_ends = self._data_ends[i:]

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Append, replacing any conflicting suffix (entries at or after entries[0].index)."""
        if not entries:
            return
        first = self.first_index()
        last = entries[0].index + len(entries) - 1
        if last < first:  # all of them are already compacted
            return
        if first > entries[0].index:
            entries = entries[first - entries[0].index :]
        offset = entries[0].index - self._ents[0].index
        if offset > len(self._ents):
            raise RaftInvariantError(
                f"missing log entries: last {self.last_index()}, appending at {entries[0].index}"
            )
        del self._ents[offset:]
        self._ents.extend(entries)
        ends = self._data_ends
        del ends[offset:]
        total = ends[-1]
        for e in entries:
            total += len(e.data)
            ends.append(total)
