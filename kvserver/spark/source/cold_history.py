"""The changefeed's cold tier: a range's events below the store's compact revision, rebuilt
from the continuous archive (``raftkv serve --archive-url``; ``kvserver.archive``).

The store answers a watch only from its compact revision on. The archive holds, per member,
snapshot files (the state at an index, with the store's revision at that index in the
manifest) and every WAL segment. Replaying the archived, committed entries after a snapshot
with the rules of the members' state machine gives the same revisions and the same events,
with ``create_revision``, ``version``, ``lease`` and ``prev_kv``, as the store gave its
watchers when it applied them.

The replay (``ColdReplay``) is the members' own state machine: ``RaftKV`` (its entry
dispatch, alarms, auth and lessor, restored from the snapshot as a member restores them) over
an ``MVCCStore`` that keeps no history (``keep_history=False``): each key's current record,
every write applied by the store's own code, so the rules for revisions, checks, compares,
leases, compactions and retries exist in one place and the changefeed cannot come to
disagree with the store it describes. ``tests/changefeed`` checks the replay against a
member's ``RaftKV`` with a whole ``MVCCStore``, entry by entry, over random logs.

Driver side (``ArchiveView``, from the manifests only, nothing decoded):

* ``oldest``: the first revision whose events the archive can rebuild: 1 when a member's
  log is archived from its first segment, else its oldest archived snapshot's revision + 1;
* ``check_covers(first, compact)``: raises ``ColdGapError`` naming both revisions when
  ``first`` is older than that (neither the store nor the archive has it);
* ``reaches(index)``: whether the chosen member's archived commit index has reached
  ``index`` (the driver asks for the raft index it saw together with the compact revision, so
  every revision up to the compact revision is archived before a batch is planned on it);
* ``snapshot_revisions``: where a batch may end so that the next one starts at a snapshot
  (no replay wasted before its start).

Executor side (``cold_events``): download the newest archived snapshot at or below the
batch's start (or start from the empty state when the log is archived from its beginning)
and the WAL segments from the one holding it on, each object checked against the
manifest's size and CRC-32C; replay the committed entries until the revision reaches the
batch's end; keep the events of the key range with ``start < revision <= end`` in the
order the state machine produced them. If the archived log ends first, ``ColdGapError``
names the revision reached and the one needed.

This module loads the server's state machine and the archive reader; it is imported only
where a cold batch is planned or read, never by the client-side modules of the source.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from dataclasses import dataclass

import wal
from kvserver.archive.manifest import Manifest, SnapshotObject
from kvserver.archive.pitr import (
    ReplayOnly,
    choose_member,
    fetch_segments,
    load_manifests,
    restore_base,
)
from kvserver.archive.store import ObjectStore
from kvserver.archive.store import parse_options as storage_options
from kvserver.auth.store import split_auth_frame
from kvserver.kvpb.kv import Event
from kvserver.lease.snapshot import split_snapshot
from kvserver.mvcc.store import MVCCStore
from kvserver.server.alarms import AlarmStore, split_alarm_frame
from kvserver.server.node import PROPOSAL_HEADER_BYTES, ApplyInSteps
from kvserver.server.replicated_kv import RaftKV
from kvserver.spark.source.store import CompactedRevisionError
from raft import EntryType


class ColdGapError(CompactedRevisionError):
    """History the changefeed needs is in neither the store nor the archive (the message
    names the revisions)."""

    def __init__(self, message: str, revision: int = 0, compact_revision: int = 0) -> None:
        RuntimeError.__init__(self, message)  # one argument: it pickles to the executors
        self.revision = revision
        self.compact_revision = compact_revision


def open_archive(url: str, options: tuple[str, ...]) -> ObjectStore:
    return ObjectStore.open(url, storage_options(list(options)))


@dataclass(frozen=True)
class ArchiveView:
    url: str
    manifest: Manifest

    @classmethod
    def load(cls, url: str, options: tuple[str, ...], member_id: int | None = None):
        manifests = load_manifests(open_archive(url, options))
        if member_id is not None:
            for m in manifests:
                if m.member_id == member_id:
                    return cls(url, m)
            raise ColdGapError(
                f"raftkv changefeed: the archive {url} no longer holds the manifest of "
                f"member {member_id:x}"
            )
        return cls(url, choose_member(manifests, None))

    @property
    def member_id(self) -> int:
        return self.manifest.member_id

    @property
    def oldest(self) -> int:
        m = self.manifest
        if m.segments and m.segments[0].seq == 0:
            return 1
        if m.snapshots:
            return min(s.revision for s in m.snapshots) + 1
        return 1 << 62  # nothing usable archived yet

    def snapshot_revisions(self) -> list[int]:
        return sorted(s.revision for s in self.manifest.snapshots)

    def reaches(self, index: int) -> bool:
        return self.manifest.commit >= index

    def check_covers(self, first: int, compact: int) -> None:
        if first >= self.oldest:
            return
        oldest = self.oldest
        has = f"from revision {oldest}" if oldest < (1 << 62) else "nothing usable yet"
        resume = min(oldest, compact) if compact else oldest
        raise ColdGapError(
            f"raftkv changefeed: revision {first} is needed, but the store has compacted "
            f"its history below revision {compact} and the archive {self.url} (member "
            f"{self.member_id:x}) holds history {has}: revisions {first}..{resume - 1} are "
            f"in neither; restart from revision {resume} or later",
            first,
            compact,
        )


class _Capture:
    """Stands for the watch hub of a replayed state machine: keeps the events of the key
    range it is handed with ``first <= revision <= last``, in the order they were applied."""

    def __init__(self, key: bytes, range_end: bytes, first: int, last: int) -> None:
        self.key = key
        self.range_end = range_end
        self.first = first
        self.last = last
        self.events: list[Event] = []

    def matches(self, k: bytes) -> bool:
        if self.range_end == b"":
            return k == self.key
        if self.range_end == b"\0":
            return k >= self.key
        return self.key <= k < self.range_end

    def notify(self, revision: int, events) -> None:
        if self.first <= revision <= self.last:
            matches = self.matches
            self.events.extend(ev for ev in events if matches(ev.kv.key))

    def reset(self, store) -> None:
        return None

    def close(self) -> None:
        return None


class ColdReplay:
    """A replayed member: ``RaftKV`` (alarms, auth, the lessor, the entry dispatch) over an
    ``MVCCStore`` without history; keeps the events of the key range ``[key, range_end)``
    with ``first <= revision <= last`` (``events``)."""

    def __init__(
        self,
        key: bytes,
        range_end: bytes,
        first: int,
        last: int,
        *,
        cluster_id: int = 0,
        member_id: int = 0,
        name: str = "",
    ) -> None:
        self.capture = _Capture(key, range_end, first, last)
        kv = RaftKV(
            cluster_id=cluster_id,
            member_id=member_id,
            name=name,
            members=(),
            node=ReplayOnly(),  # type: ignore[arg-type]
            membership=None,
        )
        kv.watch_hub.close()
        kv.watch_hub = self.capture  # type: ignore[assignment]
        self.kv = kv
        self._install(MVCCStore(keep_history=False))

    def _install(self, store: MVCCStore) -> None:
        self.store = store
        self.kv.store = store
        self.kv.lessor.bind(store)

    @property
    def revision(self) -> int:
        return self.store.revision

    @property
    def events(self) -> list[Event]:
        return self.capture.events

    def restore(self, data: bytes | memoryview) -> None:
        """A snapshot image, as ``RaftKV.restore`` takes it: RaftKV's own parts (alarms,
        auth, the lease table) restored as there, the store's part without its history."""
        alarm_blob, after_alarms = split_alarm_frame(data)
        auth_blob, after_auth = split_auth_frame(after_alarms)
        lease_blob, rest = split_snapshot(after_auth)
        kv = self.kv
        kv.alarms = AlarmStore.restore(alarm_blob)
        kv.auth.restore(auth_blob)
        kv.lessor.restore(lease_blob)
        view = memoryview(rest)
        step = 1 << 20  # copied a MiB at a time, as a member's restore does
        chunks = (bytes(view[i : i + step]) for i in range(0, len(view), step))
        self._install(MVCCStore.restore(chunks, keep_history=False))

    def apply(self, index: int, payload: bytes) -> None:
        """One committed entry's payload (the proposal header removed), applied as a member
        applies it."""
        result = self.kv.apply(index, payload)
        if type(result) is ApplyInSteps:
            result.run_now()


