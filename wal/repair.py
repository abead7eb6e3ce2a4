"""Checking and repairing a WAL directory without opening it for appending.

* ``verify(dir, snap)`` reads from the snapshot like ``read_all`` (every CRC, metadata,
  entry order, the snapshot record) without keeping entries, and returns the last hard
  state. ``snap=None`` checks every segment from the first one instead, without looking
  for a snapshot record (what ``raftkv wal verify`` does). A torn tail is accepted by
  default (etcd's ``Verify``), reported with ``allow_torn_tail=False``.
* ``valid_snapshot_entries(dir)``: the snapshot records of the whole log whose index is
  <= the last hard state's commit (etcd's ``ValidSnapshotEntries``): the snapshots a
  snapshot file may be loaded for. With ``locked=True`` (the owner of the directory, about
  to open it) every segment is locked for the scan and mapped instead of read: no copy of
  the whole log into fresh memory, LockedError when a WAL instance holds it.
* ``repair(dir)``: if the last segment ends in a torn write, copy it to
  ``<name>.broken`` (on a disk without room for that copy: only the torn bytes, to
  ``<name>.broken-from-<offset>``), truncate it at the last good frame, fsync; every
  error names its file; True when the log is
  clean afterwards (or was already), False when the damage is not a torn tail: that is
  never "repaired", it is reported by ``verify``/``read_all`` with file and offset.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial

from raftpb import HardState, WalSnapshot
from wal.decoder import BadRecord, ScanState, SegmentData, is_torn, scan
from wal.errors import (
    DISK_FULL_ERRNOS,
    SegmentNotFoundError,
    SnapshotNotFoundError,
    os_error_at,
)
from wal.replay import gc_paused, replay
from wal.segment import (
    SegmentName,
    check_sequence,
    fsync_dir,
    list_segments,
    map_whole,
    open_locked,
    pwrite_all,
    read_whole,
    select_segments,
)

# A snapshot index no entry reaches: entries are all checked and none is kept.
_CHECK_ONLY = (1 << 64) - 1


def _all_segments(dir_path: str) -> list[SegmentName]:
    names = list_segments(dir_path)
    if not names:
        raise SegmentNotFoundError(f"{dir_path}: no WAL segment")
    check_sequence(dir_path, names)
    return names


def _read_path(path: str) -> Callable[[], bytes]:
    def read() -> bytes:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return read_whole(fd)
        finally:
            os.close(fd)

    return read


def check_dir(
    dir_path: str | os.PathLike[str],
    snap: WalSnapshot | None = None,
    *,
    allow_torn_tail: bool = True,
    collect_snapshots: bool = False,
    locked: bool = False,
) -> ScanState:
    """Scan the WAL read-only; return the final ScanState (see ``verify``). Without locks,
    reading each segment whole (a live writer may cut its tail meanwhile); with ``locked``,
    holding every segment's lock for the scan, so the segments can be mapped: a mapped page
    past a new end of file would raise SIGBUS, and nobody cuts a locked segment."""
    path = os.path.abspath(os.fspath(dir_path))
    if snap is None:
        names = _all_segments(path)
        st = ScanState(_CHECK_ONLY, 0, keep_entries=False, collect_snapshots=collect_snapshots)
    else:
        names = select_segments(path, snap.index)
        st = ScanState(
            snap.index, snap.term, keep_entries=False, collect_snapshots=collect_snapshots
        )
    paths = [os.path.join(path, n.name) for n in names]
    with ExitStack() as locks:
        if locked:
            for p in paths:
                locks.callback(os.close, open_locked(p))
        readers: list[Callable[[], SegmentData]] = [
            partial(map_whole, p) if locked else _read_path(p) for p in paths
        ]
        replay(paths, readers, st, tolerate_torn=allow_torn_tail)
    if snap is not None and not st.snap_matched:
        raise SnapshotNotFoundError(
            f"{path}: no snapshot record for index {snap.index} term {snap.term}"
        )
    return st


def verify(
    dir_path: str | os.PathLike[str],
    snap: WalSnapshot | None = None,
    *,
    allow_torn_tail: bool = True,
) -> HardState:
    return check_dir(dir_path, snap, allow_torn_tail=allow_torn_tail).hard_state()


def valid_snapshot_entries(
    dir_path: str | os.PathLike[str], *, locked: bool = False
) -> list[WalSnapshot]:
    st = check_dir(dir_path, None, allow_torn_tail=True, collect_snapshots=True, locked=locked)
    commit = st.hard_state().commit
    assert st.snapshots is not None  # collect_snapshots above
    return [s for s in st.snapshots if s.index <= commit]


def repair(dir_path: str | os.PathLike[str]) -> bool:
    """Truncate a torn tail of the last segment (keeping a ``.broken`` copy)."""
    path = os.path.abspath(os.fspath(dir_path))
    names = list_segments(path)
    if not names:
        raise SegmentNotFoundError(f"{path}: no WAL segment")
    seg_path = os.path.join(path, names[-1].name)
    fd = open_locked(seg_path)  # LockedError while a WAL instance has it open
    try:
        buf = read_whole(fd)
        st = ScanState(_CHECK_ONLY, 0, keep_entries=False)
        try:
            with gc_paused():
                scan(buf, 0, st)
            return True
        except BadRecord as bad:
            if not is_torn(buf, bad.offset, bad.kind):
                return False
            offset = bad.offset
        broken = seg_path + ".broken"
        try:
            _write_copy(broken, buf)
        except OSError as e:
            if e.errno not in DISK_FULL_ERRNOS:
                raise os_error_at(e, broken, "saving the torn segment to") from e
            # No room for a whole copy: keep the torn bytes only (the good part stays in
            # the segment), without the preallocated zeros after them.
            tail = bytes(buf[offset:]).rstrip(b"\0")
            broken = f"{seg_path}.broken-from-{offset}"
            try:
                _write_copy(broken, tail)
            except OSError as e2:
                raise os_error_at(e2, broken, "saving the torn tail to") from e2
        try:
            os.ftruncate(fd, offset)
            os.fsync(fd)
            fsync_dir(path)
        except OSError as e:
            raise os_error_at(e, seg_path, "truncating the torn tail of") from e
        return True
    finally:
        os.close(fd)


def _write_copy(path: str, data: bytes) -> None:
    """Write ``data`` to a new file ``path`` durably; on failure remove what was written."""
    bfd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:
            pwrite_all(bfd, data, 0)
            os.fsync(bfd)
        finally:
            os.close(bfd)
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
