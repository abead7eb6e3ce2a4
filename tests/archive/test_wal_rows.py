"""The raftkv-wal table's decoder without Spark (fast): rows agree with ``wal dump`` and the
committed filter with the wal reader, including rewrites of an index by a later term within
a segment and across segments (Raft figure 7), which a healthy cluster run rarely shows."""

from __future__ import annotations

import json
import os

import pytest

import wal
from kvserver.kvpb.kv import (
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    PutRequest,
    RequestOp,
    TxnRequest,
)
from kvserver.kvpb.lease import LeaseGrantRequest
from kvserver.lease.codec import encode_lease_entry
from kvserver.membership.identity import encode_metadata
from kvserver.mvcc.codec import encode_entry
from kvserver.spark.wal_rows import (
    Committed,
    WalDecodeError,
    decode_request,
    segment_rows,
    summarize,
)
from wal.dump import DumpRecord, dump
from wal.segment import list_segments, read_whole

MEMBER, CLUSTER = 0xABC, 0xC1
ORIGIN = b"\x01\x02\x03\x04\x05\x06\x07\x08"


def _proposal(seq: int, payload: bytes) -> bytes:
    return ORIGIN + seq.to_bytes(8, "big") + payload


def _put(i: int, term: int, key: str, client: int = 7, req: int | None = None) -> wal.Entry:
    payload = encode_entry(PutRequest(key.encode(), b"v"), client, i if req is None else req)
    return wal.Entry(term, i, 0, _proposal(i, payload))


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_whole(fd)
    finally:
        os.close(fd)


def _all_rows(wal_dir: str, committed: bool) -> list[dict]:
    names = [s.name for s in list_segments(wal_dir)]
    datas = [_read(os.path.join(wal_dir, n)) for n in names]
    plans = [None] * len(names)
    if committed:
        from kvserver.spark.wal_source import _committed_plan

        plans = _committed_plan([summarize(d) for d in datas])
    rows = []
    for i, (n, d, c) in enumerate(zip(names, datas, plans, strict=True)):
        rows += segment_rows(d, segment=n, where=n, newest=i == len(names) - 1, committed=c)
    return rows


@pytest.fixture
def rewritten_log(tmp_path):
    """Entries 1-6 in term 1; term 2 rewrites 5-6 and adds 7 (same segment); a cut; term 3
    rewrites 7 in the next segment and adds 8; commit ends at 7."""
    d = str(tmp_path / "wal")
    w = wal.create(d, encode_metadata(MEMBER, CLUSTER), segment_size_bytes=1 << 20)
    w.save(wal.HardState(1, 1, 0), [_put(i, 1, f"k{i}") for i in range(1, 7)])
    w.save(wal.HardState(1, 1, 4), [])
    w.save(
        wal.HardState(2, 2, 4),
        [_put(5, 2, "k5b", req=50), _put(6, 2, "k6b", req=60), _put(7, 2, "k7")],
    )
    w._cut()  # a new segment now, as a full one would be
    w.save(wal.HardState(3, 3, 6), [_put(7, 3, "k7c", req=70), _put(8, 3, "k8")])
    w.save(wal.HardState(3, 3, 7), [])
    w.close()
    return d


def test_rows_agree_with_wal_dump(rewritten_log):
    assert len(list_segments(rewritten_log)) == 2
    rows = _all_rows(rewritten_log, committed=False)
    dumped = [r for r in dump(rewritten_log)]
    assert all(isinstance(r, DumpRecord) and r.crc_ok for r in dumped)
    assert len(rows) == len(dumped)
    for row, d in zip(rows, dumped, strict=True):
        assert (row["segment"], row["offset"], row["record_type"]) == (d.segment, d.offset, d.type)
        for k in ("index", "term", "commit"):
            if k in d.fields:
                assert row[k] == d.fields[k], (k, row, d)
        if "vote" in d.fields:
            assert (int(row["vote"], 16) if row["vote"] else 0) == d.fields["vote"]
        assert (row["member"], row["cluster"]) == (f"{MEMBER:016x}", f"{CLUSTER:016x}")


def test_committed_only_is_what_the_wal_reader_keeps(rewritten_log):
    w = wal.open_for_read(rewritten_log)
    _, hs, entries = w.read_all()
    w.close()
    want = [(e.index, e.term) for e in entries if e.index <= hs.commit]
    assert want == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 2), (6, 2), (7, 3)]
    rows = _all_rows(rewritten_log, committed=True)
    assert [(r["index"], r["term"]) for r in rows] == want
    assert [r["keys"] for r in rows][-3:] == [["k5b"], ["k6b"], ["k7c"]]
    assert [int(r["request_id"]) for r in rows][-3:] == [50, 60, 70]
    assert {r["client_id"] for r in rows} == {7}
    assert {r["origin"] for r in rows} == {ORIGIN.hex()}


def test_decode_request_kinds():
    txn = TxnRequest(
        compare=(Compare(CompareResult.EQUAL, CompareTarget.VERSION, b"c"),),
        success=(
            RequestOp.of(PutRequest(b"a", b"1")),
            RequestOp.of(TxnRequest(success=(RequestOp.of(DeleteRangeRequest(b"b", b"c")),))),
        ),
        failure=(RequestOp.of(PutRequest(b"\xff", b"2")),),
    )
    r = decode_request(0, _proposal(1, encode_entry(txn, 2**64 - 1, 9)))
    assert (r["operation"], r["keys"], r["client_id"], r["request_id"]) == (
        "txn",
        ["a", "b", "\\xff"],
        2**64 - 1,
        9,
    )
    assert json.loads(r["request"])["compare"][0]["key"] == "c"
    g = decode_request(0, _proposal(2, encode_lease_entry(LeaseGrantRequest(10, 99), 5, 6)))
    assert (g["operation"], g["keys"], g["client_id"], g["request_id"]) == ("lease_grant", [], 5, 6)
    assert json.loads(g["request"]) == {"ttl_s": 10, "lease_id": 99}
    assert decode_request(0, b"")["operation"] == "empty"
    bad = decode_request(0, _proposal(3, b"\x93\x01\x02"))
    assert bad["operation"] == "undecodable" and "error" in json.loads(bad["request"])


def test_damaged_segment_is_an_error_naming_the_offset(rewritten_log):
    first = os.path.join(rewritten_log, list_segments(rewritten_log)[0].name)
    data = bytearray(_read(first))
    at = next(r.offset for r in dump(rewritten_log) if r.type == "entry")
    data[at + 30] ^= 0xFF  # inside the first entry's data: the CRC no longer matches
    with pytest.raises(WalDecodeError, match=f"offset {at}"):
        segment_rows(bytes(data), segment="s", where="s", newest=False)
    # the committed filter never hides damage either
    with pytest.raises(WalDecodeError):
        segment_rows(
            bytes(data), segment="s", where="s", newest=False, committed=Committed(100, None)
        )
