"""Archive pieces without processes: the backup file's hash, atomic puts, resuming an
interrupted upload, and corrupt/missing objects reported by name."""

from __future__ import annotations

import io
import uuid

import pytest

import raftpb
import wal
from kvserver.archive import snapfile
from kvserver.archive.archiver import Archiver, wal_tail
from kvserver.archive.manifest import MANIFEST, Manifest
from kvserver.archive.store import ObjectCorruptError, ObjectMissingError, ObjectStore
from kvserver.membership.identity import encode_metadata
from tests.archive.helpers import append_entries, live_archiver, live_member


def test_snapshot_file_round_trip_and_hash_refusal():
    data = b"".join(snapfile.encode({"revision": 7, "keys": 2}, [b"abc", b"", b"defg"]))
    image = bytearray()
    info = snapfile.read(io.BytesIO(data), "f", on_image=image.extend)
    assert (info.revision, info.keys, bytes(image), info.size_bytes) == (
        7,
        2,
        b"abcdefg",
        len(data),
    )
    bad = bytearray(data)
    bad[-33] ^= 1  # the last image byte
    with pytest.raises(snapfile.SnapshotFileError, match="hash mismatch"):
        snapfile.read(io.BytesIO(bytes(bad)), "f")
    with pytest.raises(snapfile.SnapshotFileError, match="truncated"):
        snapfile.read(io.BytesIO(data[:14]), "f")
    with pytest.raises(snapfile.SnapshotFileError, match="magic"):
        snapfile.read(io.BytesIO(b"x" * 100), "f")


def _member_dir(tmp_path, entries: int):
    """A data dir whose WAL holds ``entries`` committed entries (no running member)."""
    data_dir = tmp_path / "m"
    (data_dir / "member").mkdir(parents=True)
    w = wal.create(
        str(data_dir / "member" / "wal"), encode_metadata(0xA, 0xC), segment_size_bytes=64 * 1024
    )
    for i in range(1, entries + 1):
        w.save(raftpb.HardState(1, 0, i), [raftpb.Entry(1, i, 0, b"x" * 300)])
    w.close()
    return str(data_dir)


class FlakyFS:
    """Wraps an fsspec filesystem; ``fail_mv`` moves fail (after the temp object is up)."""

    def __init__(self, fs, fail_mv: int):
        self._fs = fs
        self.fail_mv = fail_mv

    def mv(self, *a, **kw):
        if self.fail_mv:
            self.fail_mv -= 1
            raise OSError("injected: connection reset during upload")
        return self._fs.mv(*a, **kw)

    def __getattr__(self, name):
        return getattr(self._fs, name)


def test_interrupted_upload_resumes_without_reuploading(tmp_path):
    data_dir = _member_dir(tmp_path, 600)  # several 64 KiB segments
    url = f"memory://arch-{uuid.uuid4().hex}"
    store = ObjectStore.open(url)
    flaky = ObjectStore(FlakyFS(store.fs, fail_mv=3), store.root, url)
    arch = Archiver(flaky, data_dir, cluster_id=0xC, member_id=0xA)
    arch.open()
    failures = 0
    for _ in range(10):
        try:
            arch.run_once()
            break
        except OSError:
            failures += 1
            # a failed pass leaves a manifest naming only complete objects (or none)
            if store.exists(f"{arch.prefix}/{MANIFEST}"):
                m = Manifest.from_json(store.get(f"{arch.prefix}/{MANIFEST}"), "m")
                for obj in m.objects():
                    assert store.exists(f"{arch.prefix}/{obj}")
    assert failures == 3
    first = dict(arch.stats)
    # a restart (new archiver on the same archive) finds everything archived: no upload
    again = Archiver(store, data_dir, cluster_id=0xC, member_id=0xA)
    again.open()
    assert not again.run_once()
    assert again.stats["uploaded_bytes"] == 0
    m = again.manifest
    assert m.last_index == 600 and m.commit == 600
    assert [s.seq for s in m.segments] == list(range(len(m.segments))) and len(m.segments) > 2
    # every uploaded byte is in exactly one object
    assert first["uploaded_bytes"] == sum(s.size for s in m.segments)
    # no temporary objects are left behind
    assert not [n for n in store.list(arch.prefix) if ".tmp-" in n]


