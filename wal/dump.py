"""Record-by-record listing of a WAL directory, for ``raftkv wal dump``.

``dump(dir)`` yields one ``DumpRecord`` per frame of every segment, oldest first, with the
running CRC recomputed (``crc_ok``), decoded with raftpb (the reference decoder), and a
``DumpProblem`` where a segment stops making sense (the listing then goes on with the next
segment, whose crc record restarts the chain). It never modifies anything and takes no
locks. ``verify`` is the check; this is the microscope.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from raftpb import DecodeError, crc32c, decode_entry, decode_hard_state, decode_wal_snapshot
from wal.decoder import BadRecord, iter_raw_records
from wal.frame import RecordType
from wal.segment import list_segments, read_whole

# What a record says, by name (index, term, vote, voters, metadata_hex, decode_error...).
DumpFields = dict[str, int | str | list[int]]


@dataclass(frozen=True, slots=True)
class DumpRecord:
    segment: str
    offset: int
    type: str  # metadata, entry, state, crc, snapshot or unknown(N)
    crc: int
    crc_ok: bool
    record_bytes: int
    data_bytes: int | None  # None: no data field
    frame_bytes: int
    fields: DumpFields = field(default_factory=dict)  # index/term/... by type


@dataclass(frozen=True, slots=True)
class DumpProblem:
    segment: str
    offset: int
    reason: str


def _type_name(t: int) -> str:
    try:
        return RecordType(t).name.lower()
    except ValueError:
        return f"unknown({t})"


def _fields(t: int, data: bytes | None) -> DumpFields:
    try:
        if t == RecordType.ENTRY and data is not None:
            e = decode_entry(data)
            return {
                "index": e.index,
                "term": e.term,
                "entry_type": e.type,
                "entry_data_bytes": len(e.data or b""),
            }
        if t == RecordType.STATE and data is not None:
            hs = decode_hard_state(data)
            return {"term": hs.term, "vote": hs.vote, "commit": hs.commit}
        if t == RecordType.SNAPSHOT and data is not None:
            s = decode_wal_snapshot(data)
            out: DumpFields = {"index": s.index, "term": s.term}
            if s.conf_state is not None:
                out["voters"] = list(s.conf_state.voters)
                out["learners"] = list(s.conf_state.learners)
            return out
        if t == RecordType.METADATA:
            return {"metadata_hex": (data or b"")[:64].hex()}
    except DecodeError as e:
        return {"decode_error": str(e)}
    return {}


def dump(dir_path: str | os.PathLike[str]) -> Iterator[DumpRecord | DumpProblem]:
    path = os.path.abspath(os.fspath(dir_path))
    running = None  # None: the chain starts at the next crc record
    for name in list_segments(path):
        seg = name.name
        fd = os.open(os.path.join(path, seg), os.O_RDONLY | os.O_CLOEXEC)
        try:
            buf = read_whole(fd)
        finally:
            os.close(fd)
        try:
            for raw in iter_raw_records(buf):
                if raw.type == RecordType.CRC:
                    ok = running is None or raw.crc == running
                    running = raw.crc
                else:
                    running = crc32c(raw.data or b"", running or 0)
                    ok = raw.crc == running
                yield DumpRecord(
                    seg,
                    raw.offset,
                    _type_name(raw.type),
                    raw.crc,
                    ok,
                    raw.record_bytes,
                    None if raw.data is None else len(raw.data),
                    raw.frame_bytes,
                    _fields(raw.type, raw.data),
                )
        except BadRecord as bad:
            yield DumpProblem(seg, bad.offset, bad.reason)
            running = None
