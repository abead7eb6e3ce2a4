"""A member's durable storage: ``member/wal`` + ``member/snap`` behind raft's MemoryStorage.

Layout as etcd's: ``<data-dir>/member/wal/*.wal`` and ``<data-dir>/member/snap/*.snap``.
The WAL metadata is etcd's ``etcdserverpb.Metadata`` encoding ``{node_id=1, cluster_id=2}``
(``kvserver.membership.identity``), so a data directory cannot be started as another member
or in another cluster.

Recovery (``NodeStorage.open``): load the newest snapshot the WAL has a record of, open the
WAL at it and read everything after; a torn tail (a crash in the middle of a write) is
repaired once, automatically; any other corruption raises ``StorageCorruptError`` naming the
file, the offset and the repair command, and the member refuses to start.

Persisting a Ready (``persist``): snapshot file, then the WAL snapshot record, then entries
and hard state in one WAL write, fsynced when the Ready says ``must_sync``; then the same
data goes into the MemoryStorage the raft core reads. The fsync (and a snapshot save) runs on
a dedicated writer thread, so the event loop keeps serving while the disk syncs; encoding and
the ``pwrite`` stay on the loop, which keeps the writer thread from holding the GIL.
"""

import asyncio
import dataclasses
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor

import raftpb
import snap
import wal
from kvserver import stages
from kvserver.membership.identity import decode_metadata, encode_metadata
from kvserver.server.config import ServerConfig
from kvserver.server.disk_health import FsyncWatch
from kvserver.server.metrics import FSYNC_BUCKETS_SECONDS, DurationHistogram
from raft import (
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Ready,
    Snapshot,
    SnapshotMetadata,
)
from snap import continued
from snap.forked import ForkedChild
from snap.spill import SpillFile
from wal.errors import os_error_at

log = logging.getLogger(__name__)


class StorageCorruptError(RuntimeError):
    """The member's data is damaged in a way that must not be repaired automatically."""


def _to_raft_conf_state(cs) -> ConfState:
    if cs is None:
        return ConfState()
    return ConfState(
        tuple(cs.voters),
        tuple(cs.learners),
        tuple(cs.voters_outgoing),
        tuple(cs.learners_next),
        cs.auto_leave,
    )


def _to_pb_snapshot(s: Snapshot) -> raftpb.Snapshot:
    md = s.metadata
    cs = md.conf_state
    return raftpb.Snapshot(
        s.data,
        raftpb.SnapshotMetadata(
            raftpb.ConfState(
                cs.voters, cs.learners, cs.voters_outgoing, cs.learners_next, cs.auto_leave
            ),
            md.index,
            md.term,
        ),
    )


def _to_raft_snapshot(s) -> Snapshot:
    md = s.metadata
    return Snapshot(
        s.data or b"", SnapshotMetadata(_to_raft_conf_state(md.conf_state), md.index, md.term)
    )


def _wal_snapshot(s: Snapshot) -> raftpb.WalSnapshot:
    md = s.metadata
    return raftpb.WalSnapshot(md.index, md.term, _to_pb_snapshot(s).metadata.conf_state)


# How much of a snapshot file a forked child writes between two flushes. Measured on this
# project's 2-core test machine (ext4 on a virtual disk), while a 270 MiB file was written,
# a 40 KB append's fdatasync beside it waited at most 10 ms with 4 MiB steps, at most
# 1.5-1.9 ms with 1 MiB steps, and the file took no longer to write (0.24-0.27 s against
# 0.31-0.64 s). A thread of the member keeps 4 MiB steps (snap.codec): each of its writes
# must win the interpreter lock back.
CHILD_WRITEBACK_STEP_BYTES = 1 << 20


