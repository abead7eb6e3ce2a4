"""The WAL object: create, open, read_all, save (with group commit), cut, release, close.

Life cycle (etcd's)::

    create(dir, metadata)      -> WAL, appendable at once
    open(dir, snap)            -> WAL; read_all() must run first, then it is appendable
    open_for_read(dir, snap)   -> WAL for read_all() only (no locks, torn tail tolerated)

Concurrency: every method may be called from any thread. Appends are serialised by one
lock and written with one ``pwrite`` per save (or per batch, see ``wal.writer``); the data
sync is done *outside* that lock by a "sync leader": a thread that needs its data durable
waits for the sync lock, and if an fsync that started after its write has completed
meanwhile it returns without one, otherwise it syncs everything written so far. So N
threads saving while an fsync is in flight are covered by the next single fsync.

Failure: after a failed write or fsync the WAL refuses further appends (WalFailedError);
the process must reopen it (Linux may have dropped the dirty pages; retrying the fsync
could report success for data that is gone).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from raftpb import (
    Entry,
    EntryFields,
    HardState,
    HardStateFields,
    WalSnapshot,
    WalSnapshotFields,
)
from wal.decoder import ScanState, SegmentData
from wal.errors import (
    DISK_FULL_ERRNOS,
    SnapshotNotFoundError,
    WalError,
    WalExistsError,
    WalFailedError,
    WalStateError,
    describe_os_error,
    os_error_at,
)
from wal.frame import (
    append_crc,
    append_entries,
    append_metadata,
    append_snapshot,
    append_state,
    is_empty_hard_state,
)
from wal.policy import SyncMode, SyncPolicy
from wal.replay import replay
from wal.segment import (
    FilePipeline,
    SegmentFile,
    fsync_dir,
    has_segments,
    map_whole,
    open_locked,
    preallocate,
    preallocation_bytes,
    pwrite_all,
    read_whole,
    segment_name,
    select_segments,
)

DEFAULT_SEGMENT_SIZE_BYTES = 64 * 1024 * 1024
MIN_SEGMENT_SIZE_BYTES = 64  # tiny sizes are for tests: a cut after every save
MAX_SEGMENT_SIZE_BYTES = 1 << 40

_READING, _APPENDING, _READ_ONLY, _CLOSED = "reading", "appending", "read-only", "closed"

SyncFn = Callable[[int], None]

# One append: (snapshot record or None, hard state or None for unchanged, entries,
# must_sync or None for etcd's MustSync rule).
SaveItem = tuple[
    WalSnapshotFields | None, HardStateFields | None, Sequence[EntryFields], bool | None
]

_T = TypeVar("_T")
_R = TypeVar("_R")


def _check_size(segment_size_bytes: int) -> int:
    if not MIN_SEGMENT_SIZE_BYTES <= segment_size_bytes <= MAX_SEGMENT_SIZE_BYTES:
        raise ValueError(
            f"segment_size_bytes must be {MIN_SEGMENT_SIZE_BYTES}.."
            f"{MAX_SEGMENT_SIZE_BYTES}, got {segment_size_bytes}"
        )
    return segment_size_bytes


def _as_hard_state(hs: HardStateFields) -> HardState:
    if isinstance(hs, HardState):
        return hs
    return HardState(term=hs.term, vote=hs.vote, commit=hs.commit)


class WAL:
    """A write-ahead log directory opened by this process. Build with create/open."""

    def __init__(
        self,
        dir_path: str,
        segments: list[SegmentFile],
        *,
        mode: str,
        policy: SyncPolicy,
        sync_fn: SyncFn | None,
        segment_size_bytes: int,
        prepare_ahead: bool,
        start: WalSnapshot | None = None,
    ) -> None:
        self._dir = dir_path
        self._segments = segments  # locked segments, oldest first; the last is the tail
        self._mode = mode
        self._policy = policy
        self._sync_fn: SyncFn = sync_fn or os.fdatasync
        self._segment_size_bytes = segment_size_bytes
        self._prepare_ahead = prepare_ahead
        self._start = start or WalSnapshot()
        self._metadata = b""
        self._state = HardState()
        self._enti = 0  # index of the last entry (or snapshot) written
        self._crc = 0  # running CRC-32C of the log
        self._tail_off = 0  # where the next frame goes in the tail segment
        self._pipeline: FilePipeline | None = None
        self._failed: BaseException | None = None
        self._mu = threading.Lock()  # guards everything above
        self._sync_mu = threading.Lock()  # held by the sync leader; taken before _mu
        # invariant: _synced_seq <= _written_seq; writes numbered 1.. in file order
        self._written_seq = 0
        self._synced_seq = 0
        self.sync_count = 0  # data syncs issued (group commit shows here)
        self._closing = threading.Event()
        self._interval_thread: threading.Thread | None = None

    # --- properties ------------------------------------------------------------------------

    @property
    def dir(self) -> str:
        return self._dir

    @property
    def sync_policy(self) -> SyncPolicy:
        return self._policy

    @property
    def last_index(self) -> int:
        """Index of the last entry (or snapshot record, if later) written."""
        return self._enti

    @property
    def hard_state(self) -> HardState:
        return self._state

    @property
    def metadata(self) -> bytes:
        return self._metadata

    def tail_position(self) -> tuple[str, int, int, HardState] | None:
        """(tail segment path, end offset of its complete writes, last index, hard state),
        all as of one moment: the bytes of the tail segment up to that offset hold exactly the
        writes whose last index and hard state these are (a write moves all four together,
        after its pwrite returned). None before the first segment exists. For readers of the
        live segment such as the archive; the bytes may not be synced yet."""
        with self._mu:
            if not self._segments:
                return None
            return self._segments[-1].path, self._tail_off, self._enti, self._state

    def segment_paths(self) -> list[str]:
        """The segments this WAL holds locked (the last one is being appended to)."""
        with self._mu:
            return [s.path for s in self._segments]

    # --- reading ---------------------------------------------------------------------------

    def read_all(self) -> tuple[bytes, HardState, list[Entry]]:
        """Read the log from the snapshot given to ``open``: (metadata, hard state, entries).

        Entries are those after the snapshot index, with later writes of an index replacing
        the earlier tail (Raft figure 7). Raises a CorruptError subclass (file and offset)
        on any damage, TornWriteError for a torn tail (run ``repair`` and reopen),
        SnapshotNotFoundError when the snapshot record is missing. After it returns, a WAL
        from ``open`` is appendable.
        """
        with self._mu:
            if self._mode not in (_READING, _READ_ONLY):
                raise WalStateError(f"read_all on a WAL that is {self._mode}")
            st = ScanState(self._start.index, self._start.term)
            segs = self._segments
            # Appending mode holds the segment locks, so nobody truncates them under us and
            # they can be mapped (no copy); read-only mode reads them (a live writer may cut).
            readers: list[Callable[[], SegmentData]]
            if self._mode == _READING:
                readers = [_bind(map_whole, s.path) for s in segs]
            else:
                readers = [_bind(read_whole, s.fd) for s in segs]
            end = replay(
                [s.path for s in segs], readers, st, tolerate_torn=self._mode == _READ_ONLY
            )
            if not st.snap_matched:
                raise SnapshotNotFoundError(
                    f"{self._dir}: no snapshot record for index {self._start.index} "
                    f"term {self._start.term}"
                )
            metadata = st.metadata if st.metadata is not None else b""
            hs = st.hard_state()
            entries = st.entries
            assert entries is not None  # the ScanState above keeps entries
            if self._mode == _READING:
                tail = segs[-1]
                if end.trailing_garbage:
                    # Bytes after the end of the data were never acknowledged (a zero length
                    # word ends the log) but would confuse the next reader once new frames
                    # partly overwrite them: zero them, keeping the preallocation (etcd's
                    # ZeroToEnd), and make that durable before anything is appended.
                    os.ftruncate(tail.fd, end.end_offset)
                    preallocate(tail.fd, end.last_size)
                    os.fsync(tail.fd)
                self._metadata = metadata
                self._state = hs
                self._enti = st.enti
                self._crc = st.crc
                self._tail_off = end.end_offset
                self._start_appending()
            else:
                self._metadata = metadata
                self._state = hs
                self._enti = st.enti
            return metadata, hs, entries

    def _start_appending(self) -> None:
        self._pipeline = FilePipeline(
            self._dir, self._segment_size_bytes, background=self._prepare_ahead
        )
        self._mode = _APPENDING
        if self._policy.mode is SyncMode.INTERVAL:
            self._interval_thread = threading.Thread(
                target=self._interval_loop, name="wal-interval-sync", daemon=True
            )
            self._interval_thread.start()

    # --- appending -------------------------------------------------------------------------

    def save(
        self,
        hard_state: HardStateFields | None = None,
        entries: Sequence[EntryFields] = (),
        *,
        must_sync: bool | None = None,
    ) -> None:
        """Append ``entries`` then ``hard_state`` (None or empty: unchanged); return when
        durable as the sync policy requires.

        An fsync is needed when entries are present or the term or vote changed (etcd's
        ``MustSync``), or exactly when ``must_sync`` says so if given. Entries and hard
        state are duck-typed (``term``/``index``/``type``/``data``; ``term``/``vote``/
        ``commit``).
        """
        self.save_batch(((None, hard_state, entries, must_sync),))

    def save_snapshot(self, snap: WalSnapshotFields) -> None:
        """Append a snapshot record (walpb.Snapshot) and make it durable."""
        self.save_batch(((snap, None, (), True),))

    def save_batch(self, items: Iterable[SaveItem]) -> None:
        """Append several (snapshot|None, hard_state|None, entries, must_sync|None) items
        with one write and at most one fsync. Raises the first item's error, if any."""
        seq, need_sync, errors = self.append(items)
        if need_sync:
            self.sync_upto(seq)
        for err in errors:
            if err is not None:
                raise err

    def append(self, items: Iterable[SaveItem]) -> tuple[int, bool, list[ValueError | None]]:
        """Write items without syncing: (write seq, whether a sync is needed, per-item
        errors). A ValueError for an invalid item leaves nothing of that item written.
        Used by ``save_batch`` and the group-commit writer; pair with ``sync_upto``."""
        with self._mu:
            self._check_appendable()
            buf = bytearray()
            crc, state, enti = self._crc, self._state, self._enti
            need = False
            errors: list[ValueError | None] = []
            size = self._segment_size_bytes
            for snap, hs, entries, must_sync in items:
                mark = len(buf)
                try:
                    n_crc = crc
                    n_enti = enti
                    if snap is not None:
                        n_crc = append_snapshot(buf, snap, n_crc)
                        n_enti = max(n_enti, snap.index)
                    if entries:
                        n_crc = append_entries(buf, entries, n_crc)
                        n_enti = entries[-1].index
                    n_state = state
                    if hs is not None and not is_empty_hard_state(hs):
                        n_crc = append_state(buf, hs, n_crc)
                        n_state = _as_hard_state(hs)
                except (ValueError, TypeError, AttributeError) as e:
                    del buf[mark:]
                    errors.append(e if isinstance(e, ValueError) else ValueError(str(e)))
                    continue
                errors.append(None)
                if must_sync is None:
                    must_sync = (
                        bool(entries)
                        or snap is not None
                        or n_state.term != state.term
                        or n_state.vote != state.vote
                    )
                need = need or bool(must_sync)
                crc, state, enti = n_crc, n_state, n_enti
                if self._tail_off + len(buf) >= size:
                    # etcd cuts after the save that crosses the size; the cut syncs all.
                    self._flush(buf, crc, state, enti)
                    buf = bytearray()
                    self._cut()
                    need = False
                    crc, state, enti = self._crc, self._state, self._enti
            if buf:
                self._flush(buf, crc, state, enti)
            return self._written_seq, need and self._policy.mode is SyncMode.ALWAYS, errors

    def _flush(self, buf: bytearray, crc: int, state: HardState, enti: int) -> None:
        tail = self._segments[-1]
        try:
            pwrite_all(tail.fd, buf, self._tail_off)
        except OSError as e:
            self._fail(e)
            raise WalFailedError(describe_os_error(e, tail.path, "writing")) from e
        self._tail_off += len(buf)
        self._crc, self._state, self._enti = crc, state, enti
        self._written_seq += 1

    def sync_upto(self, seq: int) -> None:
        """Return once every write numbered <= ``seq`` is durable (group commit leader)."""
        with self._sync_mu:
            if self._synced_seq >= seq:
                return  # someone's fsync, started after our write, already covered it
            with self._mu:
                self._check_not_failed()
                if self._mode != _APPENDING:
                    raise WalStateError(f"sync on a WAL that is {self._mode}")
                fd = self._segments[-1].fd
                path = self._segments[-1].path
                target = self._written_seq
            try:
                self._sync_fn(fd)
            except OSError as e:
                self._fail(e)
                raise WalFailedError(describe_os_error(e, path, "syncing")) from e
            with self._mu:
                self.sync_count += 1
                if target > self._synced_seq:
                    self._synced_seq = target

    def sync(self) -> None:
        """Make everything written so far durable, whatever the policy."""
        with self._mu:
            seq = self._written_seq
        self.sync_upto(seq)

    def _interval_loop(self) -> None:
        wait_s = self._policy.interval_ms / 1000.0
        while not self._closing.wait(wait_s):
            if self._written_seq > self._synced_seq:
                try:
                    self.sync()
                except WalError:
                    return  # failed or closed: appends report it

    def _cut(self) -> None:
        """Close the tail at its current size and continue in a new segment (under _mu)."""
        pipeline = self._pipeline
        assert pipeline is not None  # set when appending starts
        old = self._segments[-1]
        where = old.path  # the file in hand when an OSError comes: named in the error
        try:
            os.ftruncate(old.fd, self._tail_off)  # drop the unused preallocated space
            os.fsync(old.fd)
            where = self._dir
            new = pipeline.take()  # its errors name the .tmp file already
            where = new.path
            try:
                hdr = bytearray()
                crc = append_crc(hdr, self._crc)
                crc = append_metadata(hdr, self._metadata, crc)
                if not self._state.is_empty():
                    crc = append_state(hdr, self._state, crc)
                pwrite_all(new.fd, hdr, 0)
                self._sync_fn(new.fd)
                self.sync_count += 1
                final = os.path.join(self._dir, segment_name(old.seq + 1, self._enti + 1))
                os.rename(new.path, final)
                fsync_dir(self._dir)
            except BaseException:
                new.close()
                raise
        except OSError as e:
            self._fail(e)
            if e.errno in DISK_FULL_ERRNOS and where in str(e):
                message = f"cutting a new WAL segment: {e.strerror}"
            else:
                message = describe_os_error(e, where, "cutting a new WAL segment at")
            raise WalFailedError(message) from e
        new.path, new.seq, new.index = final, old.seq + 1, self._enti + 1
        self._segments.append(new)
        self._crc = crc
        self._tail_off = len(hdr)
        self._written_seq += 1
        self._synced_seq = self._written_seq

    # --- releasing and closing ---------------------------------------------------------------

    def release_lock_to(self, index: int) -> None:
        """Unlock the segments before the one that contains ``index`` (etcd's rule: keep
        the last segment whose start index is below ``index`` and everything after it;
        never the tail). Released segments may then be deleted by ``wal.purge``."""
        with self._sync_mu, self._mu:
            segs = self._segments
            if not segs:
                return
            keep_from = len(segs) - 1
            for i, s in enumerate(segs):
                if s.index >= index:
                    keep_from = i - 1
                    break
            if keep_from <= 0:
                return
            for s in segs[:keep_from]:
                s.close()
            del segs[:keep_from]

    def close(self) -> None:
        """Sync (unless the policy is never, or the WAL failed) and release everything."""
        self._closing.set()
        if self._interval_thread is not None:
            self._interval_thread.join()
        with self._sync_mu, self._mu:
            if self._mode == _CLOSED:
                return
            try:
                if (
                    self._mode == _APPENDING
                    and self._failed is None
                    and self._policy.mode is not SyncMode.NEVER
                    and self._written_seq > self._synced_seq
                ):
                    self._sync_fn(self._segments[-1].fd)
                    self.sync_count += 1
                    self._synced_seq = self._written_seq
            finally:
                self._mode = _CLOSED
                if self._pipeline is not None:
                    self._pipeline.close()
                for s in self._segments:
                    s.close()
                self._segments = []

    def __enter__(self) -> WAL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- state checks ----------------------------------------------------------------------

    def _fail(self, err: BaseException) -> None:
        if self._failed is None:
            self._failed = err

    def _check_not_failed(self) -> None:
        if self._failed is not None:
            raise WalFailedError(
                f"{self._dir}: an earlier write or fsync failed ({self._failed}); reopen the WAL"
            ) from self._failed

    def _check_appendable(self) -> None:
        self._check_not_failed()
        if self._mode != _APPENDING:
            hint = " (call read_all first)" if self._mode == _READING else ""
            raise WalStateError(f"cannot append to a WAL that is {self._mode}{hint}")


