"""A ``.snap`` file the member has not recorded in its WAL is not an archived base.

A member writes a snapshot's file first and its WAL snapshot record after (a forked child or
a spawned writer makes the file; the member then records it). A member stopped in between,
or loaded enough that an archive pass falls in between, leaves a file whose record is not in
the archived log; the WAL reader cannot start after a snapshot it has no record of, so a
restore from such a base failed (``SnapshotNotFoundError``). These tests build that state
directly: no member, no timing.
"""

from __future__ import annotations

import uuid

import pytest

import raftpb
import snap
from kvserver.archive import pitr
from kvserver.archive.archiver import snapshot_records, wal_tail
from kvserver.archive.datadir import RestoreTarget
from kvserver.archive.manifest import MANIFEST, Manifest, SnapshotObject
from kvserver.archive.store import ArchiveError, ObjectStore, crc_of
from tests.archive.helpers import append_entries, live_archiver, live_member
from tests.support.apply_now import raftkv_without_raft


def _append(w, first: int, last: int) -> None:
    # entries without a request: a replay applies nothing and only checks their order
    append_entries(w, first, last, b"")


def _image() -> bytes:
    kv = raftkv_without_raft(cluster_id=0xC, member_id=0xA, name="m", members=())
    try:
        return b"".join(kv.snapshot_chunks())
    finally:
        kv.watch_hub.close()


def _snap_file(snaps, index: int) -> None:
    snaps.save_snap(raftpb.Snapshot(_image(), raftpb.SnapshotMetadata(index=index, term=1)))


def _restore(store, tmp_path, name: str, notes: list[str] | None = None):
    target = RestoreTarget(str(tmp_path / name), "solo", "solo=http://127.0.0.1:1")
    progress = notes.append if notes is not None else (lambda _: None)
    return pitr.restore(store, pitr.Point(), target, progress=progress)


@pytest.fixture
def member(tmp_path):
    data_dir, w, snaps = live_member(tmp_path)
    store = ObjectStore.open(f"memory://unrec-{uuid.uuid4().hex}")
    arch = live_archiver(store, data_dir, w)
    arch.open()
    yield w, snaps, store, arch
    w.close()


def test_a_snapshot_file_is_archived_once_its_wal_record_is(member, tmp_path):
    w, snaps, store, arch = member
    _append(w, 1, 50)
    _snap_file(snaps, 50)  # the file is written; the member has not recorded it yet
    arch.run_once()  # an archive pass between the two
    assert arch.manifest.snapshots == []
    r = _restore(store, tmp_path, "early")  # the log alone, from the empty state
    assert (r.index, r.base_index) == (50, 0)
    w.save_snapshot(raftpb.WalSnapshot(50, 1))  # recorded
    _append(w, 51, 60)
    arch.run_once()
    assert [s.index for s in arch.manifest.snapshots] == [50]
    r = _restore(store, tmp_path, "later")
    assert (r.index, r.base_index, r.entries_replayed) == (60, 50, 10)


def test_a_snapshot_never_recorded_is_never_a_base(member, tmp_path):
    """The member stops after the file of its newest snapshot is written, before its record:
    the archive keeps the older snapshot as its newest base, and a restore reaches the end."""
    w, snaps, store, arch = member
    _append(w, 1, 40)
    _snap_file(snaps, 40)
    w.save_snapshot(raftpb.WalSnapshot(40, 1))
    _append(w, 41, 100)
    _snap_file(snaps, 96)  # never recorded
    arch.run_once()
    arch.run_once()  # the last pass at stop
    assert [s.index for s in arch.manifest.snapshots] == [40]
    r = _restore(store, tmp_path, "r")
    assert (r.index, r.base_index, r.entries_replayed) == (100, 40, 60)


def test_a_record_archived_before_its_file_is_listed_is_found(member, tmp_path, monkeypatch):
    """The file appears and is recorded after the pass listed the snapshot directory but
    before it archived the WAL: the part holding the record was not searched as it went
    up, and is searched once the file is seen."""
    w, snaps, store, arch = member
    _append(w, 1, 30)
    arch.run_once()
    tail = arch.tail

    def tail_after_a_snapshot():  # the member snapshots while the pass runs
        if not w.last_index == 31:
            _snap_file(snaps, 30)
            w.save_snapshot(raftpb.WalSnapshot(30, 1))
            _append(w, 31, 31)
        return tail()

    arch.tail = tail_after_a_snapshot
    arch.run_once()
    assert [s.index for s in arch.manifest.snapshots] == [30]
    seg = arch.manifest.segments[-1]
    assert [30, 1] in seg.snapshots
    # and the manifest says so after a reload
    m = Manifest.from_json(store.get(f"{arch.prefix}/{MANIFEST}"), "m")
    assert (30, 1) in m.recorded_snapshots()


def test_restore_skips_a_listed_base_without_a_record(member, tmp_path):
    """An archive written before the archiver waited for records may list a file the member
    never recorded: restore starts from the next older base instead of failing."""
    w, snaps, store, arch = member
    _append(w, 1, 40)
    _snap_file(snaps, 40)
    w.save_snapshot(raftpb.WalSnapshot(40, 1))
    _append(w, 41, 100)
    arch.run_once()
    # what the earlier archiver did: list the unrecorded file at 96
    _snap_file(snaps, 96)
    data = open(f"{snaps.dir_path}/{snap.SnapName(term=1, index=96).file_name}", "rb").read()
    rel = f"snap/{snap.SnapName(term=1, index=96).file_name}"
    store.put(f"{arch.prefix}/{rel}", data)
    m = arch.manifest
    m.snapshots.append(SnapshotObject(rel, 96, 1, 0, len(data), crc_of(data)))
    store.put(f"{arch.prefix}/{MANIFEST}", m.to_json())
    notes: list[str] = []
    r = _restore(store, tmp_path, "r", notes)
    assert (r.index, r.base_index, r.entries_replayed) == (100, 40, 60)
    assert any("no record" in n and "index 96" in n for n in notes), notes


def test_restore_names_a_base_without_record_when_none_older_is_archived(member, tmp_path):
    w, snaps, store, arch = member
    _append(w, 1, 40)
    arch.run_once()
    m = arch.manifest
    m.segments[0].seq = 1  # as if the log's start were gone: no empty-state fallback
    _snap_file(snaps, 40)
    data = open(f"{snaps.dir_path}/{snap.SnapName(term=1, index=40).file_name}", "rb").read()
    rel = f"snap/{snap.SnapName(term=1, index=40).file_name}"
    store.put(f"{arch.prefix}/{rel}", data)
    m.snapshots.append(SnapshotObject(rel, 40, 1, 0, len(data), crc_of(data)))
    store.put(f"{arch.prefix}/{MANIFEST}", m.to_json())
    with pytest.raises(ArchiveError, match="no record of the snapshot at index 40"):
        _restore(store, tmp_path, "r")


def test_snapshot_records_walks_frames_and_decodes_only_snapshots(tmp_path):
    data_dir, w, _ = live_member(tmp_path)
    _append(w, 1, 20)
    w.save_snapshot(raftpb.WalSnapshot(20, 1))
    _append(w, 21, 30)
    w.save_snapshot(raftpb.WalSnapshot(30, 2))
    path, end, _, _ = wal_tail(w)
    w.close()
    data = open(path, "rb").read()[:end]
    assert snapshot_records(data) == [(0, 0), (20, 1), (30, 2)]
    assert snapshot_records(data[: end - 3]) == [(0, 0), (20, 1)]  # a torn last frame