def _base(m: Manifest, start: int) -> SnapshotObject | None:
    fits = [s for s in m.snapshots if s.revision <= start]
    if fits:
        return max(fits, key=lambda s: s.index)
    if m.segments and m.segments[0].seq == 0:
        return None
    raise ColdGapError(
        f"raftkv changefeed: revision {start + 1} is needed, but the archive of member "
        f"{m.member_id:x} has no snapshot at or below revision {start} and its log is not "
        f"archived from the beginning",
        start + 1,
    )


def cold_events(
    url: str,
    options: tuple[str, ...],
    member_id: int,
    start: int,
    end: int,
    key: bytes,
    range_end: bytes,
) -> list[Event]:
    """The events of ``[key, range_end)`` with ``start < revision <= end``, rebuilt from the
    archive of member ``member_id`` (see the module docstring)."""
    store = open_archive(url, options)
    view = ArchiveView.load(url, options, member_id)
    m = view.manifest
    base = _base(m, start)
    replay = ColdReplay(
        key,
        range_end,
        start + 1,
        end,
        cluster_id=m.cluster_id,
        member_id=m.member_id,
        name=m.name,
    )
    work = tempfile.mkdtemp(prefix="raftkv-changefeed-")
    was_enabled = gc.isenabled()
    gc.disable()  # millions of acyclic objects: a collection would walk them again and again
    try:
        ws = restore_base(store, m, base, replay, work)  # type: ignore[arg-type]
        wal_dir = os.path.join(work, "wal")
        fetch_segments(store, m, ws.index, wal_dir, lambda _: None)
        w = wal.open_for_read(wal_dir, ws)
        try:
            _, hs, entries = w.read_all()
        finally:
            w.close()
        applied = ws.index
        for e in entries:
            if replay.revision >= end or e.index > hs.commit:
                break
            if e.index != applied + 1:
                raise ColdGapError(
                    f"raftkv changefeed: the archived log of member {m.member_id:x} "
                    f"jumps from index {applied} to {e.index}: no snapshot covers the gap",
                    start + 1,
                )
            applied = e.index
            if e.type != EntryType.NORMAL or not e.data or len(e.data) <= PROPOSAL_HEADER_BYTES:
                continue
            replay.apply(e.index, bytes(e.data[PROPOSAL_HEADER_BYTES:]))
        if replay.revision < end:
            raise ColdGapError(
                f"raftkv changefeed: the batch of revisions {start + 1}..{end} needs the "
                f"archive to reach revision {end}, but the archive {url} of member "
                f"{m.member_id:x} reaches revision {replay.revision} (commit index "
                f"{min(applied, hs.commit)})",
                end,
            )
        return replay.events
    finally:
        if was_enabled:
            gc.enable()
        shutil.rmtree(work, ignore_errors=True)
