"""A reference reader of one WAL segment, written plainly from etcd's format with raftpb.

``reference_scan`` is what etcd's ReadAll does over one segment, plus raftpb's strict rules,
with none of the decoder's speed-ups: the property tests compare ``wal.decoder.scan`` with
it, and the corruption tests ask it what an intact prefix holds. ``RefBad`` names the offset
of the first record it refuses.
"""

from __future__ import annotations

import raftpb
from raftpb.wire import decode_varint, iter_fields
from wal import frame


class RefBad(Exception):
    """The reference refuses the record at ``offset``."""

    def __init__(self, offset):
        super().__init__(offset)
        self.offset = offset


def reference_scan(buf: bytes, snap_index: int = 0):
    """etcd's ReadAll over one segment, written plainly with raftpb, plus our strict rules."""
    pos, crc, fresh = 0, 0, True
    ents, state, metadata = [], None, None
    while True:
        if pos + 8 > len(buf):
            if any(buf[pos:]):
                raise RefBad(pos)
            break
        word = int.from_bytes(buf[pos : pos + 8], "little")
        if word == 0:
            if not fresh and _intact_record_at(buf, pos + 8, crc):
                raise RefBad(pos)  # a damaged (zeroed) length word, not the end of the data
            break
        try:
            n, pad = frame.decode_length_word(word)
        except ValueError:
            raise RefBad(pos) from None
        if n < 4 or pos + 8 + n + pad > len(buf):
            raise RefBad(pos)
        try:
            rec = raftpb.decode_record(buf[pos + 8 : pos + 8 + n])
        except raftpb.DecodeError:
            raise RefBad(pos) from None
        if rec.type == 4:
            if rec.data is not None or (not fresh and rec.crc != crc):
                raise RefBad(pos)
            crc, fresh = rec.crc, False
        else:
            crc = raftpb.crc32c(rec.data or b"", crc)
            if rec.crc != crc:
                raise RefBad(pos)
            try:
                if rec.type == 2:
                    if rec.data is None:
                        raise RefBad(pos)
                    e = raftpb.decode_entry(rec.data)
                    if e.term < 1 or e.index < 1 or e.type > 2 or (e.type and not e.data):
                        raise RefBad(pos)
                    if e.index > snap_index:
                        k = e.index - snap_index - 1
                        if k > len(ents):
                            raise RefBad(pos)
                        ents[k:] = [e]
                    else:
                        ents.clear()  # writing index i truncates everything after i
                elif rec.type == 3:
                    if rec.data is None:
                        raise RefBad(pos)
                    fields = {}
                    for num, wt, value in iter_fields(rec.data):
                        if num not in (1, 2, 3) or wt != 0:
                            raise RefBad(pos)
                        fields[num] = value
                    if fields.get(1, 0) < 1:
                        raise RefBad(pos)
                    state = (fields.get(1, 0), fields.get(2, 0), fields.get(3, 0))
                elif rec.type == 1:
                    md = rec.data or b""
                    if metadata is not None and md != metadata:
                        raise RefBad(pos)
                    metadata = md
                elif rec.type == 5:
                    if rec.data is None:
                        raise RefBad(pos)
                    snap = raftpb.decode_wal_snapshot(rec.data)
                    if snap.index == snap_index and snap.term != 0:  # wanted: (snap_index, 0)
                        raise RefBad(pos)
                else:
                    raise RefBad(pos)
            except raftpb.DecodeError:
                raise RefBad(pos) from None
        pos += 8 + n + pad
    return ents, state, metadata, crc, pos


def _intact_record_at(buf: bytes, p: int, crc: int) -> bool:
    """A record with data, in etcd's field order, whose CRC continues ``crc``, at ``p``."""
    try:
        if buf[p] != 8 or buf[p + 1] not in (1, 2, 3, 5) or buf[p + 2] != 16:
            return False
        c, q = decode_varint(buf, p + 3)
        if buf[q] != 0x1A:
            return False
        n, q = decode_varint(buf, q + 1)
    except (IndexError, raftpb.DecodeError):
        return False
    return q + n <= len(buf) and raftpb.crc32c(buf[q : q + n], crc) == c
