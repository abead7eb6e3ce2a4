"""raftpb: etcd's wire formats, pinned to etcd's golden bytes and round-tripped by property."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import raftpb
from raftpb import wire

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
ids = st.tuples() | st.lists(u64, max_size=5).map(tuple)
conf_states = st.builds(raftpb.ConfState, ids, ids, ids, ids, st.booleans())


def test_crc32c_known_value_and_chaining():
    """etcd's TestNew golden file: crc32c("somedata") = 0x741f6a05; Go's crc32.Update chains."""
    assert raftpb.crc32c(b"somedata") == 0x741F6A05
    assert raftpb.crc32c(b"data", raftpb.crc32c(b"some")) == 0x741F6A05


def test_record_bytes_match_etcd_golden_new_wal():
    """The three records at the head of etcd's server/storage/wal/testdata/TestNew.wal."""
    assert raftpb.encode_record(4, 0, None) == bytes.fromhex("08041000")
    meta_crc = raftpb.crc32c(b"somedata")
    assert raftpb.encode_record(1, meta_crc, b"somedata") == bytes.fromhex(
        "08011085d4fda0071a08736f6d6564617461"
    )
    snap = raftpb.encode_wal_snapshot(raftpb.WalSnapshot())
    crc = raftpb.crc32c(snap, meta_crc)
    assert crc == 0x18206D80
    assert raftpb.encode_record(5, crc, snap) == bytes.fromhex("08051080db81c1011a0408001000")


def test_empty_entry_data_is_omitted_like_etcd():
    e = raftpb.Entry(term=1, index=2, type=0, data=b"")
    assert raftpb.encode_entry(e) == bytes.fromhex("080010011802")
    assert raftpb.decode_entry(raftpb.encode_entry(e)).data is None


@given(u64)
def test_varint_round_trip(v):
    enc = wire.encode_varint(v)
    assert wire.decode_varint(enc, 0) == (v, len(enc))


@given(st.builds(raftpb.Entry, u64, u64, st.integers(0, 2), st.none() | st.binary(min_size=1)))
def test_entry_round_trip(e):
    assert raftpb.decode_entry(raftpb.encode_entry(e)) == e


@given(st.builds(raftpb.HardState, u64, u64, u64))
def test_hard_state_round_trip(hs):
    assert raftpb.decode_hard_state(raftpb.encode_hard_state(hs)) == hs


@given(st.builds(raftpb.WalSnapshot, u64, u64, st.none() | conf_states))
def test_wal_snapshot_round_trip(ws):
    assert raftpb.decode_wal_snapshot(raftpb.encode_wal_snapshot(ws)) == ws


@given(
    st.builds(
        raftpb.Snapshot,
        st.none() | st.binary(),
        st.builds(raftpb.SnapshotMetadata, conf_states, u64, u64),
    )
)
def test_snapshot_round_trip(snap):
    assert raftpb.decode_snapshot(raftpb.encode_snapshot(snap)) == snap


@given(st.integers(0, 5), st.integers(0, (1 << 32) - 1), st.none() | st.binary())
def test_record_round_trip(rtype, crc, data):
    assert raftpb.decode_record(raftpb.encode_record(rtype, crc, data)) == raftpb.Record(
        rtype, crc, data
    )


@given(st.binary(max_size=64))
def test_decoders_never_raise_anything_but_decode_error(junk):
    """Garbage in gives a DecodeError or some value — never another exception type."""
    for decode in (
        raftpb.decode_record,
        raftpb.decode_entry,
        raftpb.decode_hard_state,
        raftpb.decode_snapshot,
        raftpb.decode_wal_snapshot,
        raftpb.decode_snap_file,
    ):
        try:
            decode(junk)
        except raftpb.DecodeError:
            pass


@pytest.mark.parametrize("buf", [b"\x80", b"\xff" * 11, b"\x1a\x05ab", b"\x00\x01"])
def test_malformed_input_is_a_decode_error(buf):
    with pytest.raises(raftpb.DecodeError):
        raftpb.decode_record(buf)
