"""Damage at the tail and in the middle: a clean prefix after repair, or a typed error.

The properties (etcd's torn-write handling, and our rule: never a wrong entry):
* truncating the last segment at any byte offset inside its last records is a torn write:
  ``read_all`` raises TornWriteError (file, offset), ``repair`` truncates there, and the log
  then holds exactly the records that were complete;
* zero-filling the tail from any offset: either the data ends cleanly (a zero length word)
  or the torn record is detected; what is returned is exactly the intact prefix;
* flipping any bit of any record: ``read_all`` returns the full log (only if the bit was
  padding), or raises a CorruptError subclass naming the segment and the damaged frame;
  damage in the middle of the log is never taken for a torn tail and never "repaired";
* in every case, never a wrong entry and never an untyped exception.
"""

import os
import shutil

import pytest

import wal
from raftpb import HardState
from wal.dump import DumpRecord, dump

from .helpers import entries
from .reference import reference_scan

SEGMENT_BYTES = 8192


def build_single_segment(path) -> tuple[str, bytes, list[DumpRecord]]:
    w = wal.create(path, b"meta", segment_size_bytes=SEGMENT_BYTES, prepare_ahead=False)
    index = 1
    for k, size in enumerate([40, 300, 17, 600, 5, 120, 64, 250]):
        n = 1 + k % 2
        w.save(
            HardState(term=1 + k // 3, vote=1, commit=index - 1),
            entries(index, index + n - 1, term=1 + k // 3, size=size),
        )
        index += n
    w.close()
    seg = os.path.join(path, wal.segment_name(0, 0))
    frames = [r for r in dump(path) if isinstance(r, DumpRecord)]
    return seg, open(seg, "rb").read(), frames


def recover(path, seg):
    """open + read_all; on a torn tail, check it names ``seg``, repair, and read again."""
    w = wal.open(path, prepare_ahead=False)
    try:
        _, hs, ents = w.read_all()
        return hs, ents, None
    except wal.TornWriteError as e:
        torn = e
    finally:
        w.close()
    assert torn.file == seg
    assert wal.repair(path)
    assert open(seg + ".broken", "rb").read() != b""
    assert os.path.getsize(seg) == torn.offset
    w = wal.open(path, prepare_ahead=False)
    _, hs, ents = w.read_all()
    w.close()
    return hs, ents, torn


def expected(buf: bytes, end: int):
    ents, state, _, _, _ = reference_scan(buf[:end])
    return HardState(*state) if state else HardState(), ents


@pytest.fixture(scope="module")
def log(ram_path_module):
    path = os.path.join(ram_path_module, "wal")
    seg, buf, frames = build_single_segment(path)
    data_end = frames[-1].offset + frames[-1].frame_bytes
    return path, seg, buf, frames, data_end


def restore(path, seg, content: bytes):
    for name in os.listdir(path):
        if name.endswith(".broken"):
            os.unlink(os.path.join(path, name))
    with open(seg, "wb") as f:
        f.write(content)


def test_truncation_at_every_offset_of_the_last_records(log):
    path, seg, buf, frames, data_end = log
    start = frames[-5].offset
    for cut in range(start, data_end + 1):
        restore(path, seg, buf[:cut])
        good = max(f.offset + f.frame_bytes for f in frames if f.offset + f.frame_bytes <= cut)
        hs, ents, torn = recover(path, seg)
        assert (hs, ents) == expected(buf, good), cut
        if torn is not None:
            assert torn.offset == good
    restore(path, seg, buf)


def test_zero_filled_tails_from_every_offset(log):
    path, seg, buf, frames, data_end = log
    start = frames[-5].offset
    outcomes = set()
    for z in range(start, data_end):
        restore(path, seg, buf[:z] + bytes(len(buf) - z))
        intact = [f for f in frames if f.offset + 8 + f.record_bytes <= z]
        good = intact[-1].offset + intact[-1].frame_bytes
        try:
            hs, ents, torn = recover(path, seg)
        except wal.CorruptError as e:  # a record damaged inside one sector: not torn
            outcomes.add("corrupt")
            assert not isinstance(e, wal.TornWriteError)
            assert e.file == seg and e.offset == good
            continue
        outcomes.add("torn" if torn else "clean")
        assert (hs, ents) == expected(buf, good), z
    assert outcomes >= {"clean", "torn"}
    restore(path, seg, buf)


def flip_outcome(path, seg, buf, frames, pos, bit):
    damaged = bytearray(buf)
    damaged[pos] ^= 1 << bit
    restore(path, seg, bytes(damaged))
    frame = next(f for f in frames if f.offset <= pos < f.offset + f.frame_bytes)
    try:
        hs, ents, torn = recover(path, seg)
    except wal.CorruptError as e:
        assert not isinstance(e, wal.TornWriteError)
        assert e.file == seg
        # reported at the damaged frame (or, for a crc record starting the chain, the next)
        assert frame.offset <= e.offset <= frame.offset + frame.frame_bytes, (pos, bit, e)
        return "corrupt"
    if torn is None:
        # the flip changed nothing that matters (padding, or protobuf that decodes to the
        # same record): then the log must be complete and exactly as written
        assert (hs, ents) == expected(buf, len(buf)), (pos, bit)
        return "intact"
    assert torn.offset <= frame.offset
    assert (hs, ents) == expected(buf, torn.offset)
    return "torn"


def test_bit_flips_in_the_last_records(log):
    path, seg, buf, frames, data_end = log
    outcomes = {}
    for pos in range(frames[-4].offset, data_end):
        for bit in ((pos * 3) % 8, 7) if pos % 8 else range(8):  # every bit of length words
            kind = flip_outcome(path, seg, buf, frames, pos, bit)
            outcomes[kind] = outcomes.get(kind, 0) + 1
    assert outcomes.get("corrupt", 0) > 100 and outcomes.get("intact", 0) > 0
    restore(path, seg, buf)


@pytest.mark.slow
def test_every_bit_flip_of_the_whole_segment(log):
    path, seg, buf, frames, data_end = log
    for pos in range(0, data_end):
        for bit in range(8):
            flip_outcome(path, seg, buf, frames, pos, bit)
    restore(path, seg, buf)


def test_a_flipped_bit_in_the_zero_tail_is_repaired_without_losing_records(log):
    path, seg, buf, frames, data_end = log
    for pos, bit in [(data_end, 0), (data_end, 3), (data_end + 5, 7), (data_end + 700, 1)]:
        damaged = bytearray(buf)
        damaged[pos] ^= 1 << bit
        restore(path, seg, bytes(damaged))
        hs, ents, _ = recover(path, seg)
        assert (hs, ents) == expected(buf, data_end)
    restore(path, seg, buf)


def test_damage_in_an_earlier_segment_names_that_segment(ram_path):
    path = os.path.join(ram_path, "wal")
    w = wal.create(path, b"meta", segment_size_bytes=1024, prepare_ahead=False)
    for i in range(1, 40):
        w.save(HardState(term=1, commit=i - 1), entries(i, i, size=100))
    w.close()
    names = sorted(n for n in os.listdir(path) if n.endswith(".wal"))
    assert len(names) >= 4
    victim = os.path.join(path, names[1])
    data = bytearray(open(victim, "rb").read())
    rec = [
        r
        for r in dump(path)
        if isinstance(r, DumpRecord) and r.segment == names[1] and r.type == "entry"
    ][2]
    data[rec.offset + 40] ^= 0x10
    open(victim, "wb").write(bytes(data))
    w = wal.open(path, prepare_ahead=False)
    with pytest.raises(wal.CRCMismatchError) as info:
        w.read_all()
    w.close()
    assert (info.value.file, info.value.offset) == (victim, rec.offset)
    with pytest.raises(wal.CRCMismatchError):
        wal.verify(path)
    before = {n: open(os.path.join(path, n), "rb").read() for n in names}
    assert wal.repair(path)  # the last segment is fine: nothing to do, nothing changed
    assert {n: open(os.path.join(path, n), "rb").read() for n in names} == before


def test_mid_log_damage_in_the_last_segment_is_not_repaired(log):
    path, seg, buf, frames, data_end = log
    damaged = bytearray(buf)
    victim = frames[4]
    damaged[victim.offset + 20] ^= 0x01
    restore(path, seg, bytes(damaged))
    w = wal.open(path, prepare_ahead=False)
    with pytest.raises(wal.CorruptError) as info:
        w.read_all()
    w.close()
    assert not isinstance(info.value, wal.TornWriteError)
    assert (info.value.file, info.value.offset) == (seg, victim.offset)
    assert wal.repair(path) is False
    assert open(seg, "rb").read() == bytes(damaged)
    assert not os.path.exists(seg + ".broken")
    restore(path, seg, buf)


def test_open_for_read_tolerates_a_torn_tail_like_etcd_read_mode(log, ram_path):
    path, seg, buf, frames, data_end = log
    copy = os.path.join(ram_path, "copy")
    shutil.copytree(path, copy)
    with open(os.path.join(copy, os.path.basename(seg)), "r+b") as f:
        f.truncate(data_end - 3)
    r = wal.open_for_read(copy)
    hs, ents = r.read_all()[1:]
    r.close()
    assert (hs, ents) == expected(buf, frames[-1].offset)
    assert wal.verify(copy) == hs
    with pytest.raises(wal.TornWriteError):
        wal.verify(copy, allow_torn_tail=False)


def test_a_zeroed_segment_is_reported_as_that_segment(ram_path):
    path = os.path.join(ram_path, "wal")
    w = wal.create(path, b"meta", segment_size_bytes=512, prepare_ahead=False)
    for i in range(1, 20):
        w.save(HardState(term=1, commit=i - 1), entries(i, i, size=100))
    w.close()
    names = sorted(n for n in os.listdir(path) if n.endswith(".wal"))
    for victim in (names[0], names[3], names[-1]):
        seg = os.path.join(path, victim)
        original = open(seg, "rb").read()
        open(seg, "wb").write(bytes(len(original)))
        w = wal.open(path, prepare_ahead=False)
        with pytest.raises(wal.CorruptError) as info:
            w.read_all()
        w.close()
        assert (info.value.file, info.value.offset) == (seg, 0)
        open(seg, "wb").write(original)
