"""wal: raftkv's write-ahead log, etcd-compatible on disk (docs/architecture.md).

Contract
--------
``create(dir, metadata)`` builds a new log; ``open(dir, snap)`` + ``read_all()`` recovers
one from a snapshot marker and leaves it appendable; ``save(hard_state, entries)`` appends
and returns once durable under the sync policy (``always`` by default: fdatasync before
returning, shared between concurrent savers); ``GroupCommitWriter`` does the same on a
writer thread for asyncio callers; ``save_snapshot`` records that a snapshot exists;
``release_lock_to(index)`` lets ``purge`` delete what a snapshot made unnecessary;
``repair`` truncates a torn tail; ``verify``/``valid_snapshot_entries`` read without
locking. ``read_all`` never returns a wrong entry: damage is a typed error naming the
segment file and byte offset (``CorruptError`` and subclasses), a partially written tail
is ``TornWriteError`` (fixed by ``repair``, which only drops never-acknowledged bytes).

Recovery, as the node driver does it (etcd's sequence)::

    w = wal.open(dir, snap)                 # snap: newest WalSnapshot with a .snap file
    try:
        metadata, hard_state, entries = w.read_all()
    except wal.TornWriteError:              # crash mid-write: only unsynced bytes are torn
        w.close(); wal.repair(dir)          # then open + read_all again
    writer = wal.GroupCommitWriter(w)       # asyncio: await writer.append(hs, entries, snap)

Byte layout
-----------
A directory of segments ``{seq:016x}-{index:016x}.wal`` (seq from 0 up by one; index =
first raft index the segment may hold), each a sequence of 8-byte aligned frames::

    [u64 LE length word][walpb.Record][0-7 zero bytes]
    length word: low 56 bits = record length n; top byte 0x80|pad if pad = (-n) % 8 else 0
    walpb.Record = 08 <type> 10 <crc u32 varint> [1a <len> <data>]
        type 1 metadata  data = opaque bytes given to create (identical in every segment)
        type 2 entry     data = raftpb.Entry {1 type, 2 term, 3 index, 4 data}
        type 3 state     data = raftpb.HardState {1 term, 2 vote, 3 commit}
        type 4 crc       no data; crc = running CRC of everything before it
        type 5 snapshot  data = walpb.Snapshot {1 index, 2 term, 3 conf_state}

``crc`` is CRC-32C (Castagnoli) over the data of all records in write order, chained across
segments. Each segment starts with a crc record, the metadata record and the latest hard
state; the first segment then has the empty snapshot record. A zero length word (or end of
file) ends the data: segments are preallocated with zeros. The new WAL with metadata
``somedata`` begins with etcd's 72 golden bytes (tests/wal/test_golden.py).
"""

from raftpb import ConfState, Entry, HardState, WalSnapshot
from wal.errors import (
    CorruptError,
    CRCMismatchError,
    LockedError,
    MetadataMismatchError,
    SegmentNotFoundError,
    SegmentSequenceError,
    SnapshotMismatchError,
    SnapshotNotFoundError,
    TornWriteError,
    WalError,
    WalExistsError,
    WalFailedError,
    WalStateError,
)
from wal.frame import RecordType
from wal.policy import SyncMode, SyncPolicy
from wal.purge import DEFAULT_KEEP_SEGMENTS, purge
from wal.repair import repair, valid_snapshot_entries, verify
from wal.segment import parse_segment_name, segment_name
from wal.wal import DEFAULT_SEGMENT_SIZE_BYTES, WAL, create, open, open_for_read
from wal.writer import GroupCommitWriter

__all__ = [
    "DEFAULT_KEEP_SEGMENTS",
    "DEFAULT_SEGMENT_SIZE_BYTES",
    "WAL",
    "ConfState",
    "CorruptError",
    "CRCMismatchError",
    "Entry",
    "GroupCommitWriter",
    "HardState",
    "LockedError",
    "MetadataMismatchError",
    "RecordType",
    "SegmentNotFoundError",
    "SegmentSequenceError",
    "SnapshotMismatchError",
    "SnapshotNotFoundError",
    "SyncMode",
    "SyncPolicy",
    "TornWriteError",
    "WalError",
    "WalExistsError",
    "WalFailedError",
    "WalSnapshot",
    "WalStateError",
    "create",
    "open",
    "open_for_read",
    "parse_segment_name",
    "purge",
    "repair",
    "segment_name",
    "valid_snapshot_entries",
    "verify",
]
