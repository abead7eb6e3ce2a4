"""Frames and records: the WAL's byte layout, and the fast encoders of the write path.

Frame (etcd's encoder)::

    +--------------------------------+-----------------------+-------------------+
    | length word: 8 bytes, LE       | record (protobuf)     | 0..7 zero bytes   |
    +--------------------------------+-----------------------+-------------------+
    low 56 bits = record length n; top byte = 0x80 | pad when pad = (-n) % 8 > 0, else 0.

Frames start at 8-byte aligned offsets, so a length word never straddles a 512-byte sector
and is written atomically; a zero length word marks the end of the data (preallocated
space). Record (walpb.Record)::

    08 <type varint>  10 <crc varint, uint32>  [1a <len varint> <data>]

``crc`` is the running CRC-32C over the *data* of every record written so far (across
segment files); a crc record (type 4) has no data and carries the running value itself.
Data by type: 1 metadata (opaque), 2 raftpb.Entry, 3 raftpb.HardState, 5 walpb.Snapshot.

What we write, and so what the reader insists on (etcd writes the same):
entries have index >= 1, term >= 1, type 0/1/2 and conf changes (type 1/2) carry data; hard
states are never empty and a non-empty one has term >= 1. The record type byte is not
covered by the CRC in etcd's format; these rules make a flipped type byte between entry
and state detectable instead of silently turning one into the other.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable

from raftpb import (
    EntryFields,
    HardStateFields,
    WalSnapshotFields,
    encode_hard_state,
    encode_wal_snapshot,
)
from wal.crc import crc32c_update as _crc

FRAME_HEADER_BYTES = 8
ALIGN_BYTES = 8
SECTOR_BYTES = 512  # the unit a disk writes atomically (etcd's minSectorSize)
LENGTH_MASK = (1 << 56) - 1
MAX_U32 = (1 << 32) - 1

_LEN = struct.Struct("<Q")
pack_length_word = _LEN.pack
unpack_length_word = _LEN.unpack_from
_PADS = [bytes(i) for i in range(8)]


class RecordType(enum.IntEnum):
    METADATA = 1
    ENTRY = 2
    STATE = 3
    CRC = 4
    SNAPSHOT = 5


class EntryType(enum.IntEnum):
    NORMAL = 0
    CONF_CHANGE = 1
    CONF_CHANGE_V2 = 2


def length_word(record_bytes: int) -> int:
    """The frame's length word for a record of ``record_bytes`` bytes."""
    pad = -record_bytes & 7
    return record_bytes | ((0x80 | pad) << 56) if pad else record_bytes


def decode_length_word(word: int) -> tuple[int, int]:
    """Return (record_bytes, pad_bytes); ValueError unless it is a word our encoder writes."""
    n = word & LENGTH_MASK
    top = word >> 56
    pad = top - 0x80 if top else 0
    if top and not 0 < pad < 8:
        raise ValueError(f"length word top byte {top:#x} is not 0 or 0x81..0x87")
    if (n + pad) & 7:
        raise ValueError(f"record length {n} + padding {pad} is not 8-aligned")
    return n, pad


# --- varints ------------------------------------------------------------------------------

_SMALL = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    # straight-line for the lengths that matter (crcs are 5 bytes, indexes 2-4)
    if value < 0x80:
        if value < 0:
            raise ValueError(f"varint must be unsigned, got {value}")
        return _SMALL[value]
    if value < 0x4000:
        return bytes((value & 127 | 128, value >> 7))
    if value < 0x200000:
        return bytes((value & 127 | 128, (value >> 7) & 127 | 128, value >> 14))
    if value < 0x10000000:
        return bytes(
            (value & 127 | 128, (value >> 7) & 127 | 128, (value >> 14) & 127 | 128, value >> 21)
        )
    if value < 0x800000000:
        return bytes(
            (
                value & 127 | 128,
                (value >> 7) & 127 | 128,
                (value >> 14) & 127 | 128,
                (value >> 21) & 127 | 128,
                value >> 28,
            )
        )
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    if len(out) > 10:
        raise ValueError("varint overflows 64 bits")
    return bytes(out)


# --- encoders -----------------------------------------------------------------------------


