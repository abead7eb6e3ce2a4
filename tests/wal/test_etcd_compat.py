"""WAL directories written by a real etcd v3.4 decode with our reader, every CRC checked.

etcd is started on loopback (free ports, its own data dir, ``--snapshot-count 100`` so it
also writes snapshot records), a few hundred keys are written through its JSON gateway,
plus deletes and a transaction; it is stopped with SIGTERM. Then, on a copy of
``member/wal``: strict ``verify`` from the first segment, ``open`` + ``read_all`` from the
empty snapshot and from the newest snapshot etcd recorded, ``dump`` (every crc_ok), and
the entries must carry the raft requests for our keys (etcd's internal encoding: we only
look for the key bytes). Reference: etcd server/storage/wal (v3.4: wal/).
"""

import os
import shutil

import pytest

import wal
from raftpb import WalSnapshot
from raftpb.wire import iter_fields
from tests.etcd_process import b64, etcd_process
from wal.dump import DumpRecord, dump

pytestmark = [pytest.mark.external, pytest.mark.slow]

KEYS = 300


def _write_through_etcd(root: str) -> str:
    """Start etcd, write, delete and txn through its gateway, stop it; return its data dir."""
    with etcd_process(root, name="walcompat", snapshot_count=100) as etcd:
        for i in range(KEYS):
            etcd.put(f"/walcompat/key-{i:04d}", f"value {i} " * 6)
        for i in range(0, KEYS, 10):
            etcd.post("/v3/kv/deleterange", {"key": b64(f"/walcompat/key-{i:04d}")})
        txn = etcd.post(
            "/v3/kv/txn",
            {
                "compare": [
                    {
                        "key": b64("/walcompat/key-0001"),
                        "target": "VERSION",
                        "result": "EQUAL",
                        "version": "1",
                    }
                ],
                "success": [
                    {"requestPut": {"key": b64("/walcompat/txn"), "value": b64("from-txn")}}
                ],
            },
        )
        assert txn.get("succeeded") is True, txn
    return etcd.data_dir


def test_wal_written_by_etcd_decodes_with_every_crc_checked(tmp_path):
    data_dir = _write_through_etcd(str(tmp_path))
    copy = str(tmp_path / "wal")
    shutil.copytree(os.path.join(data_dir, "member", "wal"), copy)  # opening may zero a tail
    names = [n for n in os.listdir(copy) if n.endswith(".wal")]
    assert wal.segment_name(0, 0) in names

    hs = wal.verify(copy, None, allow_torn_tail=False)  # every segment, every CRC, strict
    assert hs.term >= 1 and hs.commit >= KEYS + KEYS // 10 + 2

    records = list(dump(copy))
    assert records and all(isinstance(r, DumpRecord) and r.crc_ok for r in records)
    assert {"crc", "metadata", "snapshot", "entry", "state"} <= {r.type for r in records}

    w = wal.open(copy, WalSnapshot(), prepare_ahead=False)
    metadata, hs_all, ents = w.read_all()
    w.close()
    assert hs_all == hs
    meta = {num: value for num, _, value in iter_fields(metadata)}  # etcdserverpb.Metadata
    assert meta.get(1) and meta.get(2), "node id and cluster id"
    assert [e.index for e in ents] == list(range(1, len(ents) + 1))
    assert ents[-1].index >= hs.commit
    assert any(e.type == 1 for e in ents), "etcd bootstraps with a conf change entry"
    blob = b"\n".join(e.data or b"" for e in ents)
    missing = [i for i in range(KEYS) if f"/walcompat/key-{i:04d}".encode() not in blob]
    assert not missing, f"puts not found in the entries: {missing[:5]}"
    assert b"/walcompat/txn" in blob and b"from-txn" in blob

    snaps = wal.valid_snapshot_entries(copy)
    assert snaps[0] == WalSnapshot() and len(snaps) >= 2, snaps
    newest = snaps[-1]
    assert newest.index >= 100
    # etcd 3.5 records the conf state in walpb.Snapshot; 3.4 leaves the field out
    assert newest.conf_state is None or len(newest.conf_state.voters) == 1
    w = wal.open(copy, newest, prepare_ahead=False)
    _, hs_snap, after = w.read_all()
    w.close()
    assert hs_snap == hs
    assert after == [e for e in ents if e.index > newest.index]

    # Our encoder reproduces etcd's bytes: re-encode every record etcd wrote (entries from
    # their decoded fields) with our write path and compare the segments byte for byte.
    from raftpb import decode_entry, decode_hard_state, decode_wal_snapshot
    from wal import frame
    from wal.decoder import iter_raw_records

    for name in sorted(names):
        theirs = open(os.path.join(copy, name), "rb").read()
        ours = bytearray()
        crc = 0
        for raw in iter_raw_records(theirs):
            if raw.type == frame.RecordType.CRC:
                crc = frame.append_crc(ours, raw.crc)
            elif raw.type == frame.RecordType.ENTRY:
                crc = frame.append_entries(ours, [decode_entry(raw.data)], crc)
            elif raw.type == frame.RecordType.STATE:
                crc = frame.append_state(ours, decode_hard_state(raw.data), crc)
            elif raw.type == frame.RecordType.SNAPSHOT:
                crc = frame.append_snapshot(ours, decode_wal_snapshot(raw.data), crc)
            else:
                crc = frame.append_metadata(ours, raw.data, crc)
        assert len(ours) > 0 and theirs[: len(ours)] == bytes(ours), name
        assert not any(theirs[len(ours) :]), name  # then only preallocated zeros
