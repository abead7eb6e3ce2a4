"""snap: raft snapshot files — write durably, load the newest one the WAL knows, quarantine
broken ones, purge old ones. etcd-compatible on disk (etcd's ``snap`` package, our code).

Directory (one per node, e.g. ``<data-dir>/member/snap``)::

    {term:016x}-{index:016x}.snap          one snapshot; newest = highest (term, index)
    {term:016x}-{index:016x}.snap.tmp      a save in progress; never read, removed on open
    {term:016x}-{index:016x}.snap.broken   quarantined by the loader; kept for inspection
    anything else                          ignored (etcd keeps its ``db`` file here)

File layout (proto2 wire format: etcd's snappb.Snapshot wrapping raftpb.Snapshot)::

    08 <varint crc>                       crc  = CRC-32C (Castagnoli) of the inner bytes
    12 <varint len> <inner>               data = the encoded raftpb.Snapshot:
        0a <varint n> <state machine data>                   field 1, absent if data is None
        12 <varint m> <SnapshotMetadata>                      field 2, always written
            0a <varint> <ConfState>   10 <varint index>   18 <varint term>

Contract:

* ``Snapshotter(dir).save_snap(snapshot)`` writes a temp file, fsyncs it, renames it to its
  final name and fsyncs the directory; only after it returns may the caller append the WAL's
  snapshot record. A crash at any point leaves either no file under the final name or a
  complete one. Index 0 (the empty snapshot) is not saved.
* ``load_newest_available(wal_snapshots)`` returns the newest snapshot whose (index, term)
  matches one of the WAL's snapshot records (``WalSnapshot``), so a file written before a
  crash but without its WAL record is never used. Corrupt files (undecodable, empty, CRC
  mismatch, name not matching the metadata) are renamed ``*.snap.broken`` and the next older
  file is tried; ``NoSnapshotError`` when nothing is left. ``load()`` ignores the WAL.
  I/O errors and ``SnapshotTooLargeError`` propagate without touching the file.
* ``purge(keep=5)`` keeps the newest ``keep`` snapshot files (0 = all) and never deletes the
  newest; ``snap_names()`` lists them newest first.

Limits: the whole payload lives in memory on both sides. Saving holds no second copy of it
(header, payload and metadata are written as separate pieces); loading etcd's field layout
holds one copy (any other layout: up to three, transiently). ``max_snapshot_bytes`` (default
8 GiB) bounds both. The CRC runs in 256 KiB steps and the payload is written/read in one
large system call (which releases the GIL), so a save or load in a worker thread delays the
event loop's thread by at most about one GIL switch interval (5 ms) at a time; the calls
themselves block, so an event loop must run them in an executor.
"""

from snap.codec import (
    CHUNK_BYTES,
    DEFAULT_MAX_SNAPSHOT_BYTES,
    EncodedSnap,
    encode_pieces,
    map_data,
    read_snap,
)
from snap.errors import (
    CorruptSnapshotError,
    CRCMismatchError,
    EmptySnapshotError,
    NameMismatchError,
    NoSnapshotError,
    SnapError,
    SnapshotDecodeError,
    SnapshotTooLargeError,
)
from snap.names import (
    BROKEN_SUFFIX,
    SNAP_SUFFIX,
    TMP_SUFFIX,
    SnapName,
    is_tmp_name,
    parse_snap_name,
)
from snap.snapshotter import DEFAULT_KEEP_SNAPSHOTS, Snapshotter

__all__ = [
    "map_data",
    "BROKEN_SUFFIX",
    "CHUNK_BYTES",
    "CRCMismatchError",
    "CorruptSnapshotError",
    "DEFAULT_KEEP_SNAPSHOTS",
    "DEFAULT_MAX_SNAPSHOT_BYTES",
    "EmptySnapshotError",
    "EncodedSnap",
    "NameMismatchError",
    "NoSnapshotError",
    "SNAP_SUFFIX",
    "SnapError",
    "SnapName",
    "SnapshotDecodeError",
    "SnapshotTooLargeError",
    "Snapshotter",
    "TMP_SUFFIX",
    "encode_pieces",
    "is_tmp_name",
    "parse_snap_name",
    "read_snap",
]
