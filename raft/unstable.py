"""The unstable part of the raft log: entries (and possibly a snapshot) not yet persisted.

Entries move out of here when the caller reports them durable (``stable_to``), which happens
in ``RawNode.advance()`` for the entries of the Ready just handled.
"""

from __future__ import annotations

from raft.errors import RaftInvariantError
from raft.types import Entry, Snapshot


class Unstable:
    __slots__ = ("snapshot", "entries", "offset")

    def __init__(self, offset: int) -> None:
        self.snapshot: Snapshot | None = None  # incoming snapshot not yet persisted
        self.entries: list[Entry] = []
        # invariant: entries[i].index == offset + i
        # invariant: snapshot is None or offset > snapshot.metadata.index
        self.offset = offset

    def maybe_first_index(self) -> int | None:
        """First index of the log if the unstable snapshot defines it."""
        if self.snapshot is not None:
            return self.snapshot.metadata.index + 1
        return None

    def maybe_last_index(self) -> int | None:
        if self.entries:
            return self.offset + len(self.entries) - 1
        if self.snapshot is not None:
            return self.snapshot.metadata.index
        return None

    def maybe_term(self, i: int) -> int | None:
        if i < self.offset:
            if self.snapshot is not None and self.snapshot.metadata.index == i:
                return self.snapshot.metadata.term
            return None
        last = self.maybe_last_index()
        if last is None or i > last:
            return None
        return self.entries[i - self.offset].term

    def stable_to(self, i: int, t: int) -> None:
        """Entries up to ``i`` (with term ``t`` at ``i``) are durable; forget them.

        Ignored if the entry at ``i`` has since been replaced (different term) or is gone.
        """
        gt = self.maybe_term(i)
        if gt is None or gt != t or i < self.offset:
            return
        del self.entries[: i + 1 - self.offset]
        self.offset = i + 1

    def stable_snap_to(self, i: int) -> None:
        if self.snapshot is not None and self.snapshot.metadata.index == i:
            self.snapshot = None

    def restore(self, snap: Snapshot) -> None:
        self.offset = snap.metadata.index + 1
        self.entries = []
        self.snapshot = snap

    def truncate_and_append(self, ents: list[Entry]) -> None:
        """Append ``ents``, first dropping any unstable entries at or after ents[0].index."""
        after = ents[0].index
        if after == self.offset + len(self.entries):
            self.entries.extend(ents)
        elif after <= self.offset:
            # Replaces all unstable entries (and possibly a stored suffix, which the
            # storage truncates itself when these are appended to it).
            self.offset = after
            self.entries = list(ents)
        else:
            del self.entries[after - self.offset :]
            self.entries.extend(ents)

    def slice(self, lo: int, hi: int) -> list[Entry]:
        """Entries lo .. hi-1, which must lie within the unstable entries."""
        upper = self.offset + len(self.entries)
        if lo > hi or lo < self.offset or hi > upper:
            raise RaftInvariantError(
                f"unstable.slice[{lo},{hi}) out of bounds [{self.offset},{upper})"
            )
        return self.entries[lo - self.offset : hi - self.offset]
