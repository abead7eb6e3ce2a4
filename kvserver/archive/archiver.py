"""Continuous archive of one member: snapshot files and WAL segments to an ObjectStore.

``Archiver(store, data_dir, cluster_id=..., member_id=...)``: ``open()`` loads (or starts)
the member's manifest (``kvserver.archive.manifest``), deletes leftover temporary objects
and re-checks the last archived part of every open segment against the local file (a WAL
whose torn tail was repaired after a crash may differ there: such parts are dropped and
uploaded again). ``run_once()`` is one pass:

1. every WAL segment's bytes beyond what is archived go up as one new part. The end of the
   live segment comes from ``tail()`` (in ``raftkv serve``: the WAL's own write offset, so
   only complete writes are read); without ``tail`` (``raftkv archive`` on a data dir) a
   segment locked by a running member is left alone until it is cut, and an unlocked one is
   read up to its last complete frame. A segment is closed once a later one exists and its
   parts reach its end;
2. every local ``.snap`` file newer than the newest archived snapshot is uploaded (its
   revision read from it) once the archived parts hold its WAL snapshot record. A member
   writes the file first and records it in its WAL after (``kvserver.server.node_storage``);
   until then the file is not the member's snapshot (a member stopped in between, or one
   whose snapshot from the leader came first, never records it, and its recovery ignores
   it), and a restore from it could not replay the log: the WAL reader needs the record to
   start after it. Hence segments before snapshots in a pass (the record of a file listed
   after them is in the parts already archived, or in a later pass's). The new parts are
   searched for snapshot records only while a file waits for its record (a walk over their
   length words, see ``snapshot_records``): a snapshot is rare, a part of entries is not;
3. the manifest is written (only when something changed), after every object it names;
4. retention: with ``retention`` N > 0 only the N newest snapshots are kept, with the
   segments needed to replay forward from the oldest of them (objects are deleted after the
   manifest that drops them).

Each object is written under a temporary name and moved into place; an object already at
its final name with the right size and CRC (a crash between upload and manifest) is reused,
not uploaded again. Failures leave the manifest as it was; the next pass retries.

``ArchiverThread`` runs passes every ``interval_s`` on its own thread (the member's event
loop never waits for the archive; at most one pass runs at a time, so memory is bounded by
one part or snapshot file) and a last pass at stop. Loss window of the archive: what was
written since the last pass (``interval_s`` plus the upload time), and entries are only
restorable up to the last hard state's commit index found in the archived bytes.
``lag()`` is ``(entries, seconds)``: local last index minus archived last index, and the age
of the oldest write not archived yet (measured from the start of the newest pass that
archived everything written before it began).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

import msgpack

import raftpb
import snap
from kvserver.archive.manifest import MANIFEST, Manifest, Part, Segment, SnapshotObject
from kvserver.archive.store import ArchiveError, ObjectStore, crc_of
from kvserver.auth.store import split_auth_frame
from kvserver.lease.snapshot import split_snapshot
from kvserver.membership.registry import split_members_frame
from kvserver.server.alarms import split_alarm_frame
from wal.decoder import BadRecord, iter_raw_records
from wal.frame import RecordType
from wal.segment import is_locked, list_segments

log = logging.getLogger(__name__)

MAX_PART_BYTES = 64 << 20


# (tail segment path, end of its complete writes, last index, commit): see ``wal_tail``
Tail = tuple[str, int, int, int]


def wal_tail(w) -> Tail | None:
    """(tail segment path, end of its complete writes, last index, commit) of an open
    ``wal.WAL``, as of one moment (``WAL.tail_position``)."""
    pos = w.tail_position()
    if pos is None:
        return None
    path, end, last_index, hard_state = pos
    return path, end, last_index, hard_state.commit


def _frame_spans(buf, start: int = 0) -> Iterator[tuple[int, int]]:
    """(start, end) of each complete frame in ``buf`` from ``start``, found by their length
    words alone (nothing is decoded or checked)."""
    pos, n = start, len(buf)
    while pos + 8 <= n:
        lw = int.from_bytes(buf[pos : pos + 8], "little")
        if not lw:
            return
        rl = lw & ((1 << 56) - 1)
        top = lw >> 56
        end = pos + 8 + rl + (top - 0x80 if top else 0)
        if end > n:
            return
        yield pos, end
        pos = end


def frames_end(buf, start: int = 0) -> int:
    """Offset of the end of the last complete frame in ``buf`` from ``start``."""
    end = start
    for span in _frame_spans(buf, start):
        end = span[1]
    return end


def scan_part(data: bytes) -> tuple[int, int, list[tuple[int, int]]]:
    """(last entry index, last hard-state commit, (index, term) of every snapshot record)
    among the frames of a part (0 if none)."""
    last_entry = None
    commit = 0
    snapshots = []
    try:
        for rec in iter_raw_records(data):
            if rec.type == RecordType.ENTRY and rec.data is not None:
                last_entry = rec.data
            elif rec.type == RecordType.STATE and rec.data is not None:
                commit = raftpb.decode_hard_state(rec.data).commit
            elif rec.type == RecordType.SNAPSHOT and rec.data is not None:
                ws = raftpb.decode_wal_snapshot(rec.data)
                commit = max(commit, ws.index)
                snapshots.append((ws.index, ws.term))
    except BadRecord:
        pass  # a torn end of a part is not ours to judge here; restore verifies the log
    index = raftpb.decode_entry(last_entry).index if last_entry is not None else 0
    return index, commit, snapshots


def snapshot_records(buf: bytes | memoryview) -> list[tuple[int, int]]:
    """(index, term) of the WAL snapshot records among the complete frames of ``buf``.

    The frames are walked by their length words and only a snapshot record (or a record not
    in etcd's canonical layout, which writes the type first: bytes 0x08, type) is decoded:
    a tenth of what decoding every record as ``scan_part`` costs (0.8 against 9.8 us a
    frame for 200,000 entries on a loaded 2-core machine), and the interpreter lock is held
    as much less. A damaged frame is skipped: restore verifies the log."""
    out: list[tuple[int, int]] = []
    for pos, end in _frame_spans(buf):
        if end - pos < 10 or buf[pos + 8] != 0x08 or buf[pos + 9] == RecordType.SNAPSHOT:
            try:
                for rec in iter_raw_records(bytes(buf[pos:end])):
                    if rec.type == RecordType.SNAPSHOT and rec.data is not None:
                        ws = raftpb.decode_wal_snapshot(rec.data)
                        out.append((ws.index, ws.term))
            except (BadRecord, raftpb.DecodeError):
                pass
    return out


def _note_snapshots(seg: Segment, records: list[tuple[int, int]]) -> bool:
    """Add snapshot records found in ``seg``'s archived bytes; whether any was new."""
    have = {(i, t) for i, t in seg.snapshots}
    new = [[i, t] for i, t in records if (i, t) not in have]
    seg.snapshots += new
    return bool(new)


def snapshot_revision(snapshot: raftpb.Snapshot) -> int:
    """The MVCC revision inside a member's raft snapshot data."""
    _, rest = split_members_frame(snapshot.data or b"")
    _, rest = split_alarm_frame(rest)  # present while an alarm is raised
    _, rest = split_auth_frame(rest)  # present once auth was used
    _, mvcc = split_snapshot(rest)
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(bytes(mvcc[:4096]))
    header = next(unpacker)
    return int(header["revision"])


class Archiver:
    def __init__(
        self,
        store: ObjectStore,
        data_dir: str,
        *,
        cluster_id: int,
        member_id: int,
        name: str = "",
        retention: int = 0,
        tail: Callable[[], Tail | None] | None = None,
        last_index: Callable[[], int] | None = None,
    ):
        self.store = store
        self.snap_dir = os.path.join(data_dir, "member", "snap")
        self.wal_dir = os.path.join(data_dir, "member", "wal")
        self.cluster_id = cluster_id
        self.member_id = member_id
        self.name = name
        self.retention = retention
        self.tail = tail
        self.last_index = last_index
        self.manifest: Manifest | None = None
        self.stats = {
            "uploaded_bytes": 0,
            "uploaded_objects": 0,
            "reused_objects": 0,
            "errors": 0,
            "passes": 0,
        }
        self.last_error: str | None = None
        # The start of the newest pass that archived everything written before it began: the
        # archive holds every write older than this moment (lag seconds are measured from it).
        self._may_hold_unlisted = True
        self._covered_at: float | None = None
        self._opened_at = time.monotonic()
        self._local_last = 0
        self._newest_mtime = 0.0  # when the newest archived data was written (timeline)
        # (segment, offset, size) of the parts archived without a search for snapshot records
        # (no file waited for its record) since the snapshot directory was last found without
        # a waiting file: a file that appears later may have its record in one of them. Kept
        # across a failed pass; emptied by the next listing that finds no waiting file.
        self._unsearched: list[tuple[Segment, int, int]] = []

    @property
    def prefix(self) -> str:
        return Manifest.prefix(self.cluster_id, self.member_id)

    def _name(self, rel: str) -> str:
        return f"{self.prefix}/{rel}"

    # --- opening and resuming -----------------------------------------------------------

    def open(self) -> Manifest:
        """Load (or start) the manifest and resume; returns it (also ``self.manifest``)."""
        mname = self._name(MANIFEST)
        if self.store.exists(mname):
            m = Manifest.from_json(self.store.get(mname), self.store.where(mname))
            if (m.cluster_id, m.member_id) != (self.cluster_id, self.member_id):
                raise ArchiveError(f"{self.store.where(mname)} belongs to another member")
        else:
            m = Manifest(self.cluster_id, self.member_id, self.name)
        self.manifest = m
        # (a part archived unsearched before a restart is not searched again: a snapshot whose
        # record it holds is not archived, a later one is; never a base without its record)
        self._unsearched = []
        self._may_hold_unlisted = True  # a crash may have left uploads the manifest lacks
        self.store.remove_temporaries(self.prefix)
        dropped = self._recheck_open_segments(m)
        if dropped:
            self._write_manifest(m)
            for obj in dropped:
                self.store.delete(self._name(obj))  # manifest names are relative
        return m

    def _recheck_open_segments(self, m: Manifest) -> list[str]:
        dropped = []
        for seg in m.segments:
            if seg.closed or not seg.parts:
                continue
            path = os.path.join(self.wal_dir, seg.name)
            try:
                with open(path, "rb") as f:
                    keep = []
                    for part in seg.parts:
                        f.seek(part.offset)
                        data = f.read(part.size)
                        if len(data) != part.size or crc_of(data) != part.crc32c:
                            break
                        keep.append(part)
            except FileNotFoundError:
                continue  # purged locally: what is archived stays as it is
            if len(keep) != len(seg.parts):
                log.warning(
                    "archive: %s differs from the local file after %d bytes "
                    "(repaired tail?); archiving it again from there",
                    seg.name,
                    sum(p.size for p in keep),
                )
                dropped += [p.object for p in seg.parts[len(keep) :]]
                seg.parts = keep
                seg.last_index, seg.commit, records = self._scan_parts(seg)
                seg.snapshots = [[i, t] for i, t in records]
        return dropped

    def _scan_parts(self, seg: Segment) -> tuple[int, int, list[tuple[int, int]]]:
        path = os.path.join(self.wal_dir, seg.name)
        with open(path, "rb") as f:
            data = f.read(seg.size)
        return scan_part(data)

    # --- one pass -----------------------------------------------------------------------

    def run_once(self) -> bool:
        m = self.manifest if self.manifest is not None else self.open()
        started = time.monotonic()
        target = self.last_index() if self.last_index is not None else None
        try:
            # Segments first: see the module docstring (2.).
            changed = self._archive_segments(m, bool(self._waiting_snapshots(m)))
            changed = self._archive_snapshots(m) or changed
            if changed:
                commit = m.commit
                if not m.timeline or m.timeline[-1][1] < commit:
                    m.timeline.append([round(self._newest_mtime, 3), commit])
                self._write_manifest(m)
        except BaseException:
            self._may_hold_unlisted = True  # uploaded objects may not be in the manifest
            raise
        self._may_hold_unlisted = False
        removed = self._apply_retention(m) if self.retention else []
        if removed:
            self._write_manifest(m)
            for obj in removed:
                self.store.delete(self._name(obj))  # manifest names are relative
        self.stats["passes"] += 1
        self._update_lag(m, started, target)
        return changed

    def _upload(self, rel: str, data: bytes) -> tuple[str, int]:
        name = self._name(rel)
        crc = crc_of(data)
        # Only after a crash or a failed pass can an object exist that the manifest does not
        # list yet; otherwise asking the store first (a HEAD per part on S3) is wasted I/O.
        if (
            self._may_hold_unlisted
            and self.store.size(name) == len(data)
            and crc_of(self.store.get(name)) == crc
        ):
            self.stats["reused_objects"] += 1  # uploaded before a crash: not again
            return rel, crc
        self.store.put(name, data)
        self.stats["uploaded_bytes"] += len(data)
        self.stats["uploaded_objects"] += 1
        return rel, crc

    def _waiting_snapshots(self, m: Manifest) -> list[tuple[str, snap.SnapName]]:
        """The local ``.snap`` files newer than the newest archived snapshot, oldest first.
        Older ones are archived already or never will be: a member records its snapshots in
        its WAL in index order, so a file older than a recorded one was never recorded."""
        try:
            names = sorted(os.listdir(self.snap_dir))
        except FileNotFoundError:
            return []
        newest = m.snapshots[-1].index if m.snapshots else 0
        out = []
        for fname in names:
            sn = snap.parse_snap_name(fname)
            if sn is not None and fname.endswith(snap.SNAP_SUFFIX) and sn.index > newest:
                out.append((fname, sn))
        return sorted(out, key=lambda f: (f[1].index, f[1].term))

    def _search_parts(self) -> bool:
        """Search the parts archived without a search for snapshot records (read back from
        the local segment); whether a record was found."""
        found = False
        for seg, offset, size in self._unsearched:
            try:
                with open(os.path.join(self.wal_dir, seg.name), "rb") as f:
                    f.seek(offset)
                    data = f.read(size)
            except FileNotFoundError:
                continue  # purged: a segment holding a new snapshot's record is not
            found = _note_snapshots(seg, snapshot_records(data)) or found
        self._unsearched.clear()
        return found

    def _archive_snapshots(self, m: Manifest) -> bool:
        waiting = self._waiting_snapshots(m)
        if not waiting:
            self._unsearched.clear()  # no record of a later file is in them
            return False
        changed = self._search_parts()
        recorded = m.recorded_snapshots()
        for fname, sn in waiting:
            if (sn.index, sn.term) not in recorded:
                continue  # not the member's snapshot (yet): see the module docstring
            rel = f"snap/{fname}"
            path = os.path.join(self.snap_dir, fname)
            try:
                with open(path, "rb") as f:
                    data = f.read()
                decoded = snap.read_snap(path)
            except FileNotFoundError:
                continue  # purged meanwhile
            except snap.SnapError as exc:
                log.warning("archive: skipping unreadable snapshot %s: %s", path, exc)
                continue
            revision = snapshot_revision(decoded)
            rel, crc = self._upload(rel, data)
            m.snapshots.append(SnapshotObject(rel, sn.index, sn.term, revision, len(data), crc))
            m.snapshots.sort(key=lambda s: (s.index, s.term))
            self._newest_mtime = max(self._newest_mtime, time.time())
            changed = True
        return changed

    def _archive_segments(self, m: Manifest, search: bool) -> bool:
        """Archive new WAL bytes; with ``search`` their snapshot records are noted in the
        manifest, else a part that was not decoded is left for ``_search_parts``."""
        try:
            local = list_segments(self.wal_dir)
        except FileNotFoundError:
            return False
        floor_seq = m.segments[0].seq if (self.retention and m.segments and m.snapshots) else 0
        tail = self.tail() if self.tail is not None else None
        changed = False
        for i, sn in enumerate(local):
            if sn.seq < floor_seq:
                continue
            name = sn.name
            seg = m.segment(name)
            if seg is not None and seg.closed:
                continue
            path = os.path.join(self.wal_dir, name)
            is_last = i == len(local) - 1
            try:
                st = os.stat(path)
                if not is_last:
                    end = st.st_size
                elif tail is not None:
                    if os.path.basename(tail[0]) != name:
                        continue  # cut since we listed: next pass
                    end = tail[1]
                elif self.tail is None and not is_locked(path):
                    with open(path, "rb") as f:
                        end = frames_end(f.read())
                else:
                    continue  # a running member's live segment: archived once it is cut
                if seg is None:
                    seg = Segment(name, sn.seq, sn.index)
                    m.segments.append(seg)
                    m.segments.sort(key=lambda s: s.seq)
                    changed = True
                start = seg.size
                if end > start:
                    with open(path, "rb") as f:
                        f.seek(start)
                        data = f.read(min(end - start, MAX_PART_BYTES))
                    if not is_last or tail is None:
                        data = data[: frames_end(data)]
                    if data:
                        rel, crc = self._upload(f"wal/{name}.{start:016x}", data)
                        seg.parts.append(Part(rel, start, len(data), crc))
                        if is_last and tail is not None and start + len(data) == end:
                            # The part ends where the WAL's own tail was: its last index and
                            # commit are known without decoding every record in Python
                            # (which would hold the GIL against the member's event loop).
                            last, commit = tail[2], tail[3]
                            if search:
                                _note_snapshots(seg, snapshot_records(data))
                            else:
                                self._unsearched.append((seg, start, len(data)))
                        else:
                            last, commit, records = scan_part(data)
                            _note_snapshots(seg, records)
                        seg.last_index = max(seg.last_index, last)
                        seg.commit = max(seg.commit, commit)
                        self._newest_mtime = max(self._newest_mtime, min(st.st_mtime, time.time()))
                        changed = True
                if not is_last and seg.size >= st.st_size:
                    seg.closed = True
                    changed = True
            except FileNotFoundError:
                log.warning("archive: %s was purged before it was archived", path)
                continue
        if self.last_index is not None:
            self._local_last = self.last_index()
        elif local:
            self._local_last = max(self._local_last, m.last_index)
        return changed

    def _apply_retention(self, m: Manifest) -> list[str]:
        if len(m.snapshots) <= self.retention:
            return []
        keep_snaps = m.snapshots[-self.retention :]
        oldest = keep_snaps[0]
        # the last segment that may hold the oldest kept snapshot's record, and all after it
        start = 0
        for i, seg in enumerate(m.segments):
            if seg.first_index <= oldest.index:
                start = i
        removed = [s.object for s in m.snapshots[: -self.retention]]
        removed += [p.object for seg in m.segments[:start] for p in seg.parts]
        m.snapshots = keep_snaps
        m.segments = m.segments[start:]
        m.timeline = [t for t in m.timeline if t[1] >= oldest.index] or m.timeline[-1:]
        return removed

    def _write_manifest(self, m: Manifest) -> None:
        m.updated_unix = round(time.time(), 3)
        if len(m.timeline) > 100_000:
            m.timeline = m.timeline[-100_000:]
        self.store.put(self._name(MANIFEST), m.to_json())

    # --- lag ----------------------------------------------------------------------------

    def _update_lag(self, m: Manifest, started: float, target: int | None) -> None:
        if target is None:
            target = self._local_last
        if m.last_index >= target:
            self._covered_at = started

    def lag(self) -> tuple[int, float]:
        """(entries written locally but not archived yet, seconds since the archive last held
        everything written before a moment): under a steady load about one pass interval
        plus a pass's duration, not the time since the archive was last fully idle."""
        if self.manifest is None:
            return 0, 0.0
        local = self.last_index() if self.last_index is not None else self._local_last
        entries = max(0, local - self.manifest.last_index)
        if not entries:
            return 0, 0.0
        since = self._covered_at if self._covered_at is not None else self._opened_at
        return entries, time.monotonic() - since


class ArchiverThread:
    """Runs ``archiver.run_once`` every ``interval_s`` on a daemon thread; never raises into
    the member (errors are logged, counted and retried next pass)."""

    def __init__(self, archiver: Archiver, interval_s: float = 1.0):
        self.archiver = archiver
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="archiver", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _pass(self) -> None:
        try:
            self.archiver.run_once()
            self.archiver.last_error = None
        except Exception as exc:  # a flaky store: retried next pass
            self.archiver.stats["errors"] += 1
            self.archiver.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("archive pass failed (retrying): %s", self.archiver.last_error)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._pass()
        self._pass()  # last pass at stop: what was written before the stop is archived

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
