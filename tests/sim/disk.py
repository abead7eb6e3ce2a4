"""A node's disk: a durable part and a volatile (written, not yet synced) part.

Contract (the model of a WAL + snapshot directory under power loss):
- ``write_snapshot`` / ``write_entries`` / ``write_hard_state`` append an operation to the
  volatile tail, in the order the driver persisted them.
- ``sync()`` makes every operation written so far durable (an fsync covers all earlier writes).
  The driver calls it after persisting a Ready with ``must_sync=True``, and the application
  calls ``save_app_snapshot`` which syncs too (etcd's ``WAL.SaveSnapshot`` fsyncs).
- ``crash(rng)`` throws the volatile tail away. With ``torn=True`` a random prefix of the
  tail survives instead (an append-only log may keep some unsynced writes, always a prefix).
- ``durable_*`` is what a restarted node sees: the newest durable snapshot, the last durable
  hard state, and the durable entries after the snapshot index.

Entry semantics equal ``MemoryStorage``'s: appending at index i drops every entry >= i first;
a snapshot received from the leader replaces the whole log (the node restores it because its
log does not contain the snapshot's last entry); the application's own snapshot only drops
the entries it covers.
"""

from __future__ import annotations

import random
from enum import IntEnum

from raft import Entry, HardState, Snapshot


class DiskError(AssertionError):
    """The driver asked for something impossible (a gap in the persisted log)."""


class _Op(IntEnum):
    SNAPSHOT = 0
    ENTRIES = 1
    HARD_STATE = 2


class Disk:
    __slots__ = ("entries", "hard_state", "pending", "snapshot", "syncs", "torn")

    def __init__(self, torn: bool = False) -> None:
        self.snapshot: Snapshot | None = None
        self.hard_state: HardState | None = None
        self.entries: list[Entry] = []  # invariant: contiguous indexes
        self.pending: list[tuple[_Op, object]] = []
        self.torn = torn
        self.syncs = 0

    # -- writes -------------------------------------------------------------------------
    def write_snapshot(self, snap: Snapshot) -> None:
        self.pending.append((_Op.SNAPSHOT, snap))

    def write_entries(self, entries: tuple[Entry, ...] | list[Entry]) -> None:
        if entries:
            self.pending.append((_Op.ENTRIES, tuple(entries)))

    def write_hard_state(self, hs: HardState) -> None:
        self.pending.append((_Op.HARD_STATE, hs))

    def sync(self) -> None:
        self.syncs += 1
        for op, arg in self.pending:
            self._apply(op, arg)
        self.pending.clear()

    def save_app_snapshot(self, snap: Snapshot) -> None:
        """Durably record the application's snapshot (syncs everything written before)."""
        self.sync()
        self.snapshot = snap
        idx = snap.metadata.index
        self.entries = [e for e in self.entries if e.index > idx]

    def crash(self, rng: random.Random) -> None:
        if self.torn and self.pending:
            keep = rng.randrange(len(self.pending) + 1)
            for op, arg in self.pending[:keep]:
                self._apply(op, arg)
        self.pending.clear()

    # -- reading back -------------------------------------------------------------------
    def durable_last_index(self) -> int:
        if self.entries:
            return self.entries[-1].index
        return self.snapshot.metadata.index if self.snapshot is not None else 0

    def is_empty(self) -> bool:
        return self.snapshot is None and self.hard_state is None and not self.entries

    def _apply(self, op: _Op, arg) -> None:
        if op is _Op.ENTRIES:
            first = arg[0].index
            if self.entries:
                start = self.entries[0].index
                if first > self.entries[-1].index + 1:
                    raise DiskError(f"gap: persisting {first} after {self.entries[-1].index}")
                if first <= start:
                    self.entries = list(arg)
                else:
                    del self.entries[first - start :]
                    self.entries.extend(arg)
            else:
                snap_idx = self.snapshot.metadata.index if self.snapshot else 0
                if first > snap_idx + 1:
                    raise DiskError(f"gap: persisting {first} after snapshot {snap_idx}")
                self.entries = list(arg)
        elif op is _Op.HARD_STATE:
            self.hard_state = arg
        else:
            self.snapshot = arg
            self.entries = []
