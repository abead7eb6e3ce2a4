"""SpillFile: what is appended comes back, mapped, byte for byte, whatever the parts and
however writev splits them; the file leaves no name behind."""

import asyncio
import hashlib
import mmap
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snap import spill
from snap.spill import SpillFile, drop_resident_pages, spill_chunks

appends_st = st.lists(st.lists(st.binary(max_size=300), max_size=20), max_size=5)


@settings(max_examples=200, deadline=None)
@given(appends=appends_st)
def test_the_mapping_is_every_part_appended_in_order(tmp_path_factory, appends):
    directory = tmp_path_factory.mktemp("spill")
    with SpillFile(str(directory)) as f:
        for parts in appends:
            f.append(parts)
        got = f.map()
    expected = b"".join(b"".join(parts) for parts in appends)
    assert bytes(got) == expected and f.size == len(expected)
    assert os.listdir(directory) == []  # anonymous: nothing to clean up after a crash


def test_short_writes_resume_inside_the_part(tmp_path, monkeypatch):
    real_writev = os.writev

    def at_most_7_bytes(fd, buffers):
        head = b"".join(bytes(b) for b in buffers)[:7]
        return real_writev(fd, [head])

    monkeypatch.setattr(spill.os, "writev", at_most_7_bytes)
    parts = [b"abc", b"", b"defghijklmnop", b"q" * 20]
    with SpillFile(str(tmp_path)) as f:
        f.append(parts)
        assert bytes(f.map()) == b"".join(parts)


def test_more_parts_than_one_writev_takes(tmp_path):
    parts = [b"%05d" % i for i in range(3000)]
    with SpillFile(str(tmp_path)) as f:
        f.append(parts)
        got = f.map()
    assert bytes(got) == b"".join(parts)
    assert isinstance(got.obj, mmap.mmap)


def test_nothing_appended_maps_to_empty(tmp_path):
    with SpillFile(str(tmp_path)) as f:
        assert bytes(f.map()) == b""


async def test_spill_chunks_takes_batches_and_gives_the_mapping(tmp_path):
    chunks = [os.urandom(1 << 20) for _ in range(9)]  # more than two batches
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    got = await spill_chunks(iter(chunks), str(tmp_path))
    task.cancel()
    assert got == b"".join(chunks) and isinstance(got.obj, mmap.mmap)
    assert turns >= len(chunks)  # a loop turn per chunk of a producer on the loop
    assert os.listdir(tmp_path) == []


async def test_spill_chunks_passes_a_producers_error_on_and_leaves_nothing(tmp_path):
    async def failing():
        for _ in range(6):
            yield bytes(1 << 20)
        raise ValueError("the sender went away")

    with pytest.raises(ValueError, match="went away"):
        await spill_chunks(failing(), str(tmp_path))
    assert os.listdir(tmp_path) == []


def _rss_file_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


def test_dropping_a_mapping_s_pages_leaves_the_data_readable(tmp_path):
    size = 64 << 20
    with SpillFile(str(tmp_path)) as f:
        f.append([bytes(range(256)) * (size // 256)])
        data = f.map()
    assert hashlib.sha256(data).digest()  # read every page through the mapping
    resident = _rss_file_kib()
    drop_resident_pages(data)
    assert resident - _rss_file_kib() > (size >> 10) * 3 // 4
    assert data[12345] == 12345 % 256 and len(data) == size  # faulted back from the cache
    drop_resident_pages(b"not mapped")  # anything else: nothing happens
