"""The WAL's contract, pinned to etcd's behaviour (server/storage/wal/wal.go).

create/open/read_all/save/cut/close: what read_all returns (entries after the snapshot,
later writes of an index replace the tail as in Raft figure 7, the last hard state wins),
what it refuses (missing or mismatching snapshot record, metadata conflicts, gaps, missing
segments), when save fsyncs (etcd's MustSync), how segments are cut and named, and how
sync policies and I/O failures behave.
"""

import os
import struct
import time

import pytest

import wal
from raftpb import ConfState, Entry, HardState, WalSnapshot
from wal import frame
from wal.dump import DumpRecord, dump
from wal.policy import SyncMode, SyncPolicy

from .helpers import CountingSync, entries, payload, segment_files


def make(tmp_path, **kw):
    kw.setdefault("segment_size_bytes", 64 * 1024)
    kw.setdefault("prepare_ahead", False)
    return wal.create(tmp_path / "wal", b"node-1", **kw)


def reopen(tmp_path, snap=None, **kw):
    kw.setdefault("prepare_ahead", False)
    w = wal.open(tmp_path / "wal", snap, **kw)
    return w, w.read_all()


def test_read_all_returns_everything_saved_in_order(tmp_path):
    w = make(tmp_path)
    w.save(HardState(term=1, vote=1, commit=0), entries(1, 10))
    w.save(HardState(term=1, vote=1, commit=10), [])
    w.close()
    w, (md, hs, ents) = reopen(tmp_path)
    assert md == b"node-1"
    assert hs == HardState(term=1, vote=1, commit=10)
    assert ents == entries(1, 10)
    w.close()


def test_a_later_write_of_an_index_replaces_the_tail_raft_figure_7(tmp_path):
    w = make(tmp_path)
    w.save(HardState(term=1, vote=1), entries(1, 10, term=1))
    w.save(HardState(term=2, vote=2), entries(6, 7, term=2))  # a new leader overwrote 6..10
    w.close()
    w, (_, hs, ents) = reopen(tmp_path)
    assert ents == entries(1, 5, term=1) + entries(6, 7, term=2)
    assert hs.term == 2
    w.close()


def test_rewrites_across_segment_cuts(tmp_path):
    w = make(tmp_path, segment_size_bytes=256)
    w.save(HardState(term=1), entries(1, 20, term=1))
    for i in range(21, 40):
        w.save(None, entries(i, i, term=1))
    w.save(HardState(term=3), entries(15, 30, term=3))
    w.save(None, entries(31, 32, term=3))
    w.close()
    assert len(segment_files(tmp_path / "wal")) > 5
    w, (_, _, ents) = reopen(tmp_path)
    assert ents == entries(1, 14, term=1) + entries(15, 32, term=3)
    w.close()


def test_read_from_a_snapshot_keeps_only_later_entries(tmp_path):
    w = make(tmp_path, segment_size_bytes=512)
    for i in range(1, 31, 3):
        w.save(HardState(term=1, commit=i), entries(i, i + 2))
    w.save_snapshot(WalSnapshot(index=20, term=1, conf_state=ConfState(voters=(1,))))
    w.save(None, entries(31, 40))
    w.close()
    w, (_, _, ents) = reopen(tmp_path, WalSnapshot(index=20, term=1))
    assert ents == entries(21, 40)
    w.close()
    # reading starts at the last segment whose first index is <= the snapshot index
    names = [wal.parse_segment_name(n) for n in segment_files(tmp_path / "wal")]
    start = max(n for n in names if n.index <= 20)
    assert start.seq > 0
    w = wal.open(tmp_path / "wal", WalSnapshot(index=20, term=1), prepare_ahead=False)
    assert [os.path.basename(p) for p in w.segment_paths()] == [
        n.name for n in names if n.seq >= start.seq
    ]
    w.close()


