"""The read path: scan a segment's bytes, checking every CRC, and replay its entries.

``scan(buf, pos, state)`` walks the frames of one segment (its whole content, as bytes or a
read-only mmap) from ``pos`` and folds every record into ``state`` (a ``ScanState``) with
etcd's ``ReadAll`` semantics:

* entries with index <= ``snap_index`` are checked and skipped; a later entry whose index is
  already present truncates the kept tail and replaces it (Raft figure 7), and one at or
  below ``snap_index`` drops every kept entry (they were written before it, so they are a
  stale tail; etcd's ReadAll keeps them); an index beyond ``last + 1`` is a gap and an error;
* the last state record wins; every metadata record must equal the first one;
* a crc record must carry the running CRC, except the first one read (the chain starts
  there when reading begins in the middle of the log);
* a snapshot record at ``snap_index`` must have ``snap_term``.

It returns the offset just past the last record when it meets a zero length word (unless an
intact record follows it: then the word was damaged) or the end of the buffer, and raises ``BadRecord(kind, offset, reason)`` for the first frame that is not
valid; the caller (``wal.replay``) turns that into a typed error naming the file, or into a
``TornWriteError`` when ``is_torn`` says the failure is a partially written tail.

Speed matters here (replay is the node's restart time), so the common, canonical layout
(etcd's encoder: fields in order, each once) is decoded inline with byte indexing and one
CRC call per record (``wal.crc``), and entries are built without running the dataclass
``__init__``.
Anything else falls back to a generic protobuf field walk with the same result; tests check
both against raftpb, the reference decoder.
"""

from __future__ import annotations

import enum
import mmap
import struct
from collections.abc import Callable, Iterator

from raftpb import (
    DecodeError,
    Entry,
    HardState,
    WalSnapshot,
    decode_entry,
    decode_wal_snapshot,
)
from raftpb.wire import Buf, decode_varint, iter_fields
from wal.crc import crc32c_update as _crc
from wal.frame import MAX_U32, SECTOR_BYTES, unpack_length_word

# A segment's whole content, as read (bytes) or mapped (a read-only mmap): slices are bytes.
SegmentData = bytes | mmap.mmap

# a length word as (bits 0-31, bits 32-47, bits 48-55, top byte): small ints on the hot path
_unpack_lw = struct.Struct("<IHBB").unpack_from


class Fault(enum.Enum):
    """Why a frame is bad. PARTIAL, DECODE and CRC are failures to read bytes as written and
    may be a torn write. LENGTH and ZEROED concern a length word, which is 8-aligned and so
    written atomically: torn only when nothing but zeros surrounds it (see is_torn). The
    others happen after the CRC matched, on bytes exactly as written: never torn."""

    PARTIAL = "partial"  # the frame runs past the end of the file
    LENGTH = "length"  # the length word is not one our encoder writes
    DECODE = "decode"  # the record's protobuf does not parse
    CRC = "crc"  # the record's CRC does not match the running CRC
    CRC_RECORD = "crc-record"  # a crc record does not carry the running CRC
    INVALID = "invalid"  # CRC fine, content not acceptable (entry, gap, type)
    METADATA = "metadata"  # metadata differs from the first metadata record
    SNAPSHOT_TERM = "snapshot-term"  # snapshot record at the wanted index, another term
    ZEROED = "zeroed"  # a zero length word hides an intact record behind it


PARTIAL, LENGTH, DECODE, CRC = Fault.PARTIAL, Fault.LENGTH, Fault.DECODE, Fault.CRC
CRC_RECORD, INVALID, METADATA = Fault.CRC_RECORD, Fault.INVALID, Fault.METADATA
SNAPSHOT_TERM, ZEROED = Fault.SNAPSHOT_TERM, Fault.ZEROED
TORN_KINDS = frozenset({PARTIAL, DECODE, CRC, LENGTH, ZEROED})  # torn only if is_torn says so

_M56 = (1 << 56) - 1
_NO_DATA = -1