def test_corrupt_and_missing_objects_are_named(tmp_path):
    store = ObjectStore.open(f"memory://arch-{uuid.uuid4().hex}")
    store.put("a/b.obj", b"hello")
    assert store.get_verified("a/b.obj", 5, store_crc(b"hello")) == b"hello"
    store.put("a/b.obj", b"hellp")
    with pytest.raises(ObjectCorruptError, match="a/b.obj"):
        store.get_verified("a/b.obj", 5, store_crc(b"hello"))
    with pytest.raises(ObjectMissingError, match="a/c.obj"):
        store.get_verified("a/c.obj", 5, 0)


def store_crc(data: bytes) -> int:
    from kvserver.archive.store import crc_of

    return crc_of(data)


def test_retention_drops_old_snapshots_and_the_segments_before_them(tmp_path, monkeypatch):
    from kvserver.archive import archiver as archiver_mod

    # the snapshot images here are not a member's state: their revision is their index
    monkeypatch.setattr(archiver_mod, "snapshot_revision", lambda s: s.metadata.index)
    data_dir, w, snaps = live_member(tmp_path)
    store = ObjectStore.open(f"memory://ret-{uuid.uuid4().hex}")
    arch = live_archiver(store, data_dir, w, retention=2)
    try:
        arch.open()
        written = 0
        for index in (100, 400, 700):  # a snapshot as a member makes one: file, then record
            append_entries(w, written + 1, index)
            written = index
            snaps.save_snap(raftpb.Snapshot(b"img", raftpb.SnapshotMetadata(index=index, term=1)))
            w.save_snapshot(raftpb.WalSnapshot(index, 1))
            arch.run_once()
        append_entries(w, 701, 900)  # many 64 KiB segments
        arch.run_once()
    finally:
        w.close()
    m = arch.manifest
    assert [s.index for s in m.snapshots] == [400, 700]
    # segments from the one that may hold index 400 on: the earlier ones are gone
    assert m.segments[0].first_index <= 400 < m.segments[1].first_index
    assert m.segments[0].seq > 0
    names = set(store.list(arch.prefix))
    assert names == {f"{arch.prefix}/{o}" for o in m.objects()} | {f"{arch.prefix}/{MANIFEST}"}


def test_lag_seconds_is_the_age_of_the_oldest_unarchived_write(tmp_path, monkeypatch):
    """Under a steady load the archive is never fully caught up (writes arrive during every
    pass); its lag in seconds must still be about one pass interval (the age of the oldest
    write not archived), not the time since it was last fully idle."""
    data_dir = _member_dir(tmp_path, 50)
    w = wal.open(f"{data_dir}/member/wal", raftpb.WalSnapshot(0, 0))
    w.read_all()
    clock = [1000.0]
    monkeypatch.setattr("kvserver.archive.archiver.time.monotonic", lambda: clock[0])
    arch = Archiver(
        ObjectStore.open(f"memory://lag-{uuid.uuid4().hex}"),
        data_dir,
        cluster_id=0xC,
        member_id=0xA,
        last_index=lambda: w.last_index,
        tail=lambda: wal_tail(w),
    )  # as `raftkv serve` wires it
    try:
        arch.open()
        arch.run_once()
        assert arch.lag() == (0, 0.0)
        index = 50
        for t in range(1, 31):  # a pass every second; 10 more entries during each pass
            clock[0] = 1000.0 + t
            index += 10
            w.save(
                raftpb.HardState(1, 0, index),
                [raftpb.Entry(1, i, 0, b"y" * 100) for i in range(index - 9, index + 1)],
            )
            arch.run_once()  # archives everything written before it started...
            index += 10  # ...while 10 more arrive
            w.save(
                raftpb.HardState(1, 0, index),
                [raftpb.Entry(1, i, 0, b"y" * 100) for i in range(index - 9, index + 1)],
            )
            clock[0] += 0.5
            entries, seconds = arch.lag()
            assert entries == 10 and seconds == pytest.approx(0.5), (t, entries, seconds)
        clock[0] += 100  # no pass for 100 s: the oldest unarchived write ages
        assert arch.lag() == (10, pytest.approx(100.5))
    finally:
        w.close()
