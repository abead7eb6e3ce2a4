"""Property tests (hypothesis) for snap/.

* save/load round trips any snapshot: random data (None, empty, binary) and metadata (uint64
  index/term, conf states), and the bytes equal etcd's SaveSnap encoding;
* reading arbitrary or mutated bytes gives a typed CorruptSnapshotError or the original
  snapshot, never a different snapshot and never another exception;
* a model of the directory: over random sequences of saves (with or without their WAL record),
  corruptions and purges, load_newest_available returns exactly the newest intact snapshot the
  WAL knows about, and quarantines exactly the corrupt files newer than it.
"""

import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import raftpb
from snap import CorruptSnapshotError, NoSnapshotError, Snapshotter, read_snap
from tests.snap.helpers import reference_file_bytes

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
ids = st.lists(u64, max_size=4).map(tuple)
conf_states = st.builds(raftpb.ConfState, ids, ids, ids, ids, st.booleans())
datas = st.none() | st.binary(max_size=2000)
snapshots = st.builds(
    raftpb.Snapshot,
    datas,
    st.builds(
        raftpb.SnapshotMetadata, conf_states, st.integers(min_value=1, max_value=(1 << 64) - 1), u64
    ),
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(snapshots)
def test_save_load_round_trip(snapshot):
    with tempfile.TemporaryDirectory() as d:
        s = Snapshotter(d)
        path = s.save_snap(snapshot)
        with open(path, "rb") as f:
            assert f.read() == reference_file_bytes(snapshot)
        md = snapshot.metadata
        assert (
            s.load_newest_available([raftpb.WalSnapshot(index=md.index, term=md.term)]) == snapshot
        )


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_crash_the_reader(content):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "whatever.snap")
        with open(path, "wb") as f:
            f.write(content)
        try:
            snapshot = read_snap(path)
        except CorruptSnapshotError:
            return
        # accepted: then it really is a well-formed, CRC-valid snappb record
        record = raftpb.decode_snap_file(content)
        assert record.crc == raftpb.crc32c(record.data)
        assert raftpb.decode_snapshot(record.data) == snapshot


@SETTINGS
@given(
    snapshots,
    st.lists(st.tuples(st.integers(min_value=0), st.integers(1, 255)), min_size=1, max_size=4),
)
def test_mutated_file_is_rejected_or_unchanged(snapshot, edits):
    content = bytearray(reference_file_bytes(snapshot))
    for pos, xor in edits:
        content[pos % len(content)] ^= xor
    with tempfile.TemporaryDirectory() as d:
        md = snapshot.metadata
        path = os.path.join(d, f"{md.term:016x}-{md.index:016x}.snap")
        with open(path, "wb") as f:
            f.write(content)
        try:
            loaded = read_snap(path)
        except CorruptSnapshotError:
            return
        assert loaded == snapshot  # edits that cancel out; never a different snapshot


class SnapDirModel(RuleBasedStateMachine):
    """The real directory against a dict of what should be there."""

    def __init__(self):
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.snapper = Snapshotter(self._tmp.name)
        self.files: dict[tuple[int, int], bytes] = {}  # (term, index) -> data, intact files
        self.corrupt: set[tuple[int, int]] = set()  # files present but damaged
        self.wal: set[tuple[int, int]] = {(0, 0)}  # (term, index) of WAL snapshot records
        self.next_index = 1

    def teardown(self):
        self._tmp.cleanup()

    def _path(self, key):
        return os.path.join(self._tmp.name, f"{key[0]:016x}-{key[1]:016x}.snap")

    @rule(term_bump=st.integers(0, 1), data=st.binary(max_size=64), with_wal=st.booleans())
    def save(self, term_bump, data, with_wal):
        term = max([t for t, _ in self.files] + [t for t, _ in self.corrupt] + [1]) + term_bump
        key = (term, self.next_index)
        self.next_index += 1
        self.snapper.save_snap(
            raftpb.Snapshot(data=data, metadata=raftpb.SnapshotMetadata(index=key[1], term=key[0]))
        )
        self.files[key] = data
        if with_wal:  # False: crashed between save_snap and the WAL record
            self.wal.add(key)

    @precondition(lambda self: self.files)
    @rule(which=st.integers(min_value=0), how=st.sampled_from(["flip", "truncate", "empty"]))
    def corrupt_a_file(self, which, how):
        key = sorted(self.files)[which % len(self.files)]
        path = self._path(key)
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if how == "flip":
                f.seek(size - 1)
                last = f.read(1)[0]
                f.seek(size - 1)
                f.write(bytes((last ^ 0x40,)))
            else:
                f.truncate(size // 2 if how == "truncate" else 0)
        del self.files[key]
        self.corrupt.add(key)

    @rule(keep=st.integers(0, 4))
    def purge(self, keep):
        present = sorted(set(self.files) | self.corrupt, reverse=True)
        removed = self.snapper.purge(keep=keep)
        expected = [] if keep == 0 else present[keep:]
        assert sorted(removed) == sorted(f"{t:016x}-{i:016x}.snap" for t, i in expected)
        for key in expected:
            self.files.pop(key, None)
            self.corrupt.discard(key)

    @rule()
    def load(self):
        wal_snaps = [raftpb.WalSnapshot(index=i, term=t) for t, i in self.wal]
        candidates = sorted((set(self.files) | self.corrupt) & self.wal, reverse=True)
        expected = next((k for k in candidates if k in self.files), None)
        quarantined = [
            k for k in candidates if k in self.corrupt and (expected is None or k > expected)
        ]
        if expected is None:
            try:
                self.snapper.load_newest_available(wal_snaps)
            except NoSnapshotError:
                pass
            else:
                raise AssertionError("loaded a snapshot the model says does not exist")
        else:
            got = self.snapper.load_newest_available(wal_snaps)
            assert (got.metadata.term, got.metadata.index) == expected
            assert got.data == self.files[expected]
        for key in quarantined:
            assert os.path.exists(self._path(key) + ".broken")
            self.corrupt.discard(key)

    @invariant()
    def directory_matches_model(self):
        expected = sorted(f"{t:016x}-{i:016x}.snap" for t, i in set(self.files) | self.corrupt)
        assert sorted(self.snapper.snap_names()) == expected


SnapDirModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_snap_dir_model = SnapDirModel.TestCase