def test_missing_snapshot_record_is_an_error(tmp_path):
    w = make(tmp_path)
    w.save(HardState(term=1), entries(1, 5))
    w.close()
    w = wal.open(tmp_path / "wal", WalSnapshot(index=3, term=1), prepare_ahead=False)
    with pytest.raises(wal.SnapshotNotFoundError):
        w.read_all()
    w.close()
    with pytest.raises(wal.SnapshotNotFoundError):
        wal.verify(tmp_path / "wal", WalSnapshot(index=3, term=1))


def test_snapshot_record_with_another_term_is_an_error(tmp_path):
    w = make(tmp_path)
    w.save(HardState(term=2), entries(1, 5, term=2))
    w.save_snapshot(WalSnapshot(index=4, term=2))
    w.close()
    w = wal.open(tmp_path / "wal", WalSnapshot(index=4, term=1), prepare_ahead=False)
    with pytest.raises(wal.SnapshotMismatchError) as info:
        w.read_all()
    assert info.value.file.endswith(".wal") and info.value.offset > 0
    w.close()


def test_snapshot_before_the_first_segment_is_segment_not_found(tmp_path):
    w = make(tmp_path, segment_size_bytes=128)
    w.save(HardState(term=1), entries(1, 10))
    w.close()
    os.unlink(tmp_path / "wal" / segment_files(tmp_path / "wal")[0])
    with pytest.raises(wal.SegmentNotFoundError):
        wal.open(tmp_path / "wal", WalSnapshot(index=0, term=0))


def test_a_missing_middle_segment_is_detected(tmp_path):
    w = make(tmp_path, segment_size_bytes=128)
    w.save(HardState(term=1), entries(1, 10))
    for i in range(11, 15):
        w.save(None, entries(i, i))
    w.close()
    names = segment_files(tmp_path / "wal")
    assert len(names) >= 4
    os.unlink(tmp_path / "wal" / names[2])
    with pytest.raises(wal.SegmentSequenceError):
        wal.open(tmp_path / "wal")
    with pytest.raises(wal.SegmentSequenceError):
        wal.verify(tmp_path / "wal")


def _tail_crc(path) -> int:
    from wal.decoder import ScanState, scan

    st = ScanState(1 << 63)
    scan(open(path, "rb").read(), 0, st)
    return st.crc


def test_metadata_must_agree_across_segments(tmp_path):
    w = make(tmp_path)
    w.save(HardState(term=1), entries(1, 3))
    w.close()
    first = tmp_path / "wal" / segment_files(tmp_path / "wal")[0]
    crc = _tail_crc(first)
    with open(first, "r+b") as f:  # close the segment like a cut does
        data = f.read()
        from wal.decoder import ScanState, scan

        end = scan(data, 0, ScanState(1 << 63))
        f.truncate(end)
    # a second segment whose CRC chain is valid but whose metadata is another node's
    out = bytearray()
    c = frame.append_crc(out, crc)
    c = frame.append_metadata(out, b"node-2", c)
    frame.append_entries(out, entries(4, 4), c)
    second = tmp_path / "wal" / wal.segment_name(1, 4)
    second.write_bytes(bytes(out))
    w = wal.open(tmp_path / "wal", prepare_ahead=False)
    with pytest.raises(wal.MetadataMismatchError) as info:
        w.read_all()
    assert info.value.file == str(second) and info.value.offset == 16
    w.close()


def test_an_index_gap_is_corruption_not_a_shorter_log(tmp_path):
    w = make(tmp_path)
    w.save(HardState(term=1), entries(1, 3))
    w.save(None, entries(5, 6))  # the WAL does not police raft; the reader does
    w.close()
    w = wal.open(tmp_path / "wal", prepare_ahead=False)
    with pytest.raises(wal.CorruptError, match="gap"):
        w.read_all()
    w.close()


