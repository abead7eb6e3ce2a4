"""Releasing, purging and locking segments (etcd's ReleaseLockTo and PurgeFile).

release_lock_to(index) unlocks every segment before the one that contains ``index`` (it
keeps the last segment whose first index is below ``index``); purge then deletes released
segments beyond the newest N, never a locked one. A segment in use is locked against other
WAL instances in this and other processes; read-only tools take no lock.
"""

import os
import subprocess
import sys
import time

import pytest

import wal
from raftpb import HardState, WalSnapshot
from wal.segment import is_locked

from .helpers import entries, segment_files


def one_entry_per_segment(path, n=8):
    """Segments 0-0 (entry 1), then seq k holding entry k+1 and named index k+1."""
    w = wal.create(path, b"m", segment_size_bytes=64, prepare_ahead=False)
    for i in range(1, n + 1):
        w.save(HardState(term=1, commit=i), entries(i, i, size=64))
    return w


def seqs(w):
    return [wal.parse_segment_name(os.path.basename(p)).seq for p in w.segment_paths()]


def test_segments_are_named_by_the_index_they_may_hold(ram_path):
    w = one_entry_per_segment(f"{ram_path}/wal")
    assert segment_files(f"{ram_path}/wal") == [wal.segment_name(0, 0)] + [
        wal.segment_name(k, k + 1) for k in range(1, 9)
    ]
    w.close()


@pytest.mark.parametrize(
    "index,kept_from", [(0, 0), (1, 0), (2, 0), (3, 1), (5, 3), (8, 6), (9, 7), (10, 8), (1000, 8)]
)
def test_release_lock_to_keeps_the_segment_containing_index(ram_path, index, kept_from):
    w = one_entry_per_segment(f"{ram_path}/wal")
    w.release_lock_to(index)
    assert seqs(w) == list(range(kept_from, 9))
    for name in segment_files(f"{ram_path}/wal"):
        seq = wal.parse_segment_name(name).seq
        assert is_locked(f"{ram_path}/wal/{name}") == (seq >= kept_from)
    w.close()


def test_purge_deletes_released_segments_beyond_the_newest_n(ram_path):
    path = f"{ram_path}/wal"
    w = one_entry_per_segment(path)
    w.save_snapshot(WalSnapshot(index=6, term=1))
    assert wal.purge(path, keep=1) == []  # nothing released yet
    w.release_lock_to(6)  # keeps seq 4 (index 5) and later
    assert wal.purge(path, keep=0) == []  # 0 = keep everything
    removed = wal.purge(path, keep=1)
    assert [os.path.basename(p) for p in removed] == [
        wal.segment_name(k, k + 1 if k else 0) for k in range(0, 3)
    ]
    # (with 64-byte segments the snapshot record's append cut seq 9 too)
    assert [wal.parse_segment_name(n).seq for n in segment_files(path)] == list(range(3, 10))
    w.save(None, entries(9, 10))
    w.close()
    r = wal.open(path, WalSnapshot(index=6, term=1), prepare_ahead=False)
    _, hs, ents = r.read_all()
    assert ents == entries(7, 10, size=64)[:2] + entries(9, 10) and hs.commit == 8
    r.close()


def test_a_second_instance_cannot_open_a_wal_in_use(ram_path):
    path = f"{ram_path}/wal"
    w = one_entry_per_segment(path, n=3)
    with pytest.raises(wal.LockedError):
        wal.open(path)
    with pytest.raises(wal.LockedError):
        wal.repair(path)
    code = (
        "import sys, wal\n"
        "try:\n    wal.open(sys.argv[1])\nexcept wal.LockedError:\n    sys.exit(7)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    assert subprocess.run([sys.executable, "-c", code, path], env=env).returncode == 7
    # read-only tools take no lock and see the data
    assert wal.verify(path).commit == 3
    r = wal.open_for_read(path)
    assert r.read_all()[2] == entries(1, 3, size=64)
    r.close()
    w.close()
    w2 = wal.open(path, prepare_ahead=False)  # released by close
    w2.read_all()
    w2.close()


def test_the_next_segment_is_prepared_ahead_and_removed_on_close(ram_path):
    path = f"{ram_path}/wal"
    w = wal.create(path, b"m", segment_size_bytes=4096, prepare_ahead=True)
    deadline = time.monotonic() + 20

    def prepared():  # the pipeline creates the file, then preallocates it: wait for both
        names = [n for n in os.listdir(path) if n.endswith(".tmp")]
        return names if names and os.path.getsize(f"{path}/{names[0]}") == 4096 else None

    while not prepared():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    tmp = prepared()
    assert len(tmp) == 1
    assert is_locked(f"{path}/{tmp[0]}")
    w.save(HardState(term=1), entries(1, 20, size=300))  # cut: the prepared file is used
    assert len(segment_files(path)) == 2
    w.close()
    assert not [n for n in os.listdir(path) if n.endswith(".tmp")]
