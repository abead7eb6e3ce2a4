"""etcd's raftpb / walpb / snappb messages as frozen dataclasses with encode/decode.

Field numbers and which fields are always written follow etcd's generated gogoproto code,
so ``encode_*`` reproduces etcd's bytes and ``decode_*`` reads etcd's files. See the
package docstring for the layouts.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from raftpb.wire import (
    BYTES,
    VARINT,
    Buf,
    DecodeError,
    bytes_field,
    bytes_value,
    decode_varint,
    encode_varint,
    iter_fields,
    uint_field,
    uint_value,
)

_U32 = (1 << 32) - 1


@dataclass(frozen=True, slots=True)
class Entry:
    term: int
    index: int
    type: int = 0  # 0 normal, 1 conf change, 2 conf change v2
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class HardState:
    term: int = 0
    vote: int = 0
    commit: int = 0

    def is_empty(self) -> bool:
        return self.term == 0 and self.vote == 0 and self.commit == 0


@dataclass(frozen=True, slots=True)
class ConfState:
    voters: tuple[int, ...] = ()
    learners: tuple[int, ...] = ()
    voters_outgoing: tuple[int, ...] = ()
    learners_next: tuple[int, ...] = ()
    auto_leave: bool = False


@dataclass(frozen=True, slots=True)
class SnapshotMetadata:
    conf_state: ConfState = field(default_factory=ConfState)
    index: int = 0
    term: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A raft snapshot: the state machine image ``data`` as of ``metadata.index``."""

    data: bytes | None = None
    metadata: SnapshotMetadata = field(default_factory=SnapshotMetadata)


@dataclass(frozen=True, slots=True)
class WalSnapshot:
    """The WAL's marker that a snapshot at index/term exists (walpb.Snapshot)."""

    index: int = 0
    term: int = 0
    conf_state: ConfState | None = None


@dataclass(frozen=True, slots=True)
class Record:
    type: int
    crc: int = 0
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class SnapFile:
    """The content of a .snap file (snappb.Snapshot): CRC-32C of ``data`` and ``data``."""

    crc: int
    data: bytes


# --- what the encoders read ------------------------------------------------------------
# The encoders take raftpb's dataclasses above or raft's own (raft.types), whose fields have
# the same names; these protocols name the fields each encoder reads.