def test_lifecycle_errors_are_typed(tmp_path):
    w = make(tmp_path)
    w.save(HardState(term=1), entries(1, 2))
    w.close()
    with pytest.raises(wal.WalStateError):
        w.save(None, entries(3, 3))
    w = wal.open(tmp_path / "wal", prepare_ahead=False)
    with pytest.raises(wal.WalStateError, match="read_all"):
        w.save(None, entries(3, 3))
    w.read_all()
    with pytest.raises(wal.WalStateError):
        w.read_all()
    w.close()
    w.close()  # idempotent
    r = wal.open_for_read(tmp_path / "wal")
    r.read_all()
    with pytest.raises(wal.WalStateError):
        r.save(None, entries(3, 3))
    r.close()


def test_create_refuses_a_non_empty_directory_and_leaves_no_tmp(tmp_path):
    make(tmp_path).close()
    with pytest.raises(wal.WalExistsError):
        make(tmp_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file").write_text("x")
    with pytest.raises(FileExistsError):
        wal.create(tmp_path / "other", b"m")
    (tmp_path / "empty").mkdir()
    wal.create(tmp_path / "empty", b"m", segment_size_bytes=4096).close()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_save_fsyncs_only_when_etcd_must_sync_says_so(tmp_path):
    sync = CountingSync()
    w = make(tmp_path, sync_fn=sync)
    base = sync.calls
    w.save(HardState(term=1, vote=1, commit=0), entries(1, 2))
    assert sync.calls == base + 1  # entries
    w.save(HardState(term=1, vote=1, commit=2), [])
    assert sync.calls == base + 1  # commit only: no fsync
    w.save(HardState(term=2, vote=0, commit=2), [])
    assert sync.calls == base + 2  # term changed
    w.save(HardState(term=2, vote=3, commit=2), [])
    assert sync.calls == base + 3  # vote changed
    w.save(None, [])
    w.save(HardState(), [])
    assert sync.calls == base + 3  # nothing to write
    w.save(None, entries(3, 3), must_sync=False)
    assert sync.calls == base + 3  # the caller decides
    w.save(HardState(term=2, vote=3, commit=3), [], must_sync=True)
    assert sync.calls == base + 4
    w.save_snapshot(WalSnapshot(index=2, term=1))
    assert sync.calls == base + 5
    w.close()
    w, (_, hs, ents) = reopen(tmp_path)
    assert hs == HardState(term=2, vote=3, commit=3) and ents == entries(1, 3)
    w.close()


def test_empty_save_writes_nothing(tmp_path):
    w = make(tmp_path)
    path = w.segment_paths()[-1]
    before = open(path, "rb").read()
    w.save(None, [])
    w.save(HardState(), [])
    assert open(path, "rb").read() == before
    w.close()


def test_cut_names_the_next_segment_and_starts_it_with_crc_metadata_state(tmp_path):
    size = 1024
    w = make(tmp_path, segment_size_bytes=size, prepare_ahead=True)
    w.save(HardState(term=1, vote=1, commit=3), entries(1, 3, size=400))  # crosses 1024
    assert len(w.segment_paths()) == 2
    w.save(None, entries(4, 4))
    w.close()
    names = segment_files(tmp_path / "wal")
    assert names == [wal.segment_name(0, 0), wal.segment_name(1, 4)]
    first, second = (tmp_path / "wal" / n for n in names)
    assert os.path.getsize(second) == size  # preallocated
    recs = [r for r in dump(tmp_path / "wal") if isinstance(r, DumpRecord)]
    assert all(r.crc_ok for r in recs)
    seg0 = [r for r in recs if r.segment == names[0]]
    seg1 = [r for r in recs if r.segment == names[1]]
    assert os.path.getsize(first) == seg0[-1].offset + seg0[-1].frame_bytes  # truncated
    assert [r.type for r in seg1] == ["crc", "metadata", "state", "entry"]
    assert seg1[0].crc == seg0[-1].crc  # the chain continues
    assert seg1[2].fields == {"term": 1, "vote": 1, "commit": 3}
    assert not [n for n in os.listdir(tmp_path / "wal") if n.endswith(".tmp")]


def test_reopened_wal_appends_after_the_last_record_with_the_crc_chained(tmp_path):
    w = make(tmp_path, segment_size_bytes=300)
    w.save(HardState(term=1), entries(1, 5))
    w.close()
    for k in range(3):
        w, (_, _, ents) = reopen(tmp_path, segment_size_bytes=300)
        assert ents == entries(1, 5 + 3 * k)
        w.save(HardState(term=1, commit=k), entries(6 + 3 * k, 8 + 3 * k))
        w.close()
    assert wal.verify(tmp_path / "wal", allow_torn_tail=False).commit == 2


def test_bytes_after_the_end_of_data_are_zeroed_before_appending(tmp_path):
    w = make(tmp_path)
    w.save(HardState(term=1), entries(1, 3))
    path = w.segment_paths()[-1]
    w.close()
    data = open(path, "rb").read()
    from wal.decoder import ScanState, scan

    end = scan(data, 0, ScanState(1 << 63))
    # leftovers of an unsynced write beyond a zero length word (etcd's ZeroToEnd case)
    with open(path, "r+b") as f:
        f.seek(end + 8)
        f.write(struct.pack("<Q", 24) + b"\x08\x02\x10\x07" + bytes(20))
    w, (_, _, ents) = reopen(tmp_path)
    assert ents == entries(1, 3)
    after = open(path, "rb").read()
    assert after[end:] == bytes(len(after) - end) and len(after) == len(data)
    w.save(None, entries(4, 4, size=3))  # shorter than the leftovers
    w.close()
    w, (_, _, ents) = reopen(tmp_path)
    assert ents == entries(1, 3) + entries(4, 4, size=3)
    w.close()


def test_valid_snapshot_entries_are_those_committed(tmp_path):
    w = make(tmp_path, segment_size_bytes=256)
    w.save(HardState(term=1, commit=5), entries(1, 10))
    w.save_snapshot(WalSnapshot(index=5, term=1, conf_state=ConfState(voters=(1, 2))))
    w.save_snapshot(WalSnapshot(index=9, term=1))  # not committed yet
    w.close()
    assert wal.valid_snapshot_entries(tmp_path / "wal") == [
        WalSnapshot(),
        WalSnapshot(index=5, term=1, conf_state=ConfState(voters=(1, 2))),
    ]
    assert wal.verify(tmp_path / "wal", WalSnapshot(index=5, term=1)) == HardState(term=1, commit=5)


def test_valid_snapshot_entries_locked_maps_the_same_log_and_refuses_an_open_one(tmp_path):
    w = make(tmp_path, segment_size_bytes=256)
    w.save(HardState(term=1, commit=8), entries(1, 10))
    w.save_snapshot(WalSnapshot(index=3, term=1))
    w.save(HardState(term=1, commit=9), entries(11, 12))
    w.save_snapshot(WalSnapshot(index=8, term=1, conf_state=ConfState(voters=(1,))))
    assert len(segment_files(tmp_path / "wal")) >= 2  # more than one segment is mapped
    with pytest.raises(wal.LockedError):  # the open WAL holds its tail segment
        wal.valid_snapshot_entries(tmp_path / "wal", locked=True)
    w.close()
    unlocked = wal.valid_snapshot_entries(tmp_path / "wal")
    assert wal.valid_snapshot_entries(tmp_path / "wal", locked=True) == unlocked
    assert [s.index for s in unlocked] == [0, 3, 8]
    # the locks went with the scan: the log opens for appending afterwards
    w, (_, hs, ents) = reopen(tmp_path, WalSnapshot(index=8, term=1))
    assert hs.commit == 9 and [e.index for e in ents] == [9, 10, 11, 12]
    w.close()


def test_entries_keep_type_and_absent_data(tmp_path):
    w = make(tmp_path)
    ents = [
        Entry(term=1, index=1),
        Entry(term=1, index=2, type=1, data=b"cc"),
        Entry(term=1, index=3, type=2, data=b"v2"),
        Entry(term=1, index=4, data=b""),
    ]
    w.save(HardState(term=1), ents)
    w.close()
    w, (_, _, got) = reopen(tmp_path)
    assert got == ents[:3] + [Entry(term=1, index=4)]  # empty data is stored as absent
    w.close()


# --- sync policies --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,want",
    [
        ("always", SyncPolicy()),
        ("never", SyncPolicy(SyncMode.NEVER)),
        ("interval=5", SyncPolicy(SyncMode.INTERVAL, 5)),
        ("interval=250ms", SyncPolicy(SyncMode.INTERVAL, 250)),
    ],
)
def test_sync_policy_parsing(text, want):
    assert SyncPolicy.parse(text) == want
    assert SyncPolicy.parse(str(want)) == want


