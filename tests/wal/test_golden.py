"""Our encoder reproduces etcd's bytes.

etcd's server/storage/wal/testdata/TestNew.wal: a WAL created with metadata "somedata"
begins with a crc record (crc 0), the metadata record (crc32c("somedata") = 0x741f6a05) and
the empty snapshot record (crc chained: 0x18206d80), 72 bytes in 8-byte aligned frames.
"""

import os
import struct

import pytest

import raftpb
import wal
from raftpb import Entry, HardState, WalSnapshot
from wal import frame

GOLDEN_TESTNEW = bytes.fromhex(
    "0400000000000084"
    "08041000"
    "00000000"
    "1200000000000086"
    "08011085d4fda0071a08736f6d6564617461"
    "000000000000"
    "0e00000000000082"
    "08051080db81c1011a0408001000"
    "0000"
)


def reference_frame(rtype: int, crc: int, data) -> bytes:
    """etcd's encoder, spelled out with raftpb: length word, record, zero padding."""
    rec = raftpb.encode_record(rtype, crc, data)
    pad = -len(rec) % 8
    word = len(rec) | ((0x80 | pad) << 56 if pad else 0)
    return struct.pack("<Q", word) + rec + bytes(pad)


def test_new_wal_begins_with_etcd_testnew_golden_bytes(tmp_path):
    assert len(GOLDEN_TESTNEW) == 72
    size = 64 * 1024
    w = wal.create(tmp_path / "wal", b"somedata", segment_size_bytes=size)
    w.close()
    names = os.listdir(tmp_path / "wal")
    assert names == ["0000000000000000-0000000000000000.wal"]
    data = (tmp_path / "wal" / names[0]).read_bytes()
    assert data[:72] == GOLDEN_TESTNEW
    assert len(data) == size  # preallocated to the segment size ...
    assert data[72:] == bytes(size - 72)  # ... with zeros: a zero length word ends the data
    assert not os.path.exists(str(tmp_path / "wal") + ".tmp")


def test_golden_frames_from_the_frame_encoder():
    out = bytearray()
    crc = frame.append_crc(out, 0)
    crc = frame.append_metadata(out, b"somedata", crc)
    assert crc == 0x741F6A05
    crc = frame.append_snapshot(out, WalSnapshot(), crc)
    assert crc == 0x18206D80
    assert bytes(out) == GOLDEN_TESTNEW


@pytest.mark.parametrize(
    "entry",
    [
        Entry(term=1, index=1),  # no data field at all
        Entry(term=1, index=1, data=b"x"),
        Entry(term=200, index=300, type=1, data=b"\x08\x00" * 70),
        Entry(term=(1 << 63), index=(1 << 64) - 1, type=2, data=bytes(1000)),
        Entry(term=5, index=16384, data=b"y" * 256),  # the benchmark's shape
    ],
)
def test_entry_frames_match_the_reference_encoding(entry):
    out = bytearray()
    crc = frame.append_entries(out, [entry], 0xDEADBEEF)
    data = raftpb.encode_entry(entry)
    assert crc == raftpb.crc32c(data, 0xDEADBEEF)
    assert bytes(out) == reference_frame(2, crc, data)
    assert len(out) % 8 == 0


def test_state_and_snapshot_frames_match_the_reference_encoding():
    hs = HardState(term=7, vote=3, commit=1234)
    out = bytearray()
    crc = frame.append_state(out, hs, 17)
    assert bytes(out) == reference_frame(3, crc, raftpb.encode_hard_state(hs))
    snap = WalSnapshot(index=99, term=4, conf_state=raftpb.ConfState(voters=(1, 2, 3)))
    out = bytearray()
    crc2 = frame.append_snapshot(out, snap, crc)
    assert bytes(out) == reference_frame(5, crc2, raftpb.encode_wal_snapshot(snap))


@pytest.mark.parametrize("n", range(0, 40))
def test_length_word_marks_padding_in_the_top_byte(n):
    word = frame.length_word(n)
    pad = -n % 8
    assert word >> 56 == (0x80 | pad if pad else 0)
    assert frame.decode_length_word(word) == (n, pad)


@pytest.mark.parametrize("word", [0x01 << 56 | 7, 0x88 << 56 | 8, 0x81 << 56 | 8, 5])
def test_length_words_our_encoder_never_writes_are_rejected(word):
    with pytest.raises(ValueError):
        frame.decode_length_word(word)


@pytest.mark.parametrize(
    "bad",
    [
        Entry(term=0, index=1, data=b"x"),  # term 0 is raft's dummy entry only
        Entry(term=1, index=0, data=b"x"),
        Entry(term=1, index=1, type=3, data=b"x"),
        Entry(term=1, index=1, type=1),  # a conf change always carries data
    ],
)
def test_entries_the_reader_would_reject_are_refused_at_save(tmp_path, bad):
    w = wal.create(tmp_path / "wal", b"m", segment_size_bytes=4096, prepare_ahead=False)
    with pytest.raises(ValueError):
        w.save(None, [bad])
    w.save(HardState(term=1), [Entry(term=1, index=1, data=b"ok")])
    w.close()
    r = wal.open(tmp_path / "wal")
    assert r.read_all()[2] == [Entry(term=1, index=1, data=b"ok")]
    r.close()