def append_frame(
    out: bytearray, rtype: int, data: bytes | bytearray | memoryview | None, crc: int
) -> int:
    """Append one framed record to ``out``; return the new running CRC.

    ``data`` None writes no data field; crc records pass None and keep ``crc`` unchanged.
    """
    if data is not None and rtype != RecordType.CRC:
        crc = _crc(data, crc)
    if data is None:
        header = b"\x08" + _SMALL[rtype] + b"\x10" + varint(crc)
        n = len(header)
        pad = -n & 7
        out += pack_length_word(n | ((0x80 | pad) << 56) if pad else n)
        out += header
    else:
        header = b"\x08" + _SMALL[rtype] + b"\x10" + varint(crc) + b"\x1a" + varint(len(data))
        n = len(header) + len(data)
        pad = -n & 7
        out += pack_length_word(n | ((0x80 | pad) << 56) if pad else n)
        out += header
        out += data
    out += _PADS[pad]
    return crc


def check_entry(entry: EntryFields) -> None:
    """Refuse an entry the reader would reject (see the module docstring)."""
    etype = int(entry.type)
    if entry.index < 1 or entry.term < 1:
        raise ValueError(f"entry index and term must be >= 1: {entry!r}")
    if etype not in (0, 1, 2):
        raise ValueError(f"entry type must be 0, 1 or 2: {entry!r}")
    if etype and not entry.data:
        raise ValueError(f"a conf change entry must carry data: {entry!r}")


def append_entries(out: bytearray, entries: Iterable[EntryFields], crc: int) -> int:
    """Append one entry record per entry to ``out``; return the new running CRC.

    The hot path of every save: the entry header is CRC'd and copied once, the payload is
    CRC'd in place and copied once into ``out`` (no intermediate entry bytes object).
    """
    small = _SMALL
    vi = varint
    pack = pack_length_word
    pads = _PADS
    crcf = _crc
    heads = _ENTRY_HEADS
    lens: dict[int, bytes] = {}  # length varints: entries of a batch tend to share sizes
    for e in entries:
        etype = e.type
        term = e.term
        index = e.index
        data = e.data
        if term < 1 or index < 1 or not 0 <= etype <= 2 or (etype and not data):
            check_entry(e)  # raises with the full message
        eh = (
            heads[etype]
            + (small[term] if term < 128 else vi(term))
            + b"\x18"
            + (small[index] if index < 128 else vi(index))
        )
        if data:
            dn = len(data)
            dv = lens.get(dn)
            if dv is None:
                dv = lens[dn] = b"\x22" + vi(dn)
            eh += dv
            crc = crcf(data, crcf(eh, crc))
            en = len(eh) + dn
        else:
            crc = crcf(eh, crc)
            en = len(eh)
        ev = lens.get(-en)
        if ev is None:
            ev = lens[-en] = b"\x1a" + vi(en)
        rh = b"\x08\x02\x10" + vi(crc) + ev
        n = len(rh) + en
        pad = -n & 7
        out += pack(n | ((0x80 | pad) << 56) if pad else n)
        out += rh
        out += eh
        if data:
            out += data
        if pad:
            out += pads[pad]
    return crc


_ENTRY_HEADS = (b"\x08\x00\x10", b"\x08\x01\x10", b"\x08\x02\x10")


def is_empty_hard_state(hs: HardStateFields | None) -> bool:
    return hs is None or (hs.term == 0 and hs.vote == 0 and hs.commit == 0)


def check_hard_state(hs: HardStateFields) -> None:
    if min(hs.term, hs.vote, hs.commit) < 0:
        raise ValueError(f"hard state fields must be >= 0: {hs!r}")
    if hs.term == 0 and not is_empty_hard_state(hs):
        raise ValueError(f"a non-empty hard state needs term >= 1: {hs!r}")


def append_state(out: bytearray, hs: HardStateFields, crc: int) -> int:
    check_hard_state(hs)
    return append_frame(out, RecordType.STATE, encode_hard_state(hs), crc)


def append_snapshot(out: bytearray, snap: WalSnapshotFields, crc: int) -> int:
    return append_frame(out, RecordType.SNAPSHOT, encode_wal_snapshot(snap), crc)


def append_crc(out: bytearray, crc: int) -> int:
    return append_frame(out, RecordType.CRC, None, crc)


def append_metadata(out: bytearray, metadata: bytes, crc: int) -> int:
    return append_frame(out, RecordType.METADATA, metadata, crc)
