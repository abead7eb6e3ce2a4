"""``Snapshotter``: the directory of ``.snap`` files — save, load the newest usable, purge.

Contract (see the package docstring for the file layout):

* ``save_snap`` makes a snapshot durable under its final name or leaves no file under that
  name: temp file, write, fsync, close, rename, fsync the directory. When it returns, the
  file survives power loss; the caller may then write the WAL's snapshot record. An empty
  snapshot (``metadata.index == 0``) is not saved.
* ``load_newest_available(wal_snapshots)`` returns the newest snapshot whose (index, term)
  equals one of the WAL's snapshot records, so a file saved just before a crash, before its
  WAL record, is never used. ``load()`` is the same without the WAL filter.
  A file that is corrupt (``CorruptSnapshotError``) is renamed ``*.snap.broken`` and the next
  older one is tried; any other error (I/O, ``SnapshotTooLargeError``) propagates and leaves
  the file alone. Nothing left: ``NoSnapshotError``.
* ``purge(keep)`` deletes all but the newest ``keep`` ``.snap`` files (0 = keep all), oldest
  first; the newest file is never deleted. Call it only after the newest snapshot's WAL
  record is durable (as the server does), otherwise it may delete the only snapshot the WAL
  knows about. ``.broken`` files are kept for inspection, never purged. A big file is
  deleted a step at a time (``remove_gradually``), so that the other files' fsyncs do not
  wait for it.
* Opening removes leftover ``*.snap.tmp`` files of interrupted saves. One ``Snapshotter`` per
  directory (the node's data-dir lock guarantees that); within a process, calls are
  serialized by a lock, so ``save_snap`` may run in a worker thread.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from raftpb import Snapshot
from snap.codec import (
    DEFAULT_MAX_SNAPSHOT_BYTES,
    WRITEBACK_STEP_BYTES,
    encode_pieces,
    read_snap,
    write_pieces,
)
from snap.errors import CorruptSnapshotError, NoSnapshotError, SnapshotTooLargeError
from snap.names import SnapName, is_tmp_name, parse_snap_name

log = logging.getLogger(__name__)

DEFAULT_KEEP_SNAPSHOTS = 5
_FILE_MODE = 0o600


class _IndexTerm(Protocol):
    index: int
    term: int


# A file is deleted by truncating it this much at a time, pausing between steps.
REMOVE_STEP_BYTES = 8 << 20
REMOVE_PAUSE_S = 0.005


def remove_gradually(path: str) -> None:
    """Delete the file at ``path``, freeing its blocks ``REMOVE_STEP_BYTES`` at a time with
    ``REMOVE_PAUSE_S`` between steps.

    Why: the file system frees a file's blocks in one journal transaction when it is
    unlinked, and an fsync of another file on the disk waits for that transaction. Deleting
    a 280 MiB snapshot took 50 ms here, and a WAL's fdatasync running then took up to 29 ms
    instead of 0.2; truncated 8 MiB at a time with 5 ms pauses, the same deletion took 230 ms
    in the caller's thread and no fdatasync beside it took more than 4 ms.

    The file is first renamed to its temp name (``SnapName.tmp_name``), so a crash part way
    leaves a leftover the next ``Snapshotter`` removes, never a truncated snapshot under its
    own name. A file no bigger than one step, or one this process has mapped (truncating
    would turn reads of the mapping into SIGBUS; unlinked, it stays readable), is unlinked
    at once. (``Snapshotter.purge`` does the two halves, ``_stage_removal`` and
    ``_truncate_away``, apart: only the first under its lock.)"""
    staged = _stage_removal(path)
    if staged is not None:
        _truncate_away(staged)


def _stage_removal(path: str) -> str | None:
    """Unlink a small or mapped file now (None), or rename it to its temp name and return
    that, for ``_truncate_away``."""
    if os.stat(path).st_size <= REMOVE_STEP_BYTES or _mapped_here(path):
        os.unlink(path)
        return None
    doomed = path + ".tmp"
    os.rename(path, doomed)
    return doomed


def _truncate_away(path: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        size = os.fstat(fd).st_size
        while size > 0:
            size = max(0, size - REMOVE_STEP_BYTES)
            os.ftruncate(fd, size)
            if size:
                time.sleep(REMOVE_PAUSE_S)
    finally:
        os.close(fd)
    os.unlink(path)


def _mapped_here(path: str) -> bool:
    """Whether this process maps the file (Linux's ``/proc/self/maps``; True if unknown)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            real = os.path.realpath(path)
            return any(line.rstrip("\n").endswith(real) for line in maps)
    except OSError:
        return True


def _fsync_dir(dir_path: str) -> None:
    fd = os.open(dir_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs_durably(dir_path: str) -> None:
    """mkdir -p, fsyncing the parent of each directory created so the entries survive."""
    missing = []
    path = os.path.abspath(dir_path)
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
        _fsync_dir(os.path.dirname(path))


def save_snap_file(
    dir_path: str,
    snapshot: Snapshot,
    data_parts: Sequence[bytes | memoryview] | None,
    writeback_step_bytes: int = WRITEBACK_STEP_BYTES,
    max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
) -> str | None:
    """``Snapshotter.save_snap`` without a ``Snapshotter``: no lock, and the directory is not
    opened (no leftover temp file is removed), so a process other than the directory's
    owner may write one file into it (``snap.continued``)."""
    md = snapshot.metadata
    if md.index == 0:
        return None
    name = SnapName(term=md.term, index=md.index)  # validates the uint64 range
    encoded = encode_pieces(snapshot, data_parts)
    if encoded.size_bytes > max_snapshot_bytes:
        raise SnapshotTooLargeError(name.file_name, encoded.size_bytes, max_snapshot_bytes)
    final_path = os.path.join(dir_path, name.file_name)
    tmp_path = os.path.join(dir_path, name.tmp_name)
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, _FILE_MODE)
    try:
        try:
            write_pieces(fd, encoded, writeback_step_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, final_path)
    except BaseException:
        # Not a crash: we are still running, so do not leave the temp file behind.
        try:
            os.unlink(tmp_path)
        except OSError:
            pass
        raise
    # The rename is durable only once the directory entry is; until this returns the
    # caller must not write the WAL record (a lost file without a record is harmless).
    _fsync_dir(dir_path)
    return final_path


class Snapshotter:
    """The snapshot files of one node, in ``dir_path`` (created if missing)."""

    def __init__(
        self, dir_path: str | os.PathLike[str], max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES
    ) -> None:
        if max_snapshot_bytes <= 0:
            raise ValueError(f"max_snapshot_bytes must be positive, got {max_snapshot_bytes}")
        self._dir = os.fspath(dir_path)
        self._max_snapshot_bytes = max_snapshot_bytes
        self._lock = threading.Lock()
        _make_dirs_durably(self._dir)
        self._remove_tmp_leftovers()

    @property
    def dir_path(self) -> str:
        return self._dir

    @property
    def max_snapshot_bytes(self) -> int:
        return self._max_snapshot_bytes

    # --- writing ---------------------------------------------------------------------------

    def save_snap(
        self, snapshot: Snapshot, data_parts: Sequence[bytes | memoryview] | None = None
    ) -> str | None:
        """Durably save ``snapshot`` as ``{term:016x}-{index:016x}.snap``; return its path.

        Returns None without writing for an empty snapshot (index 0). An existing file of the
        same name is replaced atomically. On any error no file of the final name is created
        (a replaced one stays intact) and the temp file is removed. ``data_parts``: the
        data as the list of parts it was produced in (``snapshot.data`` is then None).
        """
        with self._lock:
            return self._save(snapshot, data_parts, WRITEBACK_STEP_BYTES)

    def save_snap_in_child(
        self,
        snapshot: Snapshot,
        data_parts: Sequence[bytes | memoryview] | None = None,
        writeback_step_bytes: int = WRITEBACK_STEP_BYTES,
    ) -> str | None:
        """``save_snap`` for a forked child (``snap.forked``): without the lock, which a
        thread of the parent may have held at the fork and would then never release in the
        child. Safe because the parent never writes a snapshot of the same name meanwhile:
        the child saves the member's own state at an applied index, and a snapshot from the
        leader that arrives while it runs is always of a later index."""
        return self._save(snapshot, data_parts, writeback_step_bytes)

    def _save(
        self,
        snapshot: Snapshot,
        data_parts: Sequence[bytes | memoryview] | None,
        writeback_step_bytes: int,
    ) -> str | None:
        return save_snap_file(
            self._dir, snapshot, data_parts, writeback_step_bytes, self._max_snapshot_bytes
        )

    # --- reading ---------------------------------------------------------------------------

    def snap_names(self) -> list[str]:
        """Names of the well-formed ``.snap`` files, newest (highest term, then index) first."""
        parsed = []
        for entry in os.listdir(self._dir):
            name = parse_snap_name(entry)
            if name is not None:
                parsed.append(name)
        parsed.sort(reverse=True)
        return [n.file_name for n in parsed]

    def load(self) -> Snapshot:
        """The newest valid snapshot, whatever the WAL says (for tools and for tests)."""
        return self._load_matching(lambda name: True, "")

    def load_newest_available(
        self, wal_snapshots: Iterable[_IndexTerm], *, mapped: bool = False
    ) -> Snapshot:
        """The newest valid snapshot whose (index, term) is one of ``wal_snapshots``; with
        ``mapped``, its data mapped from the file where it can be (``read_snap``)."""
        known = {(ws.index, ws.term) for ws in wal_snapshots}
        return self._load_matching(
            lambda name: (name.index, name.term) in known,
            f" among the WAL's {len(known)} snapshot record(s)",
            mapped,
        )

    def _load_matching(
        self, match: Callable[[SnapName], bool], among: str, mapped: bool = False
    ) -> Snapshot:
        broken: list[str] = []
        with self._lock:
            names = self.snap_names()
            for file_name in names:
                name = parse_snap_name(file_name)
                assert name is not None
                if not match(name):
                    continue
                path = os.path.join(self._dir, file_name)
                try:
                    return read_snap(path, self._max_snapshot_bytes, mapped=mapped)
                except CorruptSnapshotError as exc:
                    broken_path = os.path.join(self._dir, name.broken_name)
                    log.warning(
                        "%s; renaming it to %s and trying an older snapshot", exc, broken_path
                    )
                    os.replace(path, broken_path)
                    _fsync_dir(self._dir)
                    broken.append(broken_path)
        if not names:
            detail = "no .snap files"
        elif broken:
            detail = f"every matching .snap file was corrupt{among}"
        else:
            detail = f"none of {len(names)} .snap file(s) matches{among}"
        raise NoSnapshotError(self._dir, tuple(broken), detail)

    # --- housekeeping ----------------------------------------------------------------------

    def purge(self, keep: int = DEFAULT_KEEP_SNAPSHOTS) -> list[str]:
        """Delete all but the newest ``keep`` snapshot files (0 = unlimited); return the
        deleted names, oldest first."""
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        if keep == 0:
            return []
        with self._lock:
            doomed = self.snap_names()[keep:]
            doomed.reverse()  # oldest first: an interrupted purge leaves the newer ones
            staged = [_stage_removal(os.path.join(self._dir, name)) for name in doomed]
            if doomed:
                _fsync_dir(self._dir)
        # The slow half outside the lock: a save (a leader's snapshot, in the WAL writer)
        # does not wait for it. The files are temp names now, which nothing else touches.
        for path in staged:
            if path is not None:
                _truncate_away(path)
        return doomed

    def _remove_tmp_leftovers(self) -> None:
        removed = 0
        for entry in os.listdir(self._dir):
            if is_tmp_name(entry):
                log.info("removing leftover of an interrupted snapshot save: %s", entry)
                os.unlink(os.path.join(self._dir, entry))
                removed += 1
        if removed:
            _fsync_dir(self._dir)
