"""Snapshotter behaviour, after etcd's snap package.

* the newest snapshot the WAL knows about is loaded; one without a WAL snapshot record (saved
  just before a crash) is skipped, not used and not touched;
* a corrupt file (CRC mismatch, truncated, empty, name disagreeing with content) is renamed
  *.snap.broken and the next older one is used, as etcd's loadSnap does;
* errors that say nothing about the bytes (I/O, size limit) propagate and touch nothing;
* purge keeps the newest N and never the newest one; temp files are never snapshots.
"""

import mmap
import os
import threading

import pytest

import raftpb
from snap import (
    CorruptSnapshotError,
    CRCMismatchError,
    EmptySnapshotError,
    NameMismatchError,
    NoSnapshotError,
    SnapshotDecodeError,
    Snapshotter,
    SnapshotTooLargeError,
    read_snap,
    snapshotter,
)
from tests.snap.helpers import make_snapshot


def wal_records(*index_terms: tuple[int, int]) -> list[raftpb.WalSnapshot]:
    return [raftpb.WalSnapshot(index=i, term=t) for i, t in index_terms]


def _flip_bit(path: str, byte_offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(byte_offset)
        b = f.read(1)[0]
        f.seek(byte_offset)
        f.write(bytes((b ^ (1 << bit),)))


def _truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


@pytest.fixture
def snapper(tmp_path) -> Snapshotter:
    return Snapshotter(tmp_path / "snap")


# --- round trips ---------------------------------------------------------------------------


def test_save_then_load_round_trips(snapper):
    snapshot = make_snapshot(index=42, term=3, voters=(1, 2, 3))
    snapper.save_snap(snapshot)
    assert snapper.load() == snapshot
    assert snapper.load_newest_available(wal_records((42, 3))) == snapshot
    # a reopened Snapshotter sees the same
    assert Snapshotter(snapper.dir_path).load() == snapshot


def test_directory_is_created_when_missing(tmp_path):
    d = tmp_path / "a" / "b"
    Snapshotter(d).save_snap(make_snapshot(index=1))
    assert os.listdir(d) == ["0000000000000001-0000000000000001.snap"]


def test_a_file_in_place_of_the_directory_is_an_error(tmp_path):
    (tmp_path / "snap").write_bytes(b"")
    with pytest.raises(FileExistsError):
        Snapshotter(tmp_path / "snap")


def test_empty_snapshot_is_not_saved(snapper):
    """etcd's SaveSnap returns early for raft.IsEmptySnap (metadata index 0)."""
    assert snapper.save_snap(raftpb.Snapshot(data=b"x")) is None
    assert os.listdir(snapper.dir_path) == []
    with pytest.raises(NoSnapshotError):
        snapper.load()


def test_saving_the_same_name_again_replaces_the_file(snapper):
    snapper.save_snap(make_snapshot(index=5, data=b"first"))
    snapper.save_snap(make_snapshot(index=5, data=b"second"))
    assert snapper.snap_names() == ["0000000000000001-0000000000000005.snap"]
    assert snapper.load().data == b"second"


def test_index_and_term_must_be_uint64(snapper):
    with pytest.raises(ValueError):
        snapper.save_snap(make_snapshot(index=1 << 64))
    with pytest.raises(ValueError):
        snapper.save_snap(make_snapshot(index=1, term=-1))
    assert os.listdir(snapper.dir_path) == []
    big = make_snapshot(index=(1 << 64) - 1, term=(1 << 64) - 1)
    snapper.save_snap(big)
    assert snapper.snap_names() == ["ffffffffffffffff-ffffffffffffffff.snap"]
    assert snapper.load() == big


def test_concurrent_saves_from_threads_all_land_intact(snapper):
    snapshots = [make_snapshot(index=i, data=os.urandom(50_000)) for i in range(1, 17)]
    threads = [threading.Thread(target=snapper.save_snap, args=(s,)) for s in snapshots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(snapper.snap_names()) == 16
    for s in snapshots:
        name = f"{s.metadata.term:016x}-{s.metadata.index:016x}.snap"
        assert read_snap(os.path.join(snapper.dir_path, name)) == s


# --- names ---------------------------------------------------------------------------------


def test_snap_names_are_newest_first_and_ignore_other_files(snapper):
    for term, index in [(1, 5), (2, 3), (1, 20), (2, 10)]:
        snapper.save_snap(make_snapshot(index=index, term=term))
    d = snapper.dir_path
    for other in [
        "db",
        "notes.txt",
        "x.snap",
        "0000000000000009-000000000000000A.snap",
        "0000000000000009-0000000000000009.snap.broken",
        "00000009-00000009.snap",
        "0000000000000009-0000000000000009.snap.orig",
    ]:
        with open(os.path.join(d, other), "wb") as f:
            f.write(b"not a snapshot")
    before = sorted(os.listdir(d))
    assert snapper.snap_names() == [
        "0000000000000002-000000000000000a.snap",
        "0000000000000002-0000000000000003.snap",
        "0000000000000001-0000000000000014.snap",
        "0000000000000001-0000000000000005.snap",
    ]
    assert snapper.load().metadata.index == 10
    assert sorted(os.listdir(d)) == before  # the junk was never read, nothing renamed


# --- matching the WAL ----------------------------------------------------------------------


def test_snapshot_without_a_wal_record_is_skipped_and_left_alone(snapper):
    """A crash after save_snap but before the WAL snapshot record leaves a newer file that the
    WAL does not know: the loader must use the older one and not quarantine the newer."""
    older, newer = make_snapshot(index=10, term=2), make_snapshot(index=20, term=2)
    snapper.save_snap(older)
    snapper.save_snap(newer)
    assert snapper.load_newest_available(wal_records((0, 0), (10, 2))) == older
    assert snapper.snap_names() == [
        "0000000000000002-0000000000000014.snap",
        "0000000000000002-000000000000000a.snap",
    ]
    assert snapper.load() == newer


def test_match_needs_both_index_and_term(snapper):
    snapper.save_snap(make_snapshot(index=10, term=2))
    with pytest.raises(NoSnapshotError, match="none of 1 .snap file"):
        snapper.load_newest_available(wal_records((10, 3), (11, 2)))


def test_no_snapshot_errors(snapper):
    with pytest.raises(NoSnapshotError, match="no .snap files"):
        snapper.load_newest_available(wal_records((0, 0)))
    with pytest.raises(NoSnapshotError):
        snapper.load_newest_available([])


# --- corruption: quarantine and fall back --------------------------------------------------


def _two_snapshots(snapper):
    older, newer = make_snapshot(index=10, term=1), make_snapshot(index=20, term=1)
    snapper.save_snap(older)
    newer_path = snapper.save_snap(newer)
    return older, newer_path


def test_crc_mismatch_renames_to_broken_and_uses_the_older(snapper):
    older, newer_path = _two_snapshots(snapper)
    size = os.path.getsize(newer_path)
    _flip_bit(newer_path, size - 30)  # inside the payload: only the CRC can notice
    with pytest.raises(CRCMismatchError):
        read_snap(newer_path)
    assert snapper.load_newest_available(wal_records((10, 1), (20, 1))) == older
    assert not os.path.exists(newer_path)
    assert os.path.exists(newer_path + ".broken")
    assert snapper.snap_names() == ["0000000000000001-000000000000000a.snap"]


def test_truncated_file_renames_to_broken_and_uses_the_older(snapper):
    older, newer_path = _two_snapshots(snapper)
    _truncate(newer_path, os.path.getsize(newer_path) - 1)
    with pytest.raises(SnapshotDecodeError):
        read_snap(newer_path)
    assert snapper.load() == older
    assert os.path.exists(newer_path + ".broken")


@pytest.mark.parametrize(
    "content", [b"", bytes.fromhex("08001200")], ids=["zero-length", "no-raft-bytes"]
)
def test_empty_file_or_empty_record_is_broken(snapper, content):
    older, newer_path = _two_snapshots(snapper)
    with open(newer_path, "wb") as f:
        f.write(content)
    with pytest.raises(EmptySnapshotError):
        read_snap(newer_path)
    assert snapper.load() == older
    assert os.path.exists(newer_path + ".broken")


def test_file_whose_name_disagrees_with_its_metadata_is_broken(snapper):
    """Matching against the WAL goes by name, so a renamed/copied file must not pass."""
    older, newer_path = _two_snapshots(snapper)
    impostor = os.path.join(snapper.dir_path, "0000000000000001-0000000000000063.snap")
    with open(newer_path, "rb") as src, open(impostor, "wb") as dst:
        dst.write(src.read())
    with pytest.raises(NameMismatchError):
        read_snap(impostor)
    assert snapper.load_newest_available(wal_records((99, 1), (20, 1))).metadata.index == 20
    assert os.path.exists(impostor + ".broken")


def test_all_broken_raises_no_snapshot_naming_the_quarantined_files(snapper):
    paths = [snapper.save_snap(make_snapshot(index=i)) for i in (1, 2)]
    for p in paths:
        _truncate(p, 5)
    with pytest.raises(NoSnapshotError) as info:
        snapper.load()
    assert sorted(info.value.broken) == sorted(p + ".broken" for p in paths)
    assert "corrupt" in str(info.value)


def test_every_truncation_is_detected(tmp_path):
    """Cutting the file at any byte offset never yields a snapshot."""
    path = Snapshotter(tmp_path).save_snap(make_snapshot(index=3, data=b"0123456789" * 5))
    with open(path, "rb") as f:
        content = f.read()
    for cut in range(len(content)):
        with open(path, "wb") as f:
            f.write(content[:cut])
        with pytest.raises(CorruptSnapshotError):
            read_snap(path)


def test_every_single_bit_flip_is_detected(tmp_path):
    """CRC-32C catches every flip inside the raft bytes; a flip in the snappb header breaks
    its structure or the stored CRC. Either way: a typed error, never a wrong snapshot."""
    path = Snapshotter(tmp_path).save_snap(make_snapshot(index=3, data=b"0123456789" * 5))
    with open(path, "rb") as f:
        content = f.read()
    for offset in range(len(content)):
        for bit in range(8):
            mutated = bytearray(content)
            mutated[offset] ^= 1 << bit
            with open(path, "wb") as f:
                f.write(mutated)
            with pytest.raises(CorruptSnapshotError):
                read_snap(path)


# --- errors that are not about the bytes ---------------------------------------------------


def test_unreadable_entry_propagates_and_is_not_quarantined(snapper):
    """An I/O error says nothing about the snapshot's bytes: refuse loudly, rename nothing
    (here a directory in place of the newest file stands for an unreadable file)."""
    older = make_snapshot(index=10)
    snapper.save_snap(older)
    blocker = os.path.join(snapper.dir_path, "0000000000000001-0000000000000014.snap")
    os.mkdir(blocker)
    with pytest.raises(OSError):
        snapper.load()
    assert os.path.isdir(blocker)
    assert not any(n.endswith(".broken") for n in os.listdir(snapper.dir_path))


def test_size_limit_refuses_without_quarantine(tmp_path):
    big = make_snapshot(index=2, data=b"x" * 500)
    Snapshotter(tmp_path).save_snap(big)
    small_limit = Snapshotter(tmp_path, max_snapshot_bytes=100)
    with pytest.raises(SnapshotTooLargeError):
        small_limit.load()
    assert small_limit.snap_names() == ["0000000000000001-0000000000000002.snap"]
    with pytest.raises(SnapshotTooLargeError):
        small_limit.save_snap(make_snapshot(index=3, data=b"y" * 500))
    assert small_limit.snap_names() == ["0000000000000001-0000000000000002.snap"]
    with pytest.raises(ValueError):
        Snapshotter(tmp_path, max_snapshot_bytes=0)


# --- failed saves --------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["fsync", "replace", "write"])
def test_failed_save_leaves_no_file_and_no_temp(snapper, monkeypatch, step):
    older = make_snapshot(index=10)
    snapper.save_snap(older)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(
        f"snap.snapshotter.os.{step}" if step != "write" else "snap.codec.os.write", fail
    )
    with pytest.raises(OSError, match="injected"):
        snapper.save_snap(make_snapshot(index=20))
    monkeypatch.undo()
    assert sorted(os.listdir(snapper.dir_path)) == ["0000000000000001-000000000000000a.snap"]
    assert snapper.load() == older


# --- temp files and purge ------------------------------------------------------------------


def test_opening_removes_only_our_temp_leftovers(snapper):
    d = snapper.dir_path
    snapper.save_snap(make_snapshot(index=1))
    ours = "0000000000000001-0000000000000002.snap.tmp"
    theirs = ["db.tmp", "foo.tmp", "0000000000000001-0000000000000002.tmp"]
    for name in [ours, *theirs]:
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"partial")
    assert snapper.snap_names() == ["0000000000000001-0000000000000001.snap"]
    Snapshotter(d)
    assert sorted(os.listdir(d)) == sorted(["0000000000000001-0000000000000001.snap", *theirs])


def test_purge_keeps_the_newest_n(snapper):
    for i in range(1, 8):
        snapper.save_snap(make_snapshot(index=i))
    removed = snapper.purge(keep=3)
    assert removed == [f"0000000000000001-{i:016x}.snap" for i in (1, 2, 3, 4)]
    assert snapper.snap_names() == [f"0000000000000001-{i:016x}.snap" for i in (7, 6, 5)]
    assert snapper.purge(keep=3) == []
    assert snapper.purge(keep=1) == [f"0000000000000001-{i:016x}.snap" for i in (5, 6)]
    assert snapper.load().metadata.index == 7


def _truncations(monkeypatch, fail_after: int | None = None) -> list[int]:
    """Record the sizes ``os.ftruncate`` is called with; raise after ``fail_after`` calls."""
    sizes: list[int] = []
    real = os.ftruncate

    def recording(fd, size):
        if fail_after is not None and len(sizes) >= fail_after:
            raise OSError("injected: the process died here")
        sizes.append(size)
        real(fd, size)

    monkeypatch.setattr(os, "ftruncate", recording)
    return sizes


def test_a_big_file_is_purged_a_step_at_a_time(snapper, monkeypatch):
    for i in (1, 2):
        snapper.save_snap(make_snapshot(index=i, data=os.urandom(10_000)))
    path = os.path.join(snapper.dir_path, "0000000000000001-0000000000000001.snap")
    size = os.path.getsize(path)
    sizes = _truncations(monkeypatch)
    monkeypatch.setattr(snapshotter, "REMOVE_STEP_BYTES", 4096)
    monkeypatch.setattr(snapshotter, "REMOVE_PAUSE_S", 0.0)
    assert snapper.purge(keep=1) == ["0000000000000001-0000000000000001.snap"]
    assert sizes == [max(0, size - 4096 * k) for k in range(1, -(-size // 4096) + 1)]
    assert sorted(os.listdir(snapper.dir_path)) == ["0000000000000001-0000000000000002.snap"]


def test_a_purge_cut_short_leaves_no_truncated_snapshot_under_its_name(snapper, monkeypatch):
    for i in (1, 2):
        snapper.save_snap(make_snapshot(index=i, data=os.urandom(10_000)))
    _truncations(monkeypatch, fail_after=1)
    monkeypatch.setattr(snapshotter, "REMOVE_STEP_BYTES", 4096)
    with pytest.raises(OSError, match="injected"):
        snapper.purge(keep=1)
    # the half-removed file is a temp leftover, which the next opening removes
    assert snapper.snap_names() == ["0000000000000001-0000000000000002.snap"]
    reopened = Snapshotter(snapper.dir_path)
    assert os.listdir(snapper.dir_path) == ["0000000000000001-0000000000000002.snap"]
    assert reopened.load().metadata.index == 2


def test_a_mapped_file_is_unlinked_at_once_and_stays_readable(tmp_path, monkeypatch):
    path = str(tmp_path / "big")
    with open(path, "wb") as f:
        f.write(b"x" * 20_000)
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sizes = _truncations(monkeypatch)
    monkeypatch.setattr(snapshotter, "REMOVE_STEP_BYTES", 4096)
    snapshotter.remove_gradually(path)
    assert sizes == [] and not os.path.exists(path)
    assert mapped[-1:] == b"x"  # truncated instead, this read would be a SIGBUS
    mapped.close()


def test_purge_default_is_five_and_zero_means_unlimited(snapper):
    for i in range(1, 9):
        snapper.save_snap(make_snapshot(index=i))
    assert snapper.purge(keep=0) == []
    assert len(snapper.snap_names()) == 8
    assert len(snapper.purge()) == 3
    assert len(snapper.snap_names()) == 5
    with pytest.raises(ValueError):
        snapper.purge(keep=-1)


def test_purge_leaves_broken_and_foreign_files(snapper):
    for i in range(1, 4):
        snapper.save_snap(make_snapshot(index=i))
    d = snapper.dir_path
    for name in ["db", "0000000000000001-0000000000000000.snap.broken"]:
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"keep me")
    snapper.purge(keep=1)
    assert sorted(os.listdir(d)) == [
        "0000000000000001-0000000000000000.snap.broken",
        "0000000000000001-0000000000000003.snap",
        "db",
    ]
