"""raftpb: the wire encodings shared by wal/ and snap/ (and later the peer transport).

The byte layouts are etcd's protobuf messages (proto2 wire format, gogoproto's
"non-nullable" fields always written), so files written by etcd decode here and our
encoder reproduces etcd's bytes:

    raftpb.Entry            {type=1 varint, term=2 varint, index=3 varint, data=4 bytes?}
    raftpb.HardState        {term=1, vote=2, commit=3}                 (all varint, always)
    raftpb.ConfState        {voters=1*, learners=2*, voters_outgoing=3*, learners_next=4*,
                             auto_leave=5 bool}                       (* repeated, unpacked)
    raftpb.SnapshotMetadata {conf_state=1 msg, index=2, term=3}
    raftpb.Snapshot         {data=1 bytes?, metadata=2 msg}
    walpb.Record            {type=1 varint, crc=2 varint (uint32), data=3 bytes?}
    walpb.Snapshot          {index=1, term=2, conf_state=3 msg?}
    snappb.Snapshot         {crc=1 varint (uint32), data=2 bytes}

"?" marks a field written only when present (None means absent; b"" is present and empty).
Decoders skip unknown fields, and raise DecodeError on truncated or malformed input.
Nothing here imports raft/: the value types below are plain frozen dataclasses whose field
sets match raft's, so the node driver converts between them without loss.
"""

from raftpb.crc import crc32c
from raftpb.messages import (
    ConfState,
    ConfStateFields,
    Entry,
    EntryFields,
    HardState,
    HardStateFields,
    Record,
    SnapFile,
    Snapshot,
    SnapshotFields,
    SnapshotMetadata,
    SnapshotMetadataFields,
    WalSnapshot,
    WalSnapshotFields,
    decode_conf_state,
    decode_entry,
    decode_hard_state,
    decode_record,
    decode_snap_file,
    decode_snapshot,
    decode_wal_snapshot,
    encode_conf_state,
    encode_entry,
    encode_hard_state,
    encode_record,
    encode_snap_file,
    encode_snapshot,
    encode_wal_snapshot,
)
from raftpb.wire import DecodeError

__all__ = [
    "ConfState",
    "ConfStateFields",
    "DecodeError",
    "Entry",
    "EntryFields",
    "HardState",
    "HardStateFields",
    "Record",
    "SnapFile",
    "Snapshot",
    "SnapshotFields",
    "SnapshotMetadata",
    "SnapshotMetadataFields",
    "WalSnapshot",
    "WalSnapshotFields",
    "crc32c",
    "decode_conf_state",
    "decode_entry",
    "decode_hard_state",
    "decode_record",
    "decode_snap_file",
    "decode_snapshot",
    "decode_wal_snapshot",
    "encode_conf_state",
    "encode_entry",
    "encode_hard_state",
    "encode_record",
    "encode_snap_file",
    "encode_snapshot",
    "encode_wal_snapshot",
]