def _bind(read: Callable[[_T], _R], arg: _T) -> Callable[[], _R]:
    return lambda: read(arg)


# --- constructors --------------------------------------------------------------------------


def create(
    dir_path: str | os.PathLike[str],
    metadata: bytes,
    *,
    segment_size_bytes: int = DEFAULT_SEGMENT_SIZE_BYTES,
    sync_policy: str | SyncPolicy = "always",
    sync_fn: SyncFn | None = None,
    prepare_ahead: bool = True,
) -> WAL:
    """Create a new WAL in ``dir_path`` (which must not exist or be empty).

    The first segment ``0000000000000000-0000000000000000.wal`` holds a crc record (0), the
    metadata record and an empty snapshot record; it is built in ``<dir>.tmp``, fsynced, and
    renamed into place, then the parent directory is fsynced: a crash leaves either no WAL
    or a complete one.
    """
    if not isinstance(metadata, (bytes, bytearray)):
        raise TypeError("metadata must be bytes")
    size = _check_size(segment_size_bytes)
    policy = SyncPolicy.parse(sync_policy)
    path = os.path.abspath(os.fspath(dir_path))
    if os.path.exists(path) and (has_segments(path) or os.listdir(path)):
        raise WalExistsError(f"{path} exists and is not empty")
    tmp = path + ".tmp"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp, mode=0o700)
    name = segment_name(0, 0)
    first = os.path.join(tmp, name)
    try:
        fd = open_locked(first, create=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise os_error_at(e, first, "creating the WAL") from e
    try:
        preallocate(fd, preallocation_bytes(tmp, size))
        hdr = bytearray()
        crc = append_crc(hdr, 0)
        crc = append_metadata(hdr, bytes(metadata), crc)
        crc = append_snapshot(hdr, WalSnapshot(), crc)
        pwrite_all(fd, hdr, 0)
        os.fsync(fd)
        fsync_dir(tmp)
        if os.path.exists(path):
            os.rmdir(path)  # empty, checked above
        os.rename(tmp, path)
        fsync_dir(os.path.dirname(path))
    except OSError as e:
        os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        raise os_error_at(e, first, "creating the WAL") from e
    except BaseException:
        os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    wal = WAL(
        path,
        [SegmentFile(0, 0, os.path.join(path, name), fd)],
        mode=_READING,
        policy=policy,
        sync_fn=sync_fn,
        segment_size_bytes=size,
        prepare_ahead=prepare_ahead,
    )
    wal._metadata = bytes(metadata)
    wal._crc = crc
    wal._tail_off = len(hdr)
    wal._start_appending()
    return wal


def open(
    dir_path: str | os.PathLike[str],
    snap: WalSnapshot | None = None,
    *,  # noqa: A001 - etcd's name, used as wal.open
    segment_size_bytes: int = DEFAULT_SEGMENT_SIZE_BYTES,
    sync_policy: str | SyncPolicy = "always",
    sync_fn: SyncFn | None = None,
    prepare_ahead: bool = True,
) -> WAL:
    """Open the WAL at ``snap`` (a WalSnapshot; None = the empty snapshot) for appending.

    Locks every segment from the one that may hold the snapshot record (LockedError if
    another instance holds one). Call ``read_all()`` before appending.
    """
    size = _check_size(segment_size_bytes)
    policy = SyncPolicy.parse(sync_policy)
    path = os.path.abspath(os.fspath(dir_path))
    snap = snap or WalSnapshot()
    names = select_segments(path, snap.index)
    segs: list[SegmentFile] = []
    try:
        for n in names:
            p = os.path.join(path, n.name)
            segs.append(SegmentFile(n.seq, n.index, p, open_locked(p)))
    except BaseException:
        for s in segs:
            s.close()
        raise
    return WAL(
        path,
        segs,
        mode=_READING,
        policy=policy,
        sync_fn=sync_fn,
        segment_size_bytes=size,
        prepare_ahead=prepare_ahead,
        start=snap,
    )


def open_for_read(dir_path: str | os.PathLike[str], snap: WalSnapshot | None = None) -> WAL:
    """Open the WAL at ``snap`` for ``read_all`` only: no locks (a running node may hold
    them), and a torn tail ends the data instead of raising (etcd's read mode)."""
    path = os.path.abspath(os.fspath(dir_path))
    snap = snap or WalSnapshot()
    names = select_segments(path, snap.index)
    segs: list[SegmentFile] = []
    try:
        for n in names:
            p = os.path.join(path, n.name)
            segs.append(SegmentFile(n.seq, n.index, p, os.open(p, os.O_RDONLY | os.O_CLOEXEC)))
    except BaseException:
        for s in segs:
            s.close()
        raise
    return WAL(
        path,
        segs,
        mode=_READ_ONLY,
        policy=SyncPolicy(),
        sync_fn=None,
        segment_size_bytes=DEFAULT_SEGMENT_SIZE_BYTES,
        prepare_ahead=False,
        start=snap,
    )