@pytest.mark.parametrize(
    "text",
    [
        "",
        "off",
        "none",
        "0",
        "false",
        "NEVER",
        "interval=0",
        "interval=",
        "interval=-1",
        "interval=999999",
    ],
)
def test_never_is_only_selected_by_name_and_bad_policies_are_refused(text):
    with pytest.raises(ValueError):
        SyncPolicy.parse(text)


def test_never_policy_does_not_sync_data(tmp_path):
    sync = CountingSync()
    w = make(tmp_path, sync_fn=sync, sync_policy="never")
    w.save(HardState(term=1), entries(1, 50))
    w.close()
    assert sync.calls == 0
    w, (_, _, ents) = reopen(tmp_path)
    assert len(ents) == 50
    w.close()


def test_interval_policy_acknowledges_at_write_and_syncs_in_the_background(tmp_path):
    sync = CountingSync()
    w = make(tmp_path, sync_fn=sync, sync_policy="interval=20")
    for i in range(1, 21):
        w.save(HardState(term=1), entries(i, i))
    deadline = time.monotonic() + 10
    while sync.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert 1 <= sync.calls < 20  # background, batched
    w.close()


def test_a_failed_fsync_poisons_the_wal(tmp_path):
    sync = CountingSync()
    w = make(tmp_path, sync_fn=sync)
    w.save(HardState(term=1), entries(1, 2))
    sync.fail_with = OSError(5, "EIO")
    with pytest.raises(wal.WalFailedError):
        w.save(None, entries(3, 3))
    sync.fail_with = None
    with pytest.raises(wal.WalFailedError):
        w.save(None, entries(4, 4))  # no retry after a failed fsync
    w.close()
    w, (_, _, ents) = reopen(tmp_path)
    assert ents[:2] == entries(1, 2)
    w.close()


