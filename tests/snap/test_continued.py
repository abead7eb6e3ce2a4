"""``snap.continued``: a spawned process writes a ``.snap`` file whose data is new bytes
around a range of an earlier file's data; the file reads back (CRC checked) as exactly
that, and bad input makes the process fail without leaving a file."""

import asyncio
import os

import pytest

from raftpb import ConfState, Snapshot, SnapshotMetadata
from snap import Snapshotter, forked, read_snap
from snap.continued import spawn
from snap.forked import ChildFailedError
from snap.spill import SpillFile

pytestmark = pytest.mark.skipif(not forked.available(), reason="needs pidfd")


def _meta(index: int) -> Snapshot:
    return Snapshot(
        data=None, metadata=SnapshotMetadata(ConfState(voters=(1, 2, 3)), index=index, term=2)
    )


def _source(tmp_path, data: bytes) -> str:
    dir_path = str(tmp_path / "snap")
    source = Snapshot(data=data, metadata=_meta(10).metadata)
    return Snapshotter(dir_path).save_snap(source)


async def _continue(dir_path, source_path, source_range, head, tail, index=20):
    with SpillFile(dir_path) as parts:
        parts.append([head, tail])
        fd = os.open(source_path, os.O_RDONLY)
        try:
            child = spawn(dir_path, _meta(index), fd, source_range, parts.fileno(), len(head))
        finally:
            os.close(fd)
    await child.wait(60)
    return os.path.join(dir_path, f"{2:016x}-{index:016x}.snap")


async def test_the_new_file_is_head_then_the_range_then_tail(tmp_path):
    data = os.urandom(3 << 20)
    source_path = _source(tmp_path, data)
    dir_path = os.path.dirname(source_path)
    path = await _continue(dir_path, source_path, (1000, 2_500_000), b"HEAD", b"tail" * 1000)
    got = read_snap(path)
    assert got.metadata == _meta(20).metadata
    assert got.data == b"HEAD" + data[1000:2_500_000] + b"tail" * 1000


async def test_an_empty_head_or_tail_or_range_is_fine(tmp_path):
    source_path = _source(tmp_path, b"0123456789")
    dir_path = os.path.dirname(source_path)
    path = await _continue(dir_path, source_path, (3, 3), b"", b"")
    assert read_snap(path).data == b""
    path = await _continue(dir_path, source_path, (0, 10), b"", b"", index=21)
    assert read_snap(path).data == b"0123456789"


@pytest.mark.parametrize("source_range", [(0, 11), (5, 4)])
async def test_a_range_outside_the_source_fails_and_leaves_no_file(tmp_path, source_range):
    source_path = _source(tmp_path, b"0123456789")
    dir_path = os.path.dirname(source_path)
    with pytest.raises((ChildFailedError, ValueError)):
        await _continue(dir_path, source_path, source_range, b"h", b"t")
    assert sorted(os.listdir(dir_path)) == [os.path.basename(source_path)]


async def test_a_source_that_is_not_a_snap_file_fails(tmp_path):
    dir_path = str(tmp_path)
    bogus = tmp_path / "bogus.snap"
    bogus.write_bytes(b"\x00" * 100)
    with pytest.raises(ChildFailedError):
        await _continue(dir_path, str(bogus), (0, 10), b"h", b"t")
    assert sorted(os.listdir(dir_path)) == ["bogus.snap"]


async def test_the_spawn_does_not_wait_for_the_copy(tmp_path):
    """The caller gets the child back at once and its loop keeps running meanwhile."""
    data = os.urandom(16 << 20)
    source_path = _source(tmp_path, data)
    dir_path = os.path.dirname(source_path)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        path = await _continue(dir_path, source_path, (0, len(data)), b"h", b"t")
    finally:
        task.cancel()
    assert read_snap(path).data == b"h" + data + b"t"
    assert ticks > 0
