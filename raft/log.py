"""The raft log: the caller's Storage (durable prefix) plus the Unstable tail.

Reads consult the unstable part first for indexes at or after ``unstable.offset`` and the
storage below it; storage may still hold a stale suffix that the unstable part replaces,
which the caller overwrites when it persists the unstable entries.

Cursors, in index order:

    first_index()-1 (snapshot) <= applied <= committed <= last_index()
"""

from __future__ import annotations

from collections.abc import Iterable

from raft.errors import (
    CommitOutOfRangeError,
    CompactedError,
    RaftInvariantError,
    UnavailableError,
)
from raft.storage import Storage
from raft.types import Entry, EntryType, Snapshot, limit_size
from raft.unstable import Unstable


class RaftLog:
    def __init__(self, storage: Storage, max_applying_size_bytes: int) -> None:
        self.storage = storage
        first = storage.first_index()
        last = storage.last_index()
        self.unstable = Unstable(last + 1)
        # invariant: applied <= committed <= last_index()
        # (applied may lag first_index()-1 while a restored snapshot is not yet applied)
        self.committed = first - 1  # highest index known to be stored on a quorum
        self.applied = first - 1  # highest index the caller reports applied (advance)
        self.max_applying_size_bytes = max_applying_size_bytes  # bound per Ready

    def __str__(self) -> str:
        return (
            f"committed={self.committed}, applied={self.applied}, "
            f"unstable.offset={self.unstable.offset}, "
            f"len(unstable.entries)={len(self.unstable.entries)}"
        )

    # --- index and term queries ---

    def first_index(self) -> int:
        i = self.unstable.maybe_first_index()
        return i if i is not None else self.storage.first_index()

    def last_index(self) -> int:
        i = self.unstable.maybe_last_index()
        return i if i is not None else self.storage.last_index()

    def term(self, i: int) -> int:
        """Term of entry ``i``; CompactedError below the snapshot, UnavailableError past the end."""
        dummy = self.first_index() - 1
        if i < dummy:
            raise CompactedError(f"term({i}): compacted up to {dummy}")
        if i > self.last_index():
            raise UnavailableError(f"term({i}): last index is {self.last_index()}")
        t = self.unstable.maybe_term(i)
        if t is not None:
            return t
        return self.storage.term(i)

    def term_or_zero(self, i: int) -> int:
        try:
            return self.term(i)
        except (CompactedError, UnavailableError):
            return 0

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, i: int, t: int) -> bool:
        try:
            return self.term(i) == t
        except (CompactedError, UnavailableError):
            return False

    def is_up_to_date(self, last_index: int, term: int) -> bool:
        """§5.4.1: a log ending at (term, last_index) is at least as up-to-date as ours."""
        our_term = self.last_term()
        return term > our_term or (term == our_term and last_index >= self.last_index())

    # --- appending ---

    def maybe_append(
        self, index: int, log_term: int, committed: int, ents: tuple[Entry, ...] | list[Entry]
    ) -> int | None:
        """Follower side of MsgApp: if our entry at ``index`` has ``log_term``, merge ``ents``
        after it (§5.3) and advance commit; return the index of the last new entry, else None.
        """
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(ents)
        ci = self.find_conflict(ents)
        if ci != 0:
            if ci <= self.committed:
                raise RaftInvariantError(
                    f"entry {ci} conflicts with committed entry (committed={self.committed})"
                )
            self.append(list(ents[ci - (index + 1) :]))
        self.commit_to(min(committed, last_new))
        return last_new

    def append(self, ents: list[Entry]) -> int:
        if not ents:
            return self.last_index()
        after = ents[0].index - 1
        if after < self.committed:
            raise RaftInvariantError(f"append after {after} is below committed {self.committed}")
        self.unstable.truncate_and_append(ents)
        return self.last_index()

    def find_conflict(self, ents: Iterable[Entry]) -> int:
        """Index of the first entry of ``ents`` that is new or conflicts with ours; 0 if none."""
        for e in ents:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """Largest index <= ``index`` whose term is <= ``term`` (or unknown): the leader's
        fast log-backtracking hint (thesis §5.3 optimisation, as etcd)."""
        while index > 0:
            try:
                our = self.term(index)
            except (CompactedError, UnavailableError):
                return index
            if our <= term:
                return index
            index -= 1
        return index

    # --- reading entries ---

    def entries(self, i: int, max_size_bytes: int | None) -> list[Entry]:
        if i > self.last_index():
            return []
        return self.slice(i, self.last_index() + 1, max_size_bytes)

    def all_entries(self) -> list[Entry]:
        """Every entry from first_index() on (tests and debugging)."""
        return self.entries(self.first_index(), None)

    def slice(self, lo: int, hi: int, max_size_bytes: int | None) -> list[Entry]:
        """Entries lo .. hi-1 within ``max_size_bytes`` (at least one); CompactedError if
        lo is below first_index()."""
        if lo > hi:
            raise RaftInvariantError(f"invalid slice {lo} > {hi}")
        first = self.first_index()
        if lo < first:
            raise CompactedError(f"slice({lo}, {hi}): compacted up to {first - 1}")
        if hi > self.last_index() + 1:
            raise RaftInvariantError(f"slice[{lo},{hi}) out of bound [{first},{self.last_index()}]")
        if lo == hi:
            return []
        ents: list[Entry] = []
        offset = self.unstable.offset
        if lo < offset:
            upper = min(hi, offset)
            try:
                stored = self.storage.entries(lo, upper, max_size_bytes)
            except UnavailableError as e:
                raise RaftInvariantError(f"entries[{lo}:{upper}) unavailable from storage") from e
            if len(stored) < upper - lo:  # the size limit was reached
                return stored
            ents = list(stored)
        if hi > offset:
            ents.extend(self.unstable.slice(max(lo, offset), hi))
        return limit_size(ents, max_size_bytes)

    def has_next_committed_entries(self) -> bool:
        return self.committed + 1 > max(self.applied + 1, self.first_index())

    def next_committed_entries(self) -> list[Entry]:
        """Committed entries not yet applied, bounded by max_applying_size_bytes."""
        lo = max(self.applied + 1, self.first_index())
        if self.committed + 1 <= lo:
            return []
        return self.slice(lo, self.committed + 1, self.max_applying_size_bytes)

    def pending_conf_changes(self, lo: int, hi: int) -> int:
        """Number of conf-change entries in lo .. hi-1."""
        if lo >= hi:
            return 0
        return sum(
            1
            for e in self.slice(lo, hi, None)
            if e.type in (EntryType.CONF_CHANGE, EntryType.CONF_CHANGE_V2)
        )

    # --- snapshots ---

    def snapshot(self) -> Snapshot:
        if self.unstable.snapshot is not None:
            return self.unstable.snapshot
        return self.storage.snapshot()

    def has_pending_snapshot(self) -> bool:
        return self.unstable.snapshot is not None

    def restore(self, snap: Snapshot) -> None:
        self.committed = snap.metadata.index
        self.unstable.restore(snap)

    # --- cursors ---

    def commit_to(self, to_commit: int) -> None:
        if to_commit <= self.committed:
            return  # never decrease commit
        if to_commit > self.last_index():
            # Only a heartbeat can carry a commit index past our log, and only when we lost
            # entries we acknowledged: the caller must stop (see CommitOutOfRangeError).
            raise CommitOutOfRangeError(to_commit, self.last_index())
        self.committed = to_commit

    def maybe_commit(self, max_index: int, term: int) -> bool:
        """Commit up to ``max_index`` only if that entry is from ``term`` (§5.4.2)."""
        if max_index > self.committed and self.term_or_zero(max_index) == term:
            self.commit_to(max_index)
            return True
        return False

    def applied_to(self, i: int) -> None:
        if i == 0:
            return
        if i > self.committed or i < self.applied:
            raise RaftInvariantError(
                f"applied {i} out of range [prev applied {self.applied}, committed {self.committed}]"
            )
        self.applied = i

    def stable_to(self, i: int, t: int) -> None:
        self.unstable.stable_to(i, t)

    def stable_snap_to(self, i: int) -> None:
        self.unstable.stable_snap_to(i)
