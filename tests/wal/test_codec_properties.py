"""Property tests: the fast replay decoder agrees with raftpb, the reference decoder.

``wal.decoder.scan`` decodes etcd's canonical layout inline and everything else through a
generic field walk. Here both are checked against a deliberately simple reference reader
built on raftpb (decode_record / decode_entry / crc32c): for frames our encoder writes, for
hand-built non-canonical but valid protobuf (reordered, duplicated and unknown fields,
overlong varints, as other writers may produce), and for random garbage, where the two must
fail at the same frame offset and ``scan`` must raise nothing but ``BadRecord``.
"""

import struct

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import raftpb
import wal
from raftpb import ConfState, Entry, HardState, WalSnapshot
from raftpb.wire import encode_varint
from wal import frame
from wal.decoder import BadRecord, ScanState, scan

from .reference import RefBad, reference_scan

U64 = (1 << 64) - 1


def run_scan(buf: bytes, snap_index: int = 0):
    st = ScanState(snap_index, 0)
    end = scan(buf, 0, st)
    return st.entries, st.state, st.metadata, st.crc, end


def agree(buf: bytes, snap_index: int = 0):
    try:
        want = reference_scan(buf, snap_index)
    except RefBad as e:
        try:
            got = run_scan(buf, snap_index)
        except BadRecord as bad:
            assert bad.offset == e.offset
            return None
        raise AssertionError(f"reference fails at {e.offset}, scan returned {got}") from None
    got = run_scan(buf, snap_index)
    assert got == want
    return got


# --- strategies ----------------------------------------------------------------------------

u64s = st.integers(0, U64)
small = st.integers(1, 300)
entries_st = st.builds(
    Entry,
    term=st.one_of(small, st.integers(1, U64)),
    index=st.integers(1, 400),
    type=st.sampled_from([0, 0, 0, 1, 2]),
    data=st.one_of(st.none(), st.binary(max_size=300)),
).filter(lambda e: not e.type or e.data)
states = st.builds(HardState, term=st.integers(1, U64), vote=u64s, commit=u64s)
snaps = st.builds(
    WalSnapshot,
    index=st.integers(0, 500),
    term=st.integers(0, 50),
    conf_state=st.none()
    | st.builds(ConfState, voters=st.lists(st.integers(1, 9), max_size=3).map(tuple)),
)


def ops_st():
    return st.lists(
        st.one_of(
            st.tuples(st.just("entries"), st.lists(entries_st, min_size=1, max_size=4)),
            st.tuples(st.just("state"), states),
            st.tuples(st.just("snapshot"), snaps),
            st.tuples(st.just("metadata"), st.just(b"meta")),
            st.tuples(st.just("crc"), st.none()),
        ),
        max_size=25,
    )


def encode_ops(ops) -> bytes:
    out = bytearray()
    crc = frame.append_crc(out, 0)
    for kind, value in ops:
        if kind == "entries":
            crc = frame.append_entries(out, value, crc)
        elif kind == "state":
            crc = frame.append_state(out, value, crc)
        elif kind == "snapshot":
            crc = frame.append_snapshot(out, value, crc)
        elif kind == "metadata":
            crc = frame.append_metadata(out, value, crc)
        else:
            crc = frame.append_crc(out, crc)
    return bytes(out)


@settings(max_examples=300, deadline=None)
@given(ops_st(), st.integers(0, 50))
def test_scan_agrees_with_reference_on_our_encoding(ops, snap_index):
    buf = encode_ops(ops)
    agree(buf, snap_index)
    agree(buf + bytes(64), snap_index)  # preallocated zeros end the data


@settings(max_examples=200, deadline=None)
@given(st.lists(entries_st, min_size=1, max_size=30))
def test_entries_round_trip_through_our_encoder_and_scan(ents):
    ents = [
        Entry(term=e.term, index=i + 1, type=e.type, data=e.data or None)
        for i, e in enumerate(ents)
    ]
    buf = encode_ops([("entries", ents)])
    got = run_scan(buf)
    assert got[0] == ents
    assert got[4] == len(buf)


# --- non-canonical protobuf -------------------------------------------------------------------


def overlong(value: int, extra: int) -> bytes:
    """A valid varint for ``value`` padded with ``extra`` redundant bytes (<= 10 in total)."""
    raw = bytearray(encode_varint(value))
    extra = min(extra, 10 - len(raw))
    if extra <= 0:
        return bytes(raw)
    raw[-1] |= 0x80
    raw += b"\x80" * (extra - 1) + b"\x00"
    return bytes(raw)