assert set(Entry.__slots__) == {"term", "index", "type", "data"}, "raftpb.Entry changed"
_new = object.__new__
# The slot descriptors' setters, which a frozen dataclass's own __setattr__ refuses; taken
# from the class __dict__ because attribute access on the class is typed as the field.
_set_term: Callable[[Entry, int], None] = Entry.__dict__["term"].__set__
_set_index: Callable[[Entry, int], None] = Entry.__dict__["index"].__set__
_set_type: Callable[[Entry, int], None] = Entry.__dict__["type"].__set__
_set_data: Callable[[Entry, bytes | None], None] = Entry.__dict__["data"].__set__


class BadRecord(Exception):
    def __init__(self, kind: Fault, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.offset = offset
        self.reason = reason


class ScanState:
    """What replay has learned so far; ``scan`` updates it only after a clean finish."""

    __slots__ = (
        "crc",
        "crc_fresh",
        "snap_index",
        "snap_term",
        "snap_matched",
        "entries",
        "kept",
        "enti",
        "state",
        "metadata",
        "snapshots",
        "records",
    )

    def __init__(
        self,
        snap_index: int = 0,
        snap_term: int = 0,
        *,
        keep_entries: bool = True,
        collect_snapshots: bool = False,
    ) -> None:
        self.crc = 0
        self.crc_fresh = True  # no crc record seen yet: the first one starts the chain
        self.snap_index = snap_index
        self.snap_term = snap_term
        self.snap_matched = False
        self.entries: list[Entry] | None = [] if keep_entries else None
        self.kept = 0  # invariant: entries is None or len(entries) == kept
        self.enti = 0  # index of the last entry record read (any index)
        self.state: tuple[int, int, int] | None = None
        self.metadata: bytes | None = None
        self.snapshots: list[WalSnapshot] | None = [] if collect_snapshots else None
        self.records = 0

    def hard_state(self) -> HardState:
        return HardState() if self.state is None else HardState(*self.state)


def scan(buf: SegmentData, pos: int, st: ScanState) -> int:  # noqa: C901 - inlined decoding: replay hot path
    """Fold the records of ``buf`` (bytes or a read-only mmap of a segment) from ``pos`` into
    ``st``; return the end of the data."""
    # Byte indexing returns cached small ints, so the varints below are decoded with
    # straight-line byte arithmetic (no wide-int temporaries, no per-byte loop for the usual
    # lengths). The garbage collector is paused by the caller: replay allocates millions of
    # objects that live on, and young-generation passes over them would cost a third.
    n = len(buf)
    mv = memoryview(buf)
    unpack = _unpack_lw
    crcf = _crc
    new = _new
    set_term, set_index, set_type, set_data = _set_term, _set_index, _set_type, _set_data
    crc = st.crc
    fresh = st.crc_fresh
    snap_index = st.snap_index
    ents = st.entries
    kept = st.kept
    enti = st.enti
    records = st.records
    state = st.state
    try:
        while True:
            if pos + 8 > n:
                if pos < n and not _zero(buf, pos, n):
                    raise BadRecord(PARTIAL, pos, "file ends inside a length word")
                break
            rl, rl_mid, rl_hi, top = unpack(buf, pos)
            if not top:
                if not rl and not rl_mid and not rl_hi:
                    # a zero length word ends the data (preallocated zeros follow), unless
                    # an intact record follows it: then the word itself was damaged
                    if not fresh and _hides_a_record(buf, pos + 8, crc):
                        raise BadRecord(
                            ZEROED,
                            pos,
                            "zero length word in front of an intact record (damaged length word)",
                        )
                    break
                pad = 0
            else:
                pad = top - 0x80
                if not 0 < pad < 8:
                    raise BadRecord(LENGTH, pos, f"length word at {pos}: bad padding byte {top:#x}")
            if rl_mid or rl_hi:
                rl |= (rl_mid | rl_hi << 16) << 32
            if (rl + pad) & 7 or rl < 4:
                raise BadRecord(LENGTH, pos, f"length word at {pos}: bad record length {rl}")
            p = pos + 8
            end = p + rl
            if end + pad > n:
                raise BadRecord(PARTIAL, pos, f"{rl}-byte record runs past the end of the file")

            # -- walpb.Record, canonical layout inline: 08 type 10 crc [1a len data]
            try:
                t = buf[p + 1]
                if buf[p] != 8 or t > 127 or buf[p + 2] != 16:
                    raise _Slow
                c = buf[p + 3]
                if c < 128:
                    q = p + 4
                else:
                    b1 = buf[p + 4]
                    b2 = buf[p + 5]
                    b3 = buf[p + 6]
                    b4 = buf[p + 7]
                    if b1 & b2 & b3 & 128 and b4 < 16:  # the usual 5-byte crc
                        c = (
                            (c & 127)
                            | ((b1 & 127) << 7)
                            | ((b2 & 127) << 14)
                            | ((b3 & 127) << 21)
                            | (b4 << 28)
                        )
                        q = p + 8
                    elif b1 & b2 & 128 and b3 < 128:  # a crc below 2**28: 4 bytes
                        c = (c & 127) | ((b1 & 127) << 7) | ((b2 & 127) << 14) | (b3 << 21)
                        q = p + 7
                    else:
                        c, q = _varint(buf, p + 3, end)
                        if c > MAX_U32:
                            raise _Slow
                if q == end:
                    d0 = _NO_DATA
                elif buf[q] == 26 and q < end:
                    dl = buf[q + 1]
                    if dl < 128:
                        d0 = q + 2
                    else:
                        b1 = buf[q + 2]
                        if b1 < 128:
                            dl = (dl & 127) | (b1 << 7)
                            d0 = q + 3
                        else:
                            dl, d0 = _varint(buf, q + 1, end)
                    if d0 + dl != end:
                        raise _Slow
                else:
                    raise _Slow
                d1 = end
            except (_Slow, IndexError):
                t, c, d0, d1 = _record_fields(buf, p, end, pos)

            if t != 4:
                if c != (crcf(mv[d0:d1], crc) if d0 >= 0 else crc):
                    raise BadRecord(
                        CRC,
                        pos,
                        f"crc mismatch: record says {c:#010x}, running "
                        f"crc is {crcf(mv[d0:d1], crc) if d0 >= 0 else crc:#010x}",
                    )
                crc = c
            if t == 2:
                if d0 < 0:
                    raise BadRecord(INVALID, pos, "entry record without data")
                # -- raftpb.Entry, canonical layout inline: 08 type 10 term 18 index [22 len data]
                try:
                    et = buf[d0 + 1]
                    if buf[d0] != 8 or et > 2 or buf[d0 + 2] != 16:
                        raise _Slow
                    term = buf[d0 + 3]
                    if term < 128:
                        r = d0 + 4
                    else:
                        term, r = _varint(buf, d0 + 3, d1)
                    if buf[r] != 24:
                        raise _Slow
                    idx = buf[r + 1]
                    if idx < 128:
                        r += 2
                    else:
                        b1 = buf[r + 2]
                        if b1 < 128:
                            idx = (idx & 127) | (b1 << 7)
                            r += 3
                        else:
                            b2 = buf[r + 3]
                            if b2 < 128:
                                idx = (idx & 127) | ((b1 & 127) << 7) | (b2 << 14)
                                r += 4
                            else:
                                b3 = buf[r + 4]
                                if b3 < 128:
                                    idx = (
                                        (idx & 127)
                                        | ((b1 & 127) << 7)
                                        | ((b2 & 127) << 14)
                                        | (b3 << 21)
                                    )
                                    r += 5
                                else:
                                    idx, r = _varint(buf, r + 1, d1)
                    if r == d1:
                        data = None
                    elif buf[r] == 34 and r < d1:
                        ln = buf[r + 1]
                        if ln < 128:
                            r += 2
                        else:
                            b1 = buf[r + 2]
                            if b1 < 128:
                                ln = (ln & 127) | (b1 << 7)
                                r += 3
                            else:
                                ln, r = _varint(buf, r + 1, d1)
                        if r + ln != d1 or not ln:
                            raise _Slow
                        data = buf[r:d1]
                    else:
                        raise _Slow
                except (_Slow, IndexError):
                    et, term, idx, data = _entry_fields(mv, d0, d1, pos)
                if term < 1 or idx < 1 or et > 2 or (et and not data):
                    raise BadRecord(
                        INVALID,
                        pos,
                        f"invalid entry: type {et} term {term} "
                        f"index {idx} data {len(data or b'')} bytes",
                    )
                if idx > snap_index:
                    k = idx - snap_index - 1  # its position among the kept entries
                    if k == kept:
                        kept += 1
                    elif k < kept:
                        if ents is not None:
                            del ents[k:]  # a rewrite: drop the conflicting tail
                        kept = k + 1
                    else:
                        raise BadRecord(
                            INVALID,
                            pos,
                            f"entry index {idx} leaves a gap after index {snap_index + kept}",
                        )
                    if ents is not None:
                        e = new(Entry)
                        set_term(e, term)
                        set_index(e, idx)
                        set_type(e, et)
                        set_data(e, data)
                        ents.append(e)
                elif kept:
                    # Writing index i truncates the log after i. Dropping what was kept is
                    # needed even for i <= snap_index: a tail written before a rewrite of an
                    # index at or below the snapshot is stale (etcd keeps it; we do not).
                    if ents is not None:
                        ents.clear()
                    kept = 0
                enti = idx
            elif t == 4:
                if d0 >= 0:
                    raise BadRecord(INVALID, pos, "crc record with data")
                if not fresh and c != crc:
                    raise BadRecord(
                        CRC_RECORD, pos, f"crc record says {c:#010x}, running crc is {crc:#010x}"
                    )
                crc = c
                fresh = False
            elif t == 3:
                state = _state_fields(mv, d0, d1, pos)
            elif t == 1:
                md = b"" if d0 < 0 else bytes(mv[d0:d1])
                if st.metadata is None:
                    st.metadata = md
                elif md != st.metadata:
                    raise BadRecord(
                        METADATA, pos, "metadata differs from the first metadata record"
                    )
            elif t == 5:
                _snapshot_record(mv, d0, d1, pos, st)
            else:
                raise BadRecord(INVALID, pos, f"unknown record type {t}")
            pos = end + pad
            records += 1
    finally:
        mv.release()  # an mmap'ed segment can then be closed even if a traceback keeps us
        # Also on error: the locals then describe the state after the last good record.
        st.crc = crc
        st.crc_fresh = fresh
        st.kept = kept
        st.enti = enti
        st.records = records
        st.state = state
    return pos


def _varint(buf: Buf, pos: int, limit: int) -> tuple[int, int]:
    """A varint of at most 10 bytes that must end before ``limit``; _Slow otherwise."""
    result = 0
    shift = 0
    while pos < limit:
        b = buf[pos]
        pos += 1
        result |= (b & 127) << shift
        if b < 128:
            if result >> 64:
                raise _Slow
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise _Slow


class _Slow(Exception):
    """Internal: leave the inline fast path for the generic decoder."""


# --- slow paths ---------------------------------------------------------------------------


def _record_fields(buf: Buf, p: int, end: int, off: int) -> tuple[int, int, int, int]:
    """Generic walpb.Record parse of buf[p:end]: (type, crc, data_start or -1, data_end)."""
    t = c = 0
    d0, d1 = _NO_DATA, end
    pos = p
    try:
        while pos < end:
            key, pos = decode_varint(buf, pos)
            num, wt = key >> 3, key & 7
            if num == 0:
                raise DecodeError("field number 0")
            if wt == 0:
                v, pos = decode_varint(buf, pos)
                if num == 1:
                    t = v
                elif num == 2:
                    c = v
                elif num == 3:
                    raise DecodeError("field 3: wire type 0, expected 2")
            elif wt == 2:
                ln, pos = decode_varint(buf, pos)
                if pos + ln > end:
                    raise DecodeError(f"field {num}: length {ln} runs past the record")
                if num == 3:
                    d0, d1 = pos, pos + ln
                elif num in (1, 2):
                    raise DecodeError(f"field {num}: wire type 2, expected 0")
                pos += ln
            elif wt == 1 or wt == 5:
                if num in (1, 2, 3):
                    raise DecodeError(f"field {num}: wire type {wt}")
                pos += 8 if wt == 1 else 4
            else:
                raise DecodeError(f"field {num}: unsupported wire type {wt}")
            if pos > end:
                raise DecodeError("field runs past the record")
    except DecodeError as e:
        raise BadRecord(DECODE, off, f"record does not decode: {e}") from None
    if c > MAX_U32:
        raise BadRecord(DECODE, off, f"record crc {c} overflows uint32")
    return t, c, d0, d1


def _entry_fields(mv: memoryview, d0: int, d1: int, off: int) -> tuple[int, int, int, bytes | None]:
    try:
        e = decode_entry(bytes(mv[d0:d1]))
    except DecodeError as exc:
        raise BadRecord(INVALID, off, f"entry does not decode: {exc}") from None
    return e.type, e.term, e.index, e.data


def _state_fields(mv: memoryview, d0: int, d1: int, off: int) -> tuple[int, int, int]:
    """Strict HardState: only fields 1-3 as varints, term >= 1 (we never write empty ones)."""
    if d0 < 0:
        raise BadRecord(INVALID, off, "state record without data")
    vals = [0, 0, 0]
    try:
        for num, wt, value in iter_fields(bytes(mv[d0:d1])):
            if num not in (1, 2, 3) or wt != 0 or not isinstance(value, int):
                raise DecodeError(f"unexpected field {num} (wire type {wt}) in a hard state")
            vals[num - 1] = value
    except DecodeError as exc:
        raise BadRecord(INVALID, off, f"state does not decode: {exc}") from None
    if vals[0] < 1:
        raise BadRecord(INVALID, off, f"hard state with term 0: {vals}")
    return vals[0], vals[1], vals[2]


def _snapshot_record(mv: memoryview, d0: int, d1: int, off: int, st: ScanState) -> None:
    if d0 < 0:
        raise BadRecord(INVALID, off, "snapshot record without data")
    try:
        snap = decode_wal_snapshot(bytes(mv[d0:d1]))
    except DecodeError as exc:
        raise BadRecord(INVALID, off, f"snapshot record does not decode: {exc}") from None
    if snap.index == st.snap_index:
        if snap.term != st.snap_term:
            raise BadRecord(
                SNAPSHOT_TERM,
                off,
                f"snapshot record at index {snap.index} has "
                f"term {snap.term}, expected {st.snap_term}",
            )
        st.snap_matched = True
    if st.snapshots is not None:
        st.snapshots.append(snap)


# --- torn writes --------------------------------------------------------------------------


def _header_contradicts(buf: Buf, p: int, end: int) -> bool:
    """True when the record header, fully present, implies a length other than the frame's.

    Then the length word itself is damaged: that is corruption, not a torn write.
    """
    avail = min(end, len(buf))
    try:
        if buf[p] != 8 or buf[p + 2] != 16 or p + 3 >= avail:
            return False
        _, q = decode_varint(buf, p + 3)
        if q > avail:
            return False
        if q == avail or buf[q] != 26:
            # no data field: only a crc record is complete without one
            return buf[p + 1] == 4 and q != end
        ln, q = decode_varint(buf, q + 1)
    except (IndexError, DecodeError):
        return False
    return q <= avail and q + ln != end


def _hides_a_record(buf: Buf, p: int, crc: int) -> bool:
    """Whether a record with data and a CRC continuing ``crc`` starts at ``p``."""
    try:
        if buf[p] != 8 or buf[p + 1] not in (1, 2, 3, 5) or buf[p + 2] != 16:
            return False
        c, q = decode_varint(buf, p + 3)
        if buf[q] != 26:
            return False
        ln, q = decode_varint(buf, q + 1)
    except (IndexError, DecodeError):
        return False
    if q + ln > len(buf):
        return False
    with memoryview(buf) as mv:
        return _crc(mv[q : q + ln], crc) == c


_ZERO_CHUNK = bytes(1 << 20)


def _zero(buf: Buf, lo: int, hi: int) -> bool:
    """Whether buf[lo:hi] is all zeros (buf: bytes or an mmap), by memcmp-speed chunks."""
    step = len(_ZERO_CHUNK)
    while hi - lo >= step:
        if buf[lo : lo + step] != _ZERO_CHUNK:
            return False
        lo += step
    return lo >= hi or buf[lo:hi] == _ZERO_CHUNK[: hi - lo]


def is_zero(buf: Buf, lo: int, hi: int) -> bool:
    return _zero(buf, lo, hi)


def is_torn(buf: Buf, offset: int, kind: Fault) -> bool:
    """Whether a failure of ``kind`` at frame ``offset`` of the *last* segment is a torn write.

    A torn write leaves whole sectors unwritten (zeros, or missing at the end of the file).
    So a failure is torn when the frame runs past the end of the file or one of the 512-byte
    sectors it covers is all zeros (bytes past the end count as zeros), and the record
    header, where present, agrees with the length word; a bad length word is torn only when
    nothing but zeros follows it (it hides no data), a zero one when its whole sector is.
    """
    if kind not in TORN_KINDS:
        return False
    n = len(buf)
    if offset + 8 > n:
        return kind == PARTIAL
    if kind == ZEROED:
        sector = offset - offset % SECTOR_BYTES
        return _zero(buf, sector, min(sector + SECTOR_BYTES, n))
    if _zero(buf, offset + 8, n):
        return True  # nothing but zeros after the length word: it hides nothing
    if kind == LENGTH:
        return False
    lw = unpack_length_word(buf, offset)[0]
    rl = lw & _M56
    pad = (lw >> 56) - 0x80 if lw >> 56 else 0
    p = offset + 8
    end = p + rl
    if _header_contradicts(buf, p, end):
        return False
    if kind == PARTIAL:
        return True
    stop = min(end + pad, n)
    sector = offset - offset % SECTOR_BYTES
    while sector < stop:
        if _zero(buf, sector, min(sector + SECTOR_BYTES, n)):
            return True
        sector += SECTOR_BYTES
    return False


# --- records one by one, for tools ----------------------------------------------------------


class RawRecord:
    """One frame as found on disk (no CRC check): for ``raftkv wal dump``."""

    __slots__ = ("offset", "record_bytes", "pad_bytes", "type", "crc", "data")

    def __init__(
        self,
        offset: int,
        record_bytes: int,
        pad_bytes: int,
        rtype: int,
        crc: int,
        data: bytes | None,
    ) -> None:
        self.offset = offset
        self.record_bytes = record_bytes
        self.pad_bytes = pad_bytes
        self.type = rtype
        self.crc = crc
        self.data = data

    @property
    def frame_bytes(self) -> int:
        return 8 + self.record_bytes + self.pad_bytes


def iter_raw_records(buf: bytes) -> Iterator[RawRecord]:
    """Yield each frame's ``RawRecord`` until the end of data; BadRecord on a bad frame."""
    n = len(buf)
    pos = 0
    while True:
        if pos + 8 > n:
            if pos < n and not _zero(buf, pos, n):
                raise BadRecord(PARTIAL, pos, "file ends inside a length word")
            return
        lw = unpack_length_word(buf, pos)[0]
        if not lw:
            return
        rl = lw & _M56
        top = lw >> 56
        pad = top - 0x80 if top else 0
        if (top and not 0 < pad < 8) or (rl + pad) & 7 or rl < 4:
            raise BadRecord(LENGTH, pos, f"length word {lw:#018x} is not valid")
        if pos + 8 + rl + pad > n:
            raise BadRecord(PARTIAL, pos, f"{rl}-byte record runs past the end of the file")
        t, c, d0, d1 = _record_fields(buf, pos + 8, pos + 8 + rl, pos)
        yield RawRecord(pos, rl, pad, t, c, None if d0 < 0 else bytes(buf[d0:d1]))
        pos += 8 + rl + pad
