"""A snapshot file's data can be mapped instead of read: the same bytes, from the page cache."""

from __future__ import annotations

import os

import pytest

import snap
from raftpb import ConfState, Snapshot, SnapshotMetadata


def _snapshot(data: bytes, index: int = 7) -> Snapshot:
    return Snapshot(data=data, metadata=SnapshotMetadata(ConfState(voters=(1, 2)), index, 3))


def test_the_mapped_data_is_the_saved_data(tmp_path):
    shot = _snapshot(os.urandom(300_000))
    path = snap.Snapshotter(str(tmp_path)).save_snap(shot)
    mapped = snap.map_data(path)
    assert mapped is not None and bytes(mapped) == shot.data
    os.unlink(path)  # a purge: the mapping stays valid
    assert bytes(mapped[:100]) == shot.data[:100]


def test_a_file_in_another_layout_is_not_mapped(tmp_path):
    other = tmp_path / "x.snap"
    other.write_bytes(b"\x00" * 100)
    assert snap.map_data(str(other)) is None
    empty = tmp_path / "y.snap"
    empty.write_bytes(b"")
    assert snap.map_data(str(empty)) is None


def test_a_mapped_read_checks_and_returns_what_a_read_does(tmp_path):
    shot = _snapshot(os.urandom(300_000))
    path = snap.Snapshotter(str(tmp_path)).save_snap(shot)
    read, mapped = snap.read_snap(path), snap.read_snap(path, mapped=True)
    assert isinstance(mapped.data, memoryview) and not isinstance(read.data, memoryview)
    assert bytes(mapped.data) == read.data == shot.data
    assert mapped.metadata == read.metadata == shot.metadata
    loaded = snap.Snapshotter(str(tmp_path)).load_newest_available([shot.metadata], mapped=True)
    assert isinstance(loaded.data, memoryview) and bytes(loaded.data) == shot.data


def test_a_mapped_read_of_a_damaged_file_fails_as_a_read_does(tmp_path):
    shot = _snapshot(os.urandom(300_000))
    path = snap.Snapshotter(str(tmp_path)).save_snap(shot)
    with open(path, "r+b") as f:
        f.seek(150_000)
        byte = f.read(1)
        f.seek(150_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(snap.CRCMismatchError):
        snap.read_snap(path)
    with pytest.raises(snap.CRCMismatchError):
        snap.read_snap(path, mapped=True)
