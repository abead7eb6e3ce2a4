"""Point-in-time restore from an archive (``raftkv restore --from URL ...``).

``restore(store, point, target)`` builds a NEW cluster's data directory (as ``snapshot
restore`` does: ``kvserver.archive.datadir``) holding the state at exactly ``point``:

* ``Point(revision=N)``: the state right after the entry that made revision N;
* ``Point(time=T)``: the state at the newest commit index the archive had reached at unix
  time T (the manifest's timeline; its precision is one archive pass);
* ``Point()`` (latest): the last commit index found in the archive.

How: pick one member's manifest (``member``, else the member whose archive reaches
furthest); take the newest archived snapshot at or before the point (or the empty state, if
the log is archived from its first segment) whose WAL snapshot record is archived too (the
archiver lists only such snapshots; an archive written before it did may list a file the
member never recorded, which the WAL reader cannot start after: the next older base is used,
as the member's own recovery ignores such a file); download it and the WAL segments from the one
holding its record onwards, checking every object's size and CRC-32C against the manifest
(a missing or damaged object is an ``ArchiveError`` naming it, never skipped); read them
with ``wal``'s reader (an entry rewritten by a later term replaces the old one, Raft fig. 7);
replay only entries at or below the last commit index found in the log into a fresh state
machine; stop at the point. Conf changes are not replayed: the restored cluster's members
come from the flags.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import raftpb
import snap
import wal
from kvserver.archive.datadir import RestoredMember, RestoreTarget, build_data_dir
from kvserver.archive.manifest import MANIFEST, Manifest, SnapshotObject
from kvserver.archive.store import ArchiveError, ObjectStore
from kvserver.membership.identity import decode_metadata
from kvserver.membership.registry import split_members_frame
from kvserver.server.node import PROPOSAL_HEADER_BYTES, ApplyInSteps, NodeOptions
from kvserver.server.replicated_kv import RaftKV
from raft import EntryType

Progress = Callable[[str], None]


class ReplayOnly:
    """The node under a state machine that is only replayed: committed entries are applied
    to it directly, so it never proposes, reads through raft or leads."""

    term = leader = applied = 0
    is_leader = False
    opts = NodeOptions()

    async def propose(self, payload: bytes) -> object:
        raise ArchiveError("a point-in-time replay does not propose")

    async def read_barrier(self) -> int:
        raise ArchiveError("a point-in-time replay has no raft to read through")

    async def wait_recovered(self) -> None:
        return None

    def status(self) -> dict:
        raise ArchiveError("a point-in-time replay has no raft status")

    def health_problem(self) -> str:
        return ""

    def transfer_leadership(self, transferee: int) -> None:
        raise ArchiveError("a point-in-time replay has no leader to move")


@dataclass(frozen=True)
class Point:
    revision: int | None = None
    time: float | None = None

    def describe(self) -> str:
        if self.revision is not None:
            return f"revision {self.revision}"
        if self.time is not None:
            return f"time {self.time}"
        return "the latest archived commit"


@dataclass(frozen=True)
class PitrResult:
    revision: int
    index: int
    base_index: int
    entries_replayed: int
    member_id: int
    cluster_id: int
    restored: RestoredMember


def load_manifests(store: ObjectStore, cluster: str | None = None) -> list[Manifest]:
    names = [n for n in store.list("") if n.endswith("/" + MANIFEST) and n.count("/") == 2]
    out = [Manifest.from_json(store.get(n), store.where(n)) for n in names]
    if cluster:
        out = [
            m
            for m in out
            if f"{m.cluster_id:x}" == cluster.lower().lstrip("0x")
            or f"{m.cluster_id:016x}" == cluster.lower()
        ]
    if not out:
        raise ArchiveError(
            f"no archive manifest under {store.url}"
            + (f" for cluster {cluster}" if cluster else "")
        )
    clusters = {m.cluster_id for m in out}
    if len(clusters) > 1:
        raise ArchiveError(
            "the archive holds several clusters ("
            + ", ".join(f"{c:x}" for c in sorted(clusters))
            + "): choose one with --cluster-id"
        )
    return out


def choose_member(manifests: list[Manifest], member: str | None) -> Manifest:
    if member:
        for m in manifests:
            if member in (m.name, f"{m.member_id:x}", f"{m.member_id:016x}"):
                return m
        raise ArchiveError(
            f"no archive of member {member!r} (have: "
            + ", ".join(f"{m.name or '?'}={m.member_id:x}" for m in manifests)
            + ")"
        )
    return max(manifests, key=lambda m: (m.commit, m.member_id))


def _target_index(m: Manifest, point: Point) -> int:
    if point.time is not None:
        reached = [int(c) for t, c in m.timeline if t <= point.time]
        if not reached:
            raise ArchiveError(
                f"nothing of member {m.member_id:x} was archived at or before time {point.time}"
            )
        return max(reached)
    return m.commit


def _bases(m: Manifest, point: Point, index: int) -> list[SnapshotObject | None]:
    """The bases a restore to ``point`` may start from, best (newest) first: the archived
    snapshots at or before it, then the empty state (None) when the whole log is archived."""
    if point.revision is not None:
        fits = [s for s in m.snapshots if s.revision <= point.revision]
    else:
        fits = [s for s in m.snapshots if s.index <= index]
    fits.sort(key=lambda s: s.index, reverse=True)
    out: list[SnapshotObject | None] = list(fits)
    if m.segments and m.segments[0].seq == 0:
        out.append(None)  # the whole log is archived: replay from the empty state
    if out:
        return out
    raise ArchiveError(
        f"no archived snapshot at or before {point.describe()} and the log is "
        f"not archived from its beginning (retention removed it?)"
    )


def restore_base(
    store: ObjectStore, m: Manifest, base: SnapshotObject | None, kv: RaftKV, work: str
) -> raftpb.WalSnapshot:
    """Restore ``kv`` from the archived snapshot ``base`` of member ``m`` (downloaded into
    ``work``, checked against the manifest's size and CRC); the WAL position it covers, from
    which the archived log is replayed. No base: the empty state, replayed from the start."""
    if base is None:
        return raftpb.WalSnapshot()
    data = store.get_verified(f"{m.member_prefix}/{base.object}", base.size, base.crc32c)
    path = os.path.join(work, os.path.basename(base.object))
    with open(path, "wb") as f:
        f.write(data)
    pb = snap.read_snap(path)
    _, rest = split_members_frame(pb.data or b"")
    kv.restore(rest)
    return raftpb.WalSnapshot(pb.metadata.index, pb.metadata.term)


def fetch_segments(
    store: ObjectStore, m: Manifest, base_index: int, wal_dir: str, progress: Progress
) -> None:
    segs = m.segments
    start = 0
    for i, seg in enumerate(segs):
        if seg.first_index <= base_index:
            start = i
    os.makedirs(wal_dir)
    prev_seq = None
    for seg in segs[start:]:
        if prev_seq is not None and seg.seq != prev_seq + 1:
            missing = wal.segment_name(prev_seq + 1, 0)[:16]
            raise ArchiveError(
                f"archive of member {m.member_id:x} lacks WAL segment seq "
                f"{missing} (between {segs[start].name} and {seg.name}): "
                f"{store.where(m.member_prefix + '/wal/')}"
            )
        prev_seq = seg.seq
        offset = 0
        with open(os.path.join(wal_dir, seg.name), "wb") as f:
            for part in seg.parts:
                if part.offset != offset:
                    raise ArchiveError(
                        f"archive of {seg.name} has a hole at byte {offset} "
                        f"(next part {store.where(m.member_prefix + '/' + part.object)})"
                    )
                f.write(
                    store.get_verified(f"{m.member_prefix}/{part.object}", part.size, part.crc32c)
                )
                offset += part.size
        progress(f"fetched {seg.name} ({offset} bytes, {len(seg.parts)} parts)")


def _new_kv(m: Manifest) -> RaftKV:
    # RaftKV is typed for a live member (a raft Node, membership); a replay needs neither.
    return RaftKV(
        cluster_id=m.cluster_id,
        member_id=m.member_id,
        name=m.name,
        members=(),
        node=ReplayOnly(),
        membership=None,  # no member calls are answered here
    )


def _describe(base: SnapshotObject | None) -> str:
    if base is None:
        return "the empty state"
    return f"snapshot at index {base.index} (revision {base.revision})"


def _open_base(
    store: ObjectStore,
    m: Manifest,
    bases: list[SnapshotObject | None],
    work: str,
    progress: Progress,
) -> tuple[SnapshotObject | None, RaftKV, raftpb.WalSnapshot, bytes, raftpb.HardState, list]:
    """The first of ``bases`` whose WAL snapshot record the archived log holds: (base, the
    state machine restored from it, its WAL position, and the log read after it)."""
    for i, base in enumerate(bases):
        kv = _new_kv(m)
        try:
            ws = restore_base(store, m, base, kv, work)
            if base is not None:
                progress(f"restored base snapshot {base.object} (revision {kv.store.revision})")
            wal_dir = os.path.join(work, "wal")
            shutil.rmtree(wal_dir, ignore_errors=True)
            fetch_segments(store, m, ws.index, wal_dir, progress)
            w = wal.open_for_read(wal_dir, ws)
            try:
                meta, hs, entries = w.read_all()
            except wal.SnapshotNotFoundError:
                if i + 1 == len(bases):
                    raise ArchiveError(
                        f"the archived WAL of member {m.member_id:x} holds no record of "
                        f"the {_describe(base)}, and no older base is archived"
                    ) from None
                progress(
                    f"skipping the {_describe(base)}: the archived WAL holds no record "
                    f"of it (a file the member never recorded); trying the "
                    f"{_describe(bases[i + 1])}"
                )
                kv.watch_hub.close()
                continue
            except wal.CorruptError as exc:
                raise ArchiveError(
                    f"archived WAL of member {m.member_id:x} does not read: "
                    f"{os.path.basename(exc.file)} at offset {exc.offset}: "
                    f"{exc.reason}"
                ) from exc
            finally:
                w.close()
        except BaseException:
            kv.watch_hub.close()
            raise
        return base, kv, ws, meta, hs, entries
    raise AssertionError("no bases")  # _bases returns at least one or raises


def restore(
    store: ObjectStore,
    point: Point,
    target: RestoreTarget,
    *,
    cluster: str | None = None,
    member: str | None = None,
    progress: Progress = lambda _: None,
) -> PitrResult:
    m = choose_member(load_manifests(store, cluster), member)
    index_limit = _target_index(m, point)
    bases = _bases(m, point, index_limit)
    progress(
        f"member {m.member_id:x} ({m.name or '?'}) of cluster {m.cluster_id:x}: "
        f"archive reaches commit {m.commit}; base {_describe(bases[0])}"
    )
    work = tempfile.mkdtemp(prefix="raftkv-pitr-")
    kv = None
    try:
        _, kv, ws, meta, hs, entries = _open_base(store, m, bases, work, progress)
        if decode_metadata(meta) != (m.member_id, m.cluster_id):
            raise ArchiveError("the archived WAL belongs to another member or cluster")
        commit = min(hs.commit, index_limit)
        applied, replayed = ws.index, 0
        if point.revision is not None and kv.store.revision > point.revision:
            raise ArchiveError(f"base revision {kv.store.revision} is past {point.describe()}")
        for e in entries:
            if point.revision is not None and kv.store.revision >= point.revision:
                break
            if e.index > commit:
                break
            if e.index != applied + 1:
                raise ArchiveError(
                    f"archived log jumps from index {applied} to {e.index} "
                    f"(a snapshot from the leader?): no snapshot covers it"
                )
            if e.type == EntryType.NORMAL and e.data and len(e.data) > PROPOSAL_HEADER_BYTES:
                result = kv.apply(e.index, bytes(e.data[PROPOSAL_HEADER_BYTES:]))
                if type(result) is ApplyInSteps:  # a delete of many keys: apply all of it
                    result.run_now()
            applied = e.index
            replayed += 1
            if replayed % 10000 == 0:
                progress(
                    f"replayed {replayed} entries (index {applied}, revision {kv.store.revision})"
                )
        if point.revision is not None and kv.store.revision != point.revision:
            raise ArchiveError(
                f"the archive of member {m.member_id:x} reaches revision "
                f"{kv.store.revision} (commit index {commit}), not "
                f"{point.describe()}"
            )
        progress(f"replayed {replayed} entries: index {applied}, revision {kv.store.revision}")
        image = b"".join(kv.snapshot_chunks())
        restored = build_data_dir(image, target)
        return PitrResult(
            kv.store.revision, applied, ws.index, replayed, m.member_id, m.cluster_id, restored
        )
    finally:
        if kv is not None:
            kv.watch_hub.close()
        shutil.rmtree(work, ignore_errors=True)