class NodeStorage:
    def __init__(
        self, cfg: ServerConfig, w, snapshotter: snap.Snapshotter, raft_storage: MemoryStorage
    ):
        self.cfg = cfg
        self.wal = w
        self.snapshotter = snapshotter
        self.spill_dir = cfg.snap_dir  # snapshots on their way in (snap.spill), beside the files
        self.raft_storage = raft_storage
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wal-writer")
        # Snapshot files of this member's own snapshots are written apart from the WAL: a
        # file of hundreds of megabytes must not hold up the fsyncs of the writes behind it.
        self._snap_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snap-writer")
        # Old snapshot files and WAL segments are deleted apart from both (etcd purges in a
        # goroutine of its own): on this project's test machine (ext4 mounted with
        # `discard`) unlinking a 270 MiB snapshot took 70 ms and a 64 MiB segment 16 ms, and
        # done by the WAL writer every put behind it waited that long.
        self._purger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="purge")
        self._stats = {"wal_syncs": 0, "wal_entries": 0}
        self.fsync_seconds = DurationHistogram(FSYNC_BUCKETS_SECONDS)
        # The same fsyncs over a sliding window, and the one in flight: the disk's health
        # (kvserver.server.disk_health: a slow leader gives way, a stall turns /health false)
        self.fsync_watch = FsyncWatch(window_s=cfg.slow_disk_window_ms / 1000)

    # --- opening -----------------------------------------------------------------------------

    @classmethod
    async def open(
        cls, cfg: ServerConfig, *, member_id: int, cluster_id: int
    ) -> tuple["NodeStorage", bool]:
        """Open (or create) the member's storage; returns (storage, fresh)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, cls._open_blocking, cfg, member_id, cluster_id)

    @classmethod
    def _open_blocking(cls, cfg, member_id, cluster_id):
        os.makedirs(cfg.member_dir, exist_ok=True)
        snapshotter = snap.Snapshotter(cfg.snap_dir)
        metadata = encode_metadata(member_id, cluster_id)
        if not _wal_exists(cfg.wal_dir):
            w = wal.create(cfg.wal_dir, metadata, sync_policy=cfg.wal_sync)
            return cls(cfg, w, snapshotter, MemoryStorage()), True

        opened = cls._open_at_newest_snapshot(cfg, snapshotter)
        if opened is not None:
            w, (meta, hs, ents), pb_snap = opened
            return cls._recovered(
                cfg, w, snapshotter, meta, hs, ents, pb_snap, member_id, cluster_id
            )

        # Locked and mapped: this member owns the directory and opens it next, and the scan
        # of every retained segment then copies none of them (a few hundred MB after a load).
        try:
            walsnaps = wal.valid_snapshot_entries(cfg.wal_dir, locked=True)
        except wal.CorruptError as exc:
            walsnaps = cls._repair_or_refuse(
                cfg, exc, lambda: wal.valid_snapshot_entries(cfg.wal_dir, locked=True)
            )
        try:
            # Mapped, not read: the member owns the directory, and at two million keys
            # reading the file into the heap took 0.3 s of the restart, mapping 0.05 s.
            pb_snap = snapshotter.load_newest_available(walsnaps, mapped=True)
        except snap.NoSnapshotError:
            pb_snap = None
        ws = (
            raftpb.WalSnapshot(pb_snap.metadata.index, pb_snap.metadata.term)
            if pb_snap is not None
            else raftpb.WalSnapshot()
        )

        def read():
            w = wal.open(cfg.wal_dir, ws, sync_policy=cfg.wal_sync)
            try:
                return w, w.read_all()
            except BaseException:
                w.close()
                raise

        try:
            w, (meta, hs, ents) = read()
        except wal.CorruptError as exc:
            w, (meta, hs, ents) = cls._repair_or_refuse(cfg, exc, read)
        return cls._recovered(cfg, w, snapshotter, meta, hs, ents, pb_snap, member_id, cluster_id)

    @staticmethod
    def _open_at_newest_snapshot(cfg, snapshotter):
        """The usual start, reading only the WAL from the newest snapshot on: (the WAL,
        ``read_all``'s result, the snapshot), or None when the newest snapshot file is not
        one to start from (none at all, no record of it in the WAL from its segment on, an
        index past the WAL's commit, a damaged file or WAL); the caller then reads every
        retained segment for the snapshots they record, as etcd does, and starts from the
        newest of those that has a file. Both ways pick the same snapshot. This way reads
        nothing of the segments before the snapshot's (up to ``--max-wals`` of them, 0.5-0.8
        s of a restart at a million keys), and so no longer notices damage there: recovery
        never reads those entries."""
        names = snapshotter.snap_names()
        newest = snap.parse_snap_name(names[0]) if names else None
        if newest is None:
            return None
        ws = raftpb.WalSnapshot(newest.index, newest.term)
        try:
            w = wal.open(cfg.wal_dir, ws, sync_policy=cfg.wal_sync)
        except wal.WalError as exc:
            log.info("starting from the WAL's snapshot records (%s)", exc)
            return None
        try:
            got = w.read_all()
            if ws.index > got[1].commit:
                raise wal.SnapshotNotFoundError(f"snapshot {ws.index} is past the WAL's commit")
            pb_snap = snapshotter.load_newest_available([ws], mapped=True)
        except (wal.WalError, snap.NoSnapshotError) as exc:
            log.info("starting from the WAL's snapshot records (%s)", exc)
            w.close()
            return None
        except BaseException:
            w.close()
            raise
        return w, got, pb_snap

    @classmethod
    def _recovered(cls, cfg, w, snapshotter, meta, hs, ents, pb_snap, member_id, cluster_id):
        got_member, got_cluster = decode_metadata(meta)
        if (got_member, got_cluster) != (member_id, cluster_id):
            w.close()
            raise StorageCorruptError(
                f"{cfg.wal_dir} belongs to member {got_member:x} of cluster {got_cluster:x}, "
                f"not to member {member_id:x} of cluster {cluster_id:x} (check --name, "
                f"--initial-cluster and --initial-cluster-token)"
            )

        ms = MemoryStorage()
        snap_index = pb_snap.metadata.index if pb_snap is not None else 0
        if pb_snap is not None:
            # Kept for followers mapped from its file (the page cache, not the heap): read
            # mapped already, or mapped now if it had to be read.
            md = pb_snap.metadata
            path = os.path.join(cfg.snap_dir, snap.SnapName(term=md.term, index=md.index).file_name)
            raft_snap = _to_raft_snapshot(pb_snap)
            if not isinstance(pb_snap.data, memoryview):
                raft_snap = _mapped(raft_snap, path)
            ms.apply_snapshot(raft_snap)
            pb_snap = None
        ms.set_hard_state(HardState(hs.term, hs.vote, hs.commit))
        ms.append([Entry(e.term, e.index, EntryType(e.type), e.data or b"") for e in ents])
        log.info(
            "recovered %d entries after snapshot %d (hard state %s/%s/%s)",
            len(ents),
            snap_index,
            hs.term,
            hs.vote,
            hs.commit,
        )
        return cls(cfg, w, snapshotter, ms), False

    @staticmethod
    def _repair_or_refuse(cfg, exc, retry):
        if not isinstance(exc, wal.TornWriteError):
            raise StorageCorruptError(
                f"WAL corrupt: {exc.file} at offset {exc.offset}: {exc.reason}. The member "
                f"will not start from corrupt data. If this is a torn tail, "
                f"`raftkv wal repair {cfg.wal_dir}` truncates it; otherwise restore this "
                f"member from a healthy one."
            ) from exc
        log.warning("WAL has a torn tail (%s); repairing once", exc)
        if not wal.repair(cfg.wal_dir):
            raise StorageCorruptError(f"WAL repair failed for {cfg.wal_dir}: {exc}") from exc
        try:
            return retry()
        except wal.CorruptError as again:
            raise StorageCorruptError(
                f"WAL still corrupt after repair: {again.file} at offset {again.offset}: "
                f"{again.reason}"
            ) from again

    # --- writing ----------------------------------------------------------------------------

    async def persist(self, rd: Ready) -> None:
        snapshot = rd.snapshot if rd.snapshot is not None and not rd.snapshot.is_empty() else None
        if snapshot is not None:
            loop = asyncio.get_running_loop()
            path = await loop.run_in_executor(self._writer, self._persist_with_snapshot, rd)
            snapshot = _mapped(snapshot, path)
        elif rd.entries or rd.hard_state is not None:
            # Encode and pwrite here (the raft task is the only writer); only the fsync goes
            # to the writer thread. Python work on that thread would compete with the event
            # loop for the GIL and delay the messages this Ready just sent.
            seq, need_sync, errs = self.wal.append(
                ((None, rd.hard_state, rd.entries, rd.must_sync),)
            )
            if errs[0] is not None:
                raise errs[0]
            self._stats["wal_entries"] += len(rd.entries)
            if need_sync:
                if stages.ON:
                    stages.mark("wal.written")
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._writer, self._sync_blocking, seq)
        if snapshot is not None:
            self.raft_storage.apply_snapshot(snapshot)
        if rd.hard_state is not None:
            self.raft_storage.set_hard_state(rd.hard_state)
        if rd.entries:
            self.raft_storage.append(rd.entries)

    def _sync_blocking(self, seq: int) -> None:
        watch = self.fsync_watch
        watch.begin()
        started = time.perf_counter()
        if stages.ON:
            stages.mark("wal.fsync_start")
        self.wal.sync_upto(seq)
        if stages.ON:
            stages.mark("wal.fsync_end")
        elapsed = time.perf_counter() - started
        self.fsync_seconds.observe(elapsed)
        watch.end(elapsed)
        self._stats["wal_syncs"] += 1

    def _write_snapshot(self, snapshot: Snapshot) -> str | None:
        # Snapshot file first, then its WAL record: a crash in between leaves a .snap the WAL
        # does not know, which recovery ignores.
        path = self._write_snapshot_file(snapshot)
        self.wal.save_snapshot(_wal_snapshot(snapshot))
        return path

    def _write_snapshot_file(
        self,
        snapshot: Snapshot,
        data_parts: list[bytes | memoryview] | None = None,
        *,
        in_child: bool = False,
    ) -> str | None:
        pb = _to_pb_snapshot(snapshot)
        if data_parts is not None:  # the data is in the parts
            pb = dataclasses.replace(pb, data=None)
        try:
            if in_child:
                return self.snapshotter.save_snap_in_child(
                    pb, data_parts, CHILD_WRITEBACK_STEP_BYTES
                )
            return self.snapshotter.save_snap(pb, data_parts)
        except OSError as exc:  # name the file (a full disk: and the free space)
            path = self._snap_path(snapshot.metadata)
            raise os_error_at(exc, path, "saving the snapshot") from exc

    def _snap_path(self, md: SnapshotMetadata) -> str:
        return os.path.join(self.cfg.snap_dir, f"{md.term:016x}-{md.index:016x}.snap")

    def _persist_with_snapshot(self, rd: Ready) -> str | None:
        """A Ready carrying a snapshot from the leader (writer thread); the file's path."""
        assert rd.snapshot is not None  # only called for such a Ready
        path = self._write_snapshot(rd.snapshot)
        self.wal.save(rd.hard_state, rd.entries, must_sync=rd.must_sync)
        self._stats["wal_syncs"] += int(rd.must_sync)
        self._stats["wal_entries"] += len(rd.entries)
        return path

    async def save_snapshot(
        self, metadata: SnapshotMetadata, data_parts: list[bytes | memoryview]
    ) -> bytes | memoryview:
        """Persist a snapshot this member's state machine made, given as the parts it was
        produced in, then release WAL segments before it. Returns the snapshot's data as
        the raft storage should keep it for followers: mapped from the file just written
        (page cache, not heap), or the parts joined if the file cannot be mapped.

        The parts are written one after the other and never joined in memory: at a million
        keys the image is a few hundred megabytes, and a joined copy doubled what a
        snapshot held at its peak. The file is written by its own thread while the WAL
        writer goes on; its WAL record follows (in the WAL writer), so a crash in between
        leaves a file recovery ignores."""
        loop = asyncio.get_running_loop()
        snapshot = Snapshot(metadata=metadata)  # its data: the parts
        path = await loop.run_in_executor(
            self._snap_writer, self._write_snapshot_file, snapshot, data_parts
        )
        await loop.run_in_executor(self._writer, self._record_snapshot_blocking, snapshot)
        self._purge_soon()
        mapped = snap.map_data(path) if path is not None else None
        if mapped is None or len(mapped) != sum(map(len, data_parts)):
            return await asyncio.to_thread(b"".join, data_parts)
        return mapped

    def write_snapshot_file_in_child(
        self, metadata: SnapshotMetadata, data_parts: list[bytes | memoryview]
    ) -> str:
        """The ``.snap`` file of one of this member's own snapshots, written by a forked
        child (``snap.forked``) that has nothing else to do: durable under its final name
        when this returns, but not yet recorded in the WAL (``record_snapshot_file``), so
        recovery ignores it until then. Flushed in smaller steps than the member's own
        writer thread flushes (a thread of the member pays for every write in the
        interpreter lock; the child does not), which keeps the WAL's fsyncs waiting less."""
        path = self._write_snapshot_file(Snapshot(metadata=metadata), data_parts, in_child=True)
        assert path is not None  # a member's own snapshot is never at index 0
        return path

    def continue_snapshot_file(
        self,
        metadata: SnapshotMetadata,
        source: SnapshotMetadata,
        source_range: tuple[int, int],
        parts: SpillFile,
        head_bytes: int,
    ) -> ForkedChild:
        """Start a process (``snap.continued``) that writes the ``.snap`` file of
        ``metadata``: its data is ``parts``' first ``head_bytes`` bytes, then the bytes
        ``source_range`` of the data of this member's snapshot file ``source``, then the rest
        of ``parts``. When it has exited cleanly the file is durable but not recorded in the
        WAL (``record_snapshot_file``), as a forked child's. Raises ``OSError`` when the
        source file cannot be opened or no process started."""
        pb = dataclasses.replace(_to_pb_snapshot(Snapshot(metadata=metadata)), data=None)
        fd = os.open(self._snap_path(source), os.O_RDONLY | os.O_CLOEXEC)
        try:
            return continued.spawn(
                self.cfg.snap_dir, pb, fd, source_range, parts.fileno(), head_bytes
            )
        finally:
            os.close(fd)

    async def record_snapshot_file(self, metadata: SnapshotMetadata) -> bytes | memoryview:
        """Record a snapshot file written by ``write_snapshot_file_in_child`` in the WAL,
        then release what it makes redundant, as ``save_snapshot`` does; returns its data,
        mapped from the file."""
        loop = asyncio.get_running_loop()
        snapshot = Snapshot(metadata=metadata)
        await loop.run_in_executor(self._writer, self._record_snapshot_blocking, snapshot)
        self._purge_soon()
        path = self._snap_path(metadata)
        mapped = snap.map_data(path)
        if mapped is None:  # not a layout this member writes: read it instead
            return (await asyncio.to_thread(snap.read_snap, path)).data or b""
        return mapped

    def _record_snapshot_blocking(self, snapshot: Snapshot) -> None:
        self.wal.save_snapshot(_wal_snapshot(snapshot))
        self.wal.release_lock_to(snapshot.metadata.index)

    def _purge_soon(self) -> None:
        """Delete the snapshot files and WAL segments beyond ``--max-snapshots`` /
        ``--max-wals`` in the purge thread; the caller does not wait. Both purges are safe
        beside the writers: the newest snapshots are kept, and a segment the WAL still
        holds is locked (``wal.purge`` skips it)."""
        try:
            future = self._purger.submit(self._purge_blocking)
        except RuntimeError:  # closed meanwhile (the member stops): the next snapshot purges
            return
        future.add_done_callback(_log_purge_failure)

    def _purge_blocking(self) -> None:
        self.snapshotter.purge(self.cfg.max_snapshots)
        wal.purge(self.cfg.wal_dir, keep=self.cfg.max_wals)

    def compact(self, index: int) -> None:
        self.raft_storage.compact(index)

    def stats(self) -> dict:
        return dict(self._stats)

    def close(self) -> None:
        self._snap_writer.shutdown(wait=True)
        self._writer.shutdown(wait=True)
        self._purger.shutdown(wait=True)
        self.wal.close()


def _log_purge_failure(future) -> None:
    # A purge that failed leaves files behind (disk space), never a member without data:
    # the next snapshot's purge tries again.
    exc = future.exception()
    if exc is not None:
        log.warning("purging old snapshot files and WAL segments failed: %s", exc)


def _mapped(snapshot: Snapshot, path: str | None) -> Snapshot:
    """``snapshot`` with its data mapped from the file just written (page cache instead of
    heap: the raft storage keeps the newest snapshot for followers that need it, hundreds of
    megabytes at a million keys), or ``snapshot`` itself if the file cannot be mapped."""
    data = snap.map_data(path) if path is not None else None
    if data is None or len(data) != len(snapshot.data):
        return snapshot
    return dataclasses.replace(snapshot, data=data)  # type: ignore[arg-type]


def _wal_exists(path: str) -> bool:
    return os.path.isdir(path) and any(n.endswith(".wal") for n in os.listdir(path))
