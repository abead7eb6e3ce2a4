"""Segment files: names, locks, preallocation, durable renames, and the file pipeline.

Directory layout (one WAL per directory, e.g. ``<data-dir>/member/wal``)::

    {seq:016x}-{index:016x}.wal   a segment; seq counts up by one from 0, index is the first
                                  raft index the segment may hold (etcd's naming)
    0.tmp, 1.tmp                  the next segment, preallocated ahead of need (pipeline)
    *.wal.broken                  a copy kept by ``repair`` before it truncated a segment
    anything else                 ignored

A segment in use is locked with ``flock(LOCK_EX | LOCK_NB)`` on its own open file
description, so another WAL instance, in this process or another, cannot open it for
appending and ``purge`` cannot delete it; ``WAL.release_lock_to`` closes (and so unlocks)
segments that are no longer needed.

Preallocation (``preallocation_bytes``, ``preallocate``): a new segment reserves the segment
size, but never more than a quarter of the free space of its file system, and a full disk
drops the reservation instead of failing; so a member starts on a small disk, and only a
write that really finds no space fails — with the file's path and the free space in its
message (``wal.errors.describe_os_error``).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import re
import threading
from dataclasses import dataclass

from wal.errors import (
    DISK_FULL_ERRNOS,
    LockedError,
    SegmentNotFoundError,
    SegmentSequenceError,
    os_error_at,
)

SEGMENT_SUFFIX = ".wal"
_NAME_RE = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.wal$")
_MAX_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True, order=True)
class SegmentName:
    seq: int
    index: int

    @property
    def name(self) -> str:
        return segment_name(self.seq, self.index)


def segment_name(seq: int, index: int) -> str:
    if not (0 <= seq <= _MAX_U64 and 0 <= index <= _MAX_U64):
        raise ValueError(f"segment seq/index out of range: {seq}, {index}")
    return f"{seq:016x}-{index:016x}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> SegmentName | None:
    m = _NAME_RE.match(name)
    return SegmentName(int(m.group(1), 16), int(m.group(2), 16)) if m else None


def list_segments(dir_path: str) -> list[SegmentName]:
    """The segment names in ``dir_path``, in sequence order (other files are ignored)."""
    found = [parse_segment_name(n) for n in os.listdir(dir_path)]
    return sorted(s for s in found if s is not None)


def has_segments(dir_path: str) -> bool:
    try:
        return bool(list_segments(dir_path))
    except FileNotFoundError:
        return False


def select_segments(dir_path: str, snap_index: int) -> list[SegmentName]:
    """The segments to read for a snapshot at ``snap_index``: etcd's ``selectWALFiles``.

    Reading starts at the last segment whose index is <= snap_index (the one that may hold
    the snapshot record); the selected segments must have consecutive sequence numbers.
    """
    names = list_segments(dir_path)
    if not names:
        raise SegmentNotFoundError(f"{dir_path}: no WAL segment")
    start = -1
    for i in range(len(names) - 1, -1, -1):
        if names[i].index <= snap_index:
            start = i
            break
    if start < 0:
        raise SegmentNotFoundError(
            f"{dir_path}: no segment can hold index {snap_index} (first is {names[0].name})"
        )
    chosen = names[start:]
    check_sequence(dir_path, chosen)
    return chosen


def check_sequence(dir_path: str, names: list[SegmentName]) -> None:
    for prev, cur in zip(names, names[1:], strict=False):
        if cur.seq != prev.seq + 1:
            raise SegmentSequenceError(
                f"{dir_path}: segment {prev.seq + 1:016x} is missing "
                f"between {prev.name} and {cur.name}"
            )


# --- file helpers ---------------------------------------------------------------------------


def lock_fd(fd: int, path: str) -> None:
    """Take the segment lock on ``fd`` without waiting; LockedError when someone holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise LockedError(f"{path} is locked by another WAL instance") from None
        raise


