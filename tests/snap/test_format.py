"""The bytes of a .snap file: etcd's snappb.Snapshot{crc=1, data=2} around raftpb.Snapshot.

Pins down that a file we write is exactly what etcd's Snapshotter.SaveSnap writes for the same
raft snapshot (marshal, CRC-32C over the marshalled bytes, marshal the snappb wrapper), that
the reader accepts etcd's layout and any other valid protobuf field order, and that neither
direction keeps extra copies of a large payload.
"""

import os
import tracemalloc

import pytest

import raftpb
from raftpb.wire import bytes_field, decode_varint, uint_field
from snap import CHUNK_BYTES, Snapshotter, read_snap
from tests.snap.helpers import crc32c_bitwise, make_snapshot, reference_file_bytes


def _file_bytes(tmp_path, snapshot) -> bytes:
    path = Snapshotter(tmp_path).save_snap(snapshot)
    with open(path, "rb") as f:
        return f.read()


def test_golden_bytes_of_a_small_snapshot(tmp_path):
    """Field by field: snappb crc (field 1, varint) then data (field 2); inside, raftpb data
    (field 1) then metadata (field 2: conf_state=1 with unpacked voters and auto_leave=5
    always written, index=2, term=3). The CRC comes from an independent bitwise CRC-32C."""
    snapshot = make_snapshot(index=5, term=2, data=b"hello", voters=(1, 2, 3))
    inner = bytes.fromhex(
        "0a05"
        "68656c6c6f"  # data = "hello"
        "120e"
        "0a08"
        "080108020803"
        "2800"  # metadata: conf_state{voters 1,2,3; auto_leave}
        "1005"
        "1802"
    )  #   index 5, term 2
    crc = crc32c_bitwise(inner)
    assert crc == raftpb.crc32c(inner)
    expected = bytes.fromhex("08ac9988c5091217") + inner
    assert decode_varint(expected, 1)[0] == crc
    assert _file_bytes(tmp_path, snapshot) == expected


def test_file_name_is_term_then_index_in_16_hex_digits(tmp_path):
    path = Snapshotter(tmp_path).save_snap(make_snapshot(index=0x1234, term=0xAB))
    assert os.path.basename(path) == "00000000000000ab-0000000000001234.snap"


@pytest.mark.parametrize(
    "data",
    [None, b"", b"x", os.urandom(3 * CHUNK_BYTES + 17)],
    ids=["none", "empty", "one-byte", "multi-chunk"],
)
def test_written_file_equals_etcd_savesnap_encoding(tmp_path, data):
    snapshot = make_snapshot(index=7, term=3, data=data, voters=(1, 0xFFFFFFFFFFFFFFFF))
    written = _file_bytes(tmp_path, snapshot)
    assert written == reference_file_bytes(snapshot)
    # and it decodes with raftpb's own decoders, CRC included
    record = raftpb.decode_snap_file(written)
    assert record.crc == raftpb.crc32c(record.data)
    assert raftpb.decode_snapshot(record.data) == snapshot


def test_layout_is_crc_varint_then_length_delimited_data(tmp_path):
    written = _file_bytes(tmp_path, make_snapshot(index=9, term=4, data=b"z" * 300))
    assert written[0] == 0x08  # field 1, wire type 0 (varint)
    crc, pos = decode_varint(written, 1)
    assert written[pos] == 0x12  # field 2, wire type 2 (length-delimited)
    length, pos = decode_varint(written, pos + 1)
    assert pos + length == len(written)  # nothing after the data field
    assert crc == crc32c_bitwise(written[pos:])


def test_data_none_and_empty_data_are_kept_apart(tmp_path):
    s = Snapshotter(tmp_path)
    s.save_snap(make_snapshot(index=1, data=None))
    assert s.load().data is None
    s.save_snap(make_snapshot(index=2, data=b""))
    assert s.load().data == b""


def test_any_buffer_is_accepted_as_data(tmp_path):
    payload = os.urandom(1000)
    expected = reference_file_bytes(make_snapshot(index=3, data=payload))
    for i, data in enumerate((bytearray(payload), memoryview(payload))):
        d = tmp_path / str(i)
        assert _file_bytes(d, make_snapshot(index=3, data=data)) == expected


def _write(path, content: bytes) -> None:
    with open(path, "wb") as f:
        f.write(content)


def test_reader_accepts_other_valid_field_orders_and_unknown_fields(tmp_path):
    """protobuf allows any field order and unknown fields; the fast path only takes etcd's
    order, so these exercise the general decoder."""
    snapshot = make_snapshot(index=11, term=5, data=b"payload")
    md_field = raftpb.encode_snapshot(raftpb.Snapshot(data=None, metadata=snapshot.metadata))
    inner_reversed = md_field + bytes_field(1, snapshot.data)
    crc = raftpb.crc32c(inner_reversed)
    name = "0000000000000005-000000000000000b.snap"
    variants = {
        "inner-reversed": uint_field(1, crc) + bytes_field(2, inner_reversed),
        "outer-reversed": bytes_field(2, inner_reversed) + uint_field(1, crc),
        "unknown-outer-field": uint_field(1, crc)
        + bytes_field(2, inner_reversed)
        + uint_field(15, 99),
    }
    inner = raftpb.encode_snapshot(snapshot)
    variants["unknown-inner-field"] = (
        lambda b: uint_field(1, raftpb.crc32c(b)) + bytes_field(2, b)
    )(inner + uint_field(9, 1))
    for label, content in variants.items():
        d = tmp_path / label
        d.mkdir()
        _write(d / name, content)
        assert read_snap(str(d / name)) == snapshot, label


def test_save_keeps_no_second_copy_and_load_keeps_one(tmp_path):
    """Limits documented in snap/__init__: saving a D-byte payload allocates far less than D
    (pieces are written from memoryviews); loading allocates about one D."""
    size = 16 << 20
    snapshot = make_snapshot(index=1, data=os.urandom(size))
    s = Snapshotter(tmp_path)
    tracemalloc.start()
    try:
        s.save_snap(snapshot)
        _, save_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        loaded = s.load()
        _, load_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert loaded == snapshot
    assert save_peak < size // 16, save_peak
    assert load_peak < size * 1.25, load_peak
