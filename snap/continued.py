"""A ``.snap`` file made of a range of an earlier one's data and new bytes, written by a
spawned process at the lowest priority.

Why: a snapshot that continues the member's previous one (the store's stream continued,
``kvserver.mvcc.snapshot.serialize_after``) is mostly a range of the previous file: hundreds
of megabytes at a million keys, against the few megabytes encoded anew. Copied by a thread
of the member, the CRC and the writes are the member's CPU time and each step wins the
interpreter lock back; under a write storm at a million keys the member's puts waited for
that (put p99 28-33 ms, against 19-23 ms when a forked child wrote whole snapshots). Here a
new interpreter does it, started with ``posix_spawn`` (a vfork and an exec: 0.4 ms for a
process of 700 MiB, where a fork copies the page tables, 17 ms), niced in a session of its
own as the snapshot child is (``snap.forked.run_in_background``).

Contract: ``spawn(dir_path, snapshot, source_fd, source_range, parts_fd, head_bytes)``
starts ``python -m snap.continued`` and returns a ``ForkedChild`` to ``await
child.wait(timeout_s)`` on. The child writes the ``.snap`` file of ``snapshot`` (a raftpb
snapshot whose ``data`` is None: its metadata names the file) into ``dir_path``; its data is
the first ``head_bytes`` bytes of the file ``parts_fd``, then the bytes ``source_range`` of
the data of the ``.snap`` file open as ``source_fd`` (offsets into its data, as
``map_data`` maps it), then the rest of ``parts_fd``. When the child exits 0 the file is
durable under its final name (``save_snap_file``); no WAL knows it yet. The caller opens
both files before the spawn and may close them once it returns: the child holds its own
descriptors, so a purge that unlinks the source meanwhile changes nothing. The child dies
with its parent, and fails (exit 3, the reason on its stderr) when the source is not in the
layout this package writes or the range lies outside its data.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import sys
import time
import traceback

from raftpb import Snapshot, decode_snapshot, encode_snapshot
from snap.codec import data_bounds
from snap.forked import CHILD_NICENESS, ForkedChild, die_with, run_in_background
from snap.snapshotter import save_snap_file

# The child flushes its file in steps this size: a WAL fdatasync beside it then waits behind
# at most one step's writeback (1.5-1.9 ms for 1 MiB on the test machine, up to 10 ms for
# 4 MiB), and a process of its own pays nothing for the extra writes.
WRITEBACK_STEP_BYTES = 1 << 20

_FAILED = 3


def spawn(
    dir_path: str,
    snapshot: Snapshot,
    source_fd: int,
    source_range: tuple[int, int],
    parts_fd: int,
    head_bytes: int,
    niceness: int = CHILD_NICENESS,
) -> ForkedChild:
    if snapshot.data is not None:
        raise ValueError("the snapshot's data is given by the files, not in the snapshot")
    start, end = source_range
    if not 0 <= start <= end or head_bytes < 0:
        raise ValueError(f"bad ranges: source {source_range}, head {head_bytes}")
    argv = [
        sys.executable,
        "-P",  # not the working directory first on the path: this package, as installed
        "-m",
        "snap.continued",
        dir_path,
        encode_snapshot(snapshot).hex(),
        str(source_fd),
        str(start),
        str(end),
        str(parts_fd),
        str(head_bytes),
        str(os.getpid()),
        str(niceness),
    ]
    # posix_spawn passes the descriptors that are inheritable, and Python makes none so
    # unless asked: only these two (and stdin, stdout, stderr) reach the child.
    for fd in (source_fd, parts_fd):
        os.set_inheritable(fd, True)
    try:
        started = time.monotonic()
        pid = os.posix_spawn(sys.executable, argv, os.environ)
        return ForkedChild(pid, time.monotonic() - started)
    finally:
        for fd in (source_fd, parts_fd):
            os.set_inheritable(fd, False)


def write(
    dir_path: str,
    snapshot: Snapshot,
    source_fd: int,
    source_range: tuple[int, int],
    parts_fd: int,
    head_bytes: int,
) -> str:
    """What the child does (see the module docstring); returns the file's path."""
    with mmap.mmap(source_fd, 0, access=mmap.ACCESS_READ) as source:
        bounds = data_bounds(source)
        if bounds is None:
            raise ValueError("the source is not a .snap file in this package's layout")
        data_start, data_end = bounds
        start, end = source_range
        if end > data_end - data_start:
            raise ValueError(f"range {source_range} lies outside the source's data")
        parts_size = os.fstat(parts_fd).st_size
        if head_bytes > parts_size:
            raise ValueError(f"head of {head_bytes} bytes in parts of {parts_size}")
        # (an empty file cannot be mapped)
        parts = mmap.mmap(parts_fd, 0, access=mmap.ACCESS_READ) if parts_size else b""
        pieces = [
            memoryview(parts)[:head_bytes],
            memoryview(source)[data_start + start : data_start + end],
            memoryview(parts)[head_bytes:],
        ]
        try:
            path = save_snap_file(dir_path, snapshot, pieces, WRITEBACK_STEP_BYTES)
        finally:
            for piece in pieces:
                piece.release()
            if isinstance(parts, mmap.mmap):
                parts.close()
    assert path is not None  # a snapshot at index 0 is never continued
    return path


def main(argv: list[str]) -> int:
    try:
        dir_path, meta_hex, source_fd, start, end, parts_fd, head, parent, nice = argv
        die_with(int(parent))
        run_in_background(int(nice))
        write(
            dir_path,
            dataclasses.replace(decode_snapshot(bytes.fromhex(meta_hex)), data=None),
            int(source_fd),
            (int(start), int(end)),
            int(parts_fd),
            int(head),
        )
        return 0
    except BaseException:
        sys.stderr.write(f"snapshot writer {os.getpid()}: {traceback.format_exc()}")
        return _FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