def test_hard_state_and_entries_are_duck_typed(tmp_path):
    class RaftEntry:
        def __init__(self, term, index, data):
            self.term, self.index, self.type, self.data = term, index, 0, data

    class RaftHardState:
        term, vote, commit = 4, 2, 1

    w = make(tmp_path)
    w.save(RaftHardState(), [RaftEntry(4, 1, payload(1, 4))])
    w.close()
    w, (_, hs, ents) = reopen(tmp_path)
    assert hs == HardState(4, 2, 1) and ents == [Entry(4, 1, 0, payload(1, 4))]
    w.close()


def test_a_rewrite_at_the_snapshot_index_drops_the_stale_tail(tmp_path):
    """Found by the model test: entries 19..21 (term 1), then 20 rewritten (term 2), then
    commit and a snapshot at 20. Reading from that snapshot skips both writes of 20, but the
    old 21 was truncated by the second one and must not come back. (etcd's ReadAll returns
    it: it only truncates on entries above the snapshot.)"""
    w = make(tmp_path)
    w.save(HardState(term=1, commit=18), entries(1, 21, term=1))
    w.save(HardState(term=2, commit=18), entries(20, 20, term=2))
    w.save(HardState(term=2, commit=20), [])
    w.save_snapshot(WalSnapshot(index=20, term=2))
    w.close()
    w, (_, _, ents) = reopen(tmp_path, WalSnapshot(index=20, term=2))
    assert ents == []
    w.save(None, entries(21, 22, term=2))
    w.close()
    w, (_, _, ents) = reopen(tmp_path, WalSnapshot(index=20, term=2))
    assert ents == entries(21, 22, term=2)
    w.close()