def is_locked(path: str) -> bool:
    """Whether some open file description holds the lock on ``path`` (probe, then release)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return True
            raise
        return False
    finally:
        os.close(fd)  # closing drops our probe lock


# A new file never preallocates more than this share of the space still free on its file
# system. Two files are preallocated at a time (the tail and the spare the pipeline prepares),
# so together they take at most ~44% of what was free, and the rest stays for their data,
# snapshots and everything else on the disk.
PREALLOCATE_FREE_SHARE = 0.25
_PREALLOCATE_ALIGN = 4096


def preallocation_bytes(dir_path: str, size_bytes: int) -> int:
    """How much to preallocate for a new segment of ``size_bytes`` in ``dir_path``.

    The segment size on a roomy disk (etcd's behaviour: appends then allocate nothing), but
    at most ``PREALLOCATE_FREE_SHARE`` of the free space, rounded down to 4 KiB: on a small
    disk (a 20 MB volume and the default 64 MB segments) the member starts and uses the
    disk for data instead of failing on a reservation it does not need. Preallocation is
    an optimisation only: a segment grows past its preallocated size like any file, and
    the WAL cuts segments by the bytes written, not by the preallocated size."""
    try:
        st = os.statvfs(dir_path)
    except OSError:
        return size_bytes
    budget = int(st.f_bavail * st.f_frsize * PREALLOCATE_FREE_SHARE)
    return max(0, min(size_bytes, budget - budget % _PREALLOCATE_ALIGN))


def preallocate(fd: int, size_bytes: int) -> bool:
    """Reserve ``size_bytes`` for the file so appends do not allocate blocks; True if done.

    Falls back to extending the file (sparse; reads as zeros) where the file system has no
    fallocate. Never shrinks the file. A full disk (ENOSPC/EDQUOT) is not an error here:
    the reservation is dropped (the file keeps its size) and False is returned; the writes
    that follow report a full disk with the file's path if the space really runs out.
    """
    size = os.fstat(fd).st_size
    if size_bytes <= size:
        return True
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError as e:
        if e.errno in DISK_FULL_ERRNOS:
            os.ftruncate(fd, size)  # give back whatever was allocated before the failure
            return False
        if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
        os.ftruncate(fd, size_bytes)
    return True


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def read_whole(fd: int) -> bytes:
    """The whole file as one bytes object (segments are bounded by the segment size)."""
    size = os.fstat(fd).st_size
    first = os.pread(fd, size, 0)
    if len(first) == size:
        return first
    parts = [first]
    got = len(first)
    while got < size:
        chunk = os.pread(fd, size - got, got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def map_whole(path: str) -> mmap.mmap | bytes:
    """The whole file as a read-only mmap (bytes for an empty file): no copy, no zeroed
    anonymous memory. Only for files nobody truncates meanwhile (a segment we hold locked):
    a mapped page beyond a new end of file raises SIGBUS on access. The mapping uses its
    own file description, so it never holds the segment's lock."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return b""
        return mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


class SegmentFile:
    """An open, locked segment (or a prepared ``.tmp`` file before its rename)."""

    __slots__ = ("seq", "index", "path", "fd")

    def __init__(self, seq: int, index: int, path: str, fd: int) -> None:
        self.seq = seq
        self.index = index
        self.path = path
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def open_locked(path: str, *, create: bool = False) -> int:
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        lock_fd(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


class FilePipeline:
    """Prepares the next segment file ahead of need: ``N.tmp``, locked and preallocated.

    With ``background=True`` a thread keeps exactly one prepared file ready (bounded: it
    waits until that one is taken); ``take()`` then costs no allocation on the append path.
    Otherwise ``take()`` prepares the file itself. ``close()`` removes an unused file.
    """

    def __init__(self, dir_path: str, size_bytes: int, *, background: bool = True) -> None:
        self._dir = dir_path
        self._size = size_bytes
        self._count = 0
        self._cv = threading.Condition()
        self._ready: SegmentFile | BaseException | None = None
        self._closed = False
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._run, name="wal-file-pipeline", daemon=True)
            self._thread.start()

    def _alloc(self) -> SegmentFile:
        # Two names alternate (as etcd's): the file just taken is renamed right away, so the
        # one being prepared never collides with it.
        path = os.path.join(self._dir, f"{self._count % 2}.tmp")
        self._count += 1
        try:
            fd = open_locked(path, create=True)
        except OSError as e:
            raise os_error_at(e, path, "creating the next WAL segment") from e
        try:
            preallocate(fd, preallocation_bytes(self._dir, self._size))
        except OSError as e:
            os.close(fd)
            raise os_error_at(e, path, "preallocating the next WAL segment") from e
        except BaseException:
            os.close(fd)
            raise
        return SegmentFile(-1, -1, path, fd)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._ready is not None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
            try:
                item: SegmentFile | BaseException = self._alloc()
            except BaseException as e:  # handed to take(), which raises it
                item = e
            with self._cv:
                if self._closed:
                    _discard(item)
                    return
                self._ready = item
                self._cv.notify_all()
                if isinstance(item, BaseException):
                    return

    def take(self) -> SegmentFile:
        if self._thread is None:
            return self._alloc()
        with self._cv:
            while self._ready is None:
                if self._closed:
                    raise RuntimeError("file pipeline is closed")
                self._cv.wait()
            item, self._ready = self._ready, None
            if not isinstance(item, BaseException):
                self._cv.notify_all()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        with self._cv:
            self._closed = True
            item, self._ready = self._ready, None
            self._cv.notify_all()
        _discard(item)
        if self._thread is not None:
            self._thread.join()


def _discard(item: SegmentFile | BaseException | None) -> None:
    if isinstance(item, SegmentFile):
        item.close()
        try:
            os.unlink(item.path)
        except FileNotFoundError:
            pass


# Where a WAL is found under DIR, in order: a data dir, a member dir.
_WAL_SUBDIRS = (os.path.join("member", "wal"), "wal")


def find_wal_dir(path: str) -> str:
    """The WAL directory ``path`` names: the WAL directory itself, a member's data dir (its
    ``member/wal``) or its ``member`` dir. ``SegmentNotFoundError`` saying where it looked
    when none of them holds a segment, ``OSError`` when ``path`` is not a directory."""
    if not os.path.isdir(path):
        raise NotADirectoryError(f"{path}: not a directory")
    for candidate in (path, *(os.path.join(path, sub) for sub in _WAL_SUBDIRS)):
        if os.path.isdir(candidate) and list_segments(candidate):
            return candidate
    elsewhere = " or ".join(os.path.join(path, sub) for sub in _WAL_SUBDIRS)
    raise SegmentNotFoundError(f"{path}: no WAL segment here, nor in {elsewhere}")
