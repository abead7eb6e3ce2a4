"""``write_pieces`` flushes a snapshot file in steps: the bytes are the pieces, in order, and
the file is fdatasynced once per full step (so no more than a step is ever dirty)."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snap import codec
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