class EntryFields(Protocol):
    @property
    def type(self) -> int: ...
    @property
    def term(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def data(self) -> bytes | None: ...


class HardStateFields(Protocol):
    @property
    def term(self) -> int: ...
    @property
    def vote(self) -> int: ...
    @property
    def commit(self) -> int: ...


class ConfStateFields(Protocol):
    @property
    def voters(self) -> Iterable[int]: ...
    @property
    def learners(self) -> Iterable[int]: ...
    @property
    def voters_outgoing(self) -> Iterable[int]: ...
    @property
    def learners_next(self) -> Iterable[int]: ...
    @property
    def auto_leave(self) -> bool: ...


class SnapshotMetadataFields(Protocol):
    @property
    def conf_state(self) -> ConfStateFields: ...
    @property
    def index(self) -> int: ...
    @property
    def term(self) -> int: ...


class SnapshotFields(Protocol):
    @property
    def data(self) -> bytes | None: ...
    @property
    def metadata(self) -> SnapshotMetadataFields: ...


class WalSnapshotFields(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def term(self) -> int: ...
    @property
    def conf_state(self) -> ConfStateFields | None: ...


# --- Entry -------------------------------------------------------------------------------


def encode_entry(entry: EntryFields) -> bytes:
    """Encode anything with ``type``, ``term``, ``index`` and ``data`` attributes.

    Empty data (None or b"") is written as no field at all, as etcd does for nil data, so
    decoding an empty entry gives ``data=None``.
    """
    out = (
        b"\x08"
        + encode_varint(int(entry.type))
        + b"\x10"
        + encode_varint(entry.term)
        + b"\x18"
        + encode_varint(entry.index)
    )
    data = entry.data
    if data:  # etcd leaves an empty entry's data nil: no field 4
        out += b"\x22" + encode_varint(len(data)) + bytes(data)
    return out


def decode_entry(buf: Buf) -> Entry:
    term = index = etype = 0
    data = None
    for num, wt, value in iter_fields(buf):
        if num == 1:
            etype = uint_value(num, wt, value)
        elif num == 2:
            term = uint_value(num, wt, value)
        elif num == 3:
            index = uint_value(num, wt, value)
        elif num == 4:
            data = bytes_value(num, wt, value)
    return Entry(term=term, index=index, type=etype, data=data)


# --- HardState ---------------------------------------------------------------------------


def encode_hard_state(hs: HardStateFields) -> bytes:
    return (
        b"\x08"
        + encode_varint(hs.term)
        + b"\x10"
        + encode_varint(hs.vote)
        + b"\x18"
        + encode_varint(hs.commit)
    )


def decode_hard_state(buf: Buf) -> HardState:
    term = vote = commit = 0
    for num, wt, value in iter_fields(buf):
        if num in (1, 2, 3):
            v = uint_value(num, wt, value)
            if num == 1:
                term = v
            elif num == 2:
                vote = v
            else:
                commit = v
    return HardState(term=term, vote=vote, commit=commit)


# --- ConfState ---------------------------------------------------------------------------


def encode_conf_state(cs: ConfStateFields) -> bytes:
    out = bytearray()
    for num, ids in (
        (1, cs.voters),
        (2, cs.learners),
        (3, cs.voters_outgoing),
        (4, cs.learners_next),
    ):
        for node_id in ids:
            out += uint_field(num, node_id)
    out += uint_field(5, 1 if cs.auto_leave else 0)
    return bytes(out)


def decode_conf_state(buf: Buf) -> ConfState:
    lists: dict[int, list[int]] = {1: [], 2: [], 3: [], 4: []}
    auto_leave = False
    for num, wt, value in iter_fields(buf):
        if num in lists:
            if wt == VARINT:
                lists[num].append(uint_value(num, wt, value))
            elif wt == BYTES:  # tolerate packed encoding from other writers
                packed = bytes_value(num, wt, value)
                pos = 0
                while pos < len(packed):
                    v, pos = decode_varint(packed, pos)
                    lists[num].append(v)
            else:
                raise DecodeError(f"conf state field {num}: wire type {wt}")
        elif num == 5:
            auto_leave = bool(uint_value(num, wt, value))
    return ConfState(tuple(lists[1]), tuple(lists[2]), tuple(lists[3]), tuple(lists[4]), auto_leave)


# --- Snapshot (raftpb) -------------------------------------------------------------------


def _encode_metadata(md: SnapshotMetadataFields) -> bytes:
    return (
        bytes_field(1, encode_conf_state(md.conf_state))
        + uint_field(2, md.index)
        + uint_field(3, md.term)
    )


def _decode_metadata(buf: Buf) -> SnapshotMetadata:
    cs = ConfState()
    index = term = 0
    for num, wt, value in iter_fields(buf):
        if num == 1:
            cs = decode_conf_state(bytes_value(num, wt, value))
        elif num == 2:
            index = uint_value(num, wt, value)
        elif num == 3:
            term = uint_value(num, wt, value)
    return SnapshotMetadata(conf_state=cs, index=index, term=term)


def encode_snapshot(snap: SnapshotFields) -> bytes:
    out = b""
    if snap.data is not None:
        out += bytes_field(1, snap.data)
    return out + bytes_field(2, _encode_metadata(snap.metadata))


def decode_snapshot(buf: Buf) -> Snapshot:
    data = None
    md = SnapshotMetadata()
    for num, wt, value in iter_fields(buf):
        if num == 1:
            data = bytes_value(num, wt, value)
        elif num == 2:
            md = _decode_metadata(bytes_value(num, wt, value))
    return Snapshot(data=data, metadata=md)


# --- walpb.Snapshot ----------------------------------------------------------------------


def encode_wal_snapshot(ws: WalSnapshotFields) -> bytes:
    out = uint_field(1, ws.index) + uint_field(2, ws.term)
    if ws.conf_state is not None:
        out += bytes_field(3, encode_conf_state(ws.conf_state))
    return out


def decode_wal_snapshot(buf: Buf) -> WalSnapshot:
    index = term = 0
    cs = None
    for num, wt, value in iter_fields(buf):
        if num == 1:
            index = uint_value(num, wt, value)
        elif num == 2:
            term = uint_value(num, wt, value)
        elif num == 3:
            cs = decode_conf_state(bytes_value(num, wt, value))
    return WalSnapshot(index=index, term=term, conf_state=cs)


# --- walpb.Record ------------------------------------------------------------------------


def encode_record(rtype: int, crc: int, data: bytes | None) -> bytes:
    out = b"\x08" + encode_varint(rtype) + b"\x10" + encode_varint(crc & _U32)
    if data is not None:
        out += b"\x1a" + encode_varint(len(data)) + bytes(data)
    return out


def decode_record(buf: Buf) -> Record:
    rtype = crc = 0
    data = None
    for num, wt, value in iter_fields(buf):
        if num == 1:
            rtype = uint_value(num, wt, value)
        elif num == 2:
            crc = uint_value(num, wt, value)
            if crc > _U32:
                raise DecodeError(f"record crc {crc} overflows uint32")
        elif num == 3:
            data = bytes_value(num, wt, value)
    return Record(type=rtype, crc=crc, data=data)


# --- snappb.Snapshot ---------------------------------------------------------------------


def encode_snap_file(crc: int, data: bytes) -> bytes:
    return uint_field(1, crc & _U32) + bytes_field(2, data)


def decode_snap_file(buf: Buf) -> SnapFile:
    crc = 0
    data = None
    for num, wt, value in iter_fields(buf):
        if num == 1:
            crc = uint_value(num, wt, value)
        elif num == 2:
            data = bytes_value(num, wt, value)
    if data is None:
        raise DecodeError("snapshot file has no data field")
    return SnapFile(crc=crc, data=data)