@st.composite
def pb_message(draw, fields):
    """Encode (num, 'v'|'b', value) fields in a random order, with unknown fields and
    overlong varints mixed in; duplicates of a field keep the last value (protobuf)."""
    items = list(fields)
    for _ in range(draw(st.integers(0, 2))):
        num = draw(st.integers(6, 30))
        items.append((num, draw(st.sampled_from("vb")), draw(st.integers(0, 1000))))
    order = draw(st.permutations(items))
    out = bytearray()
    for num, kind, value in order:
        ext = draw(st.integers(0, 3))
        if kind == "v":
            out += overlong((num << 3) | 0, 0) + overlong(value, ext)
        else:
            data = value if isinstance(value, bytes) else bytes(value % 7)
            out += overlong((num << 3) | 2, 0) + overlong(len(data), ext) + data
    return bytes(out)


@st.composite
def noncanonical_entry_frame(draw, crc_in: int, index: int):
    e_type = draw(st.sampled_from([0, 0, 1]))
    data = draw(st.binary(min_size=1 if e_type else 0, max_size=200))
    term = draw(st.integers(1, 1000))
    fields = [(1, "v", e_type), (2, "v", term), (3, "v", index)]
    if data:
        fields.append((4, "b", data))
    entry_bytes = draw(pb_message(fields))
    crc = raftpb.crc32c(entry_bytes, crc_in)
    rec = draw(pb_message([(1, "v", 2), (2, "v", crc), (3, "b", entry_bytes)]))
    pad = -len(rec) % 8
    word = len(rec) | ((0x80 | pad) << 56 if pad else 0)
    return struct.pack("<Q", word) + rec + bytes(pad), crc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.integers(1, 8))
def test_noncanonical_valid_encodings_decode_like_the_reference(data, count):
    out = bytearray()
    crc = frame.append_crc(out, 0)
    for i in range(1, count + 1):
        fr, crc = data.draw(noncanonical_entry_frame(crc, i))
        out += fr
    got = agree(bytes(out))
    assert got is not None and [e.index for e in got[0]] == list(range(1, count + 1))


# --- garbage ----------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_fail_cleanly_and_at_the_same_frame(garbage):
    agree(garbage)


@settings(max_examples=300, deadline=None)
@given(ops_st(), st.data())
def test_mutated_logs_fail_cleanly_and_at_the_same_frame(ops, data):
    buf = bytearray(encode_ops(ops))
    assume(len(buf) > 16)
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    agree(bytes(buf))


# --- the CRC implementation ---------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000), st.integers(0, (1 << 32) - 1), st.integers(0, 50))
def test_wal_crc_agrees_with_raftpb_reference_and_chains(data, prev, cut):
    from wal.crc import crc32c_update

    cut = min(cut, len(data))
    assert crc32c_update(data, prev) == raftpb.crc32c(data, prev)
    assert crc32c_update(data[cut:], crc32c_update(data[:cut], prev)) == raftpb.crc32c(data, prev)
    assert crc32c_update(memoryview(data)[cut:], prev) == raftpb.crc32c(data[cut:], prev)


def test_the_crcmod_fallback_can_be_forced_and_decodes_the_same(tmp_path):
    """RAFTKV_WAL_CRC=crcmod selects the reference implementation (what runs where the
    optional crc32c package is absent); a WAL written by one reads with the other."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = (
        "import sys, wal, wal.crc\n"
        "from raftpb import Entry, HardState\n"
        "assert wal.crc.IMPLEMENTATION == 'crcmod', wal.crc.IMPLEMENTATION\n"
        "w = wal.open(sys.argv[1], prepare_ahead=False); w.read_all()\n"
        "w.save(HardState(term=1), [Entry(term=1, index=4, data=b'from-crcmod')])\n"
        "w.close()\n"
    )
    w = wal.create(tmp_path / "wal", b"m", segment_size_bytes=4096, prepare_ahead=False)
    w.save(HardState(term=1), [Entry(term=1, index=i, data=b"x" * i) for i in (1, 2, 3)])
    w.close()
    env = dict(os.environ, RAFTKV_WAL_CRC="crcmod", PYTHONPATH=root)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "wal")], env=env, check=True)
    r = wal.open(tmp_path / "wal", prepare_ahead=False)
    assert [e.data for e in r.read_all()[2]] == [b"x", b"xx", b"xxx", b"from-crcmod"]
    r.close()


@given(st.integers(0, U64))
def test_frame_varint_matches_the_reference_encoder(v):
    assert frame.varint(v) == encode_varint(v)
