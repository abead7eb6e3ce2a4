"""Deleting segments the log no longer needs.

A running node releases old segments with ``WAL.release_lock_to(index)`` after a snapshot;
``purge(dir, keep)`` then deletes the released (unlocked) segments except the newest
``keep`` of them (0 = keep all). Locked segments, and every segment after the
first locked one, are never touched. Each victim is locked while it is unlinked, so a WAL
opening it at the same moment either gets it first (and it stays) or finds it gone.

Only meaningful while the owning WAL is open: with no process holding locks, every segment
looks released.
"""

from __future__ import annotations

import errno
import fcntl
import os

from wal.segment import fsync_dir, is_locked, list_segments

DEFAULT_KEEP_SEGMENTS = 5


def purge(dir_path: str | os.PathLike[str], keep: int = DEFAULT_KEEP_SEGMENTS) -> list[str]:
    """Delete released segments beyond the newest ``keep``; return the deleted paths."""
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    if keep == 0:
        return []
    path = os.path.abspath(os.fspath(dir_path))
    released = []
    for name in list_segments(path):
        seg = os.path.join(path, name.name)
        if is_locked(seg):
            break
        released.append(seg)
    removed = []
    for seg in released[: max(0, len(released) - keep)]:
        fd = os.open(seg, os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    break  # locked since we looked: in use again
                raise
            os.unlink(seg)
            removed.append(seg)
        finally:
            os.close(fd)
    if removed:
        fsync_dir(path)
    return removed
