"""Writing a ``.snap`` file: ``write_pieces`` flushes it in steps (the bytes are the pieces, in
order, fdatasynced once per full step, so no more than a step is ever dirty), and a snapshot
saved from the parts its state machine produced is the file of the joined data."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raftpb
from snap import Snapshotter, codec, read_snap
from snap.codec import EncodedSnap, write_pieces

pieces_st = st.lists(st.binary(max_size=300), max_size=8)


@settings(max_examples=200, deadline=None)
@given(pieces=pieces_st, step=st.integers(min_value=1, max_value=700))
def test_file_is_the_pieces_flushed_once_per_step(tmp_path_factory, pieces, step):
    path = tmp_path_factory.mktemp("w") / "snap"
    encoded = EncodedSnap(pieces=tuple(pieces), crc=0, size_bytes=sum(map(len, pieces)))
    flushed_at: list[int] = []
    real_fdatasync = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        flushed_at.append(os.fstat(fd).st_size)
        real_fdatasync(fd)

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    codec.os.fdatasync = counting_fdatasync  # type: ignore[attr-defined]
    try:
        write_pieces(fd, encoded, writeback_step_bytes=step)
    finally:
        codec.os.fdatasync = real_fdatasync  # type: ignore[attr-defined]
        os.close(fd)

    assert path.read_bytes() == b"".join(pieces)
    total = encoded.size_bytes
    assert flushed_at == [step * k for k in range(1, total // step + 1)]


def test_step_must_be_positive(tmp_path):
    fd = os.open(tmp_path / "snap", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(ValueError, match="positive"):
            write_pieces(fd, EncodedSnap(pieces=(b"x",), crc=0, size_bytes=1), 0)
    finally:
        os.close(fd)


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.binary(max_size=200), max_size=6), index=st.integers(1, 2**40))
def test_a_snapshot_saved_from_parts_is_the_file_of_the_joined_data(tmp_path_factory, parts, index):
    metadata = raftpb.SnapshotMetadata(raftpb.ConfState((1, 2, 3)), index, 7)
    joined_dir, parts_dir = tmp_path_factory.mktemp("joined"), tmp_path_factory.mktemp("parts")
    joined = Snapshotter(str(joined_dir)).save_snap(raftpb.Snapshot(b"".join(parts), metadata))
    from_parts = Snapshotter(str(parts_dir)).save_snap(raftpb.Snapshot(None, metadata), parts)
    assert joined is not None and from_parts is not None
    with open(joined, "rb") as a, open(from_parts, "rb") as b:
        assert a.read() == b.read()
    assert read_snap(from_parts).data == b"".join(parts)


def test_data_in_the_snapshot_and_as_parts_is_refused():
    with pytest.raises(ValueError, match="either"):
        codec.encode_pieces(raftpb.Snapshot(b"x", raftpb.SnapshotMetadata()), [b"y"])
