"""read_all against an in-memory model, over random save / cut / snapshot / release / purge /
reopen sequences (hypothesis stateful testing).

The model is the log as Raft sees it: a list of entries where a save starting at index i
replaces everything from i on (figure 7), a hard state that is the last non-empty one
saved, and a snapshot floor. Segments are tiny (64-700 bytes) so that cuts happen inside
and between saves. After every reopen from the latest snapshot, read_all must return
exactly the model's entries after the floor and its hard state.
"""

import os
import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import wal
from raftpb import Entry, HardState, WalSnapshot


class WalModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        self.root = tempfile.mkdtemp(prefix="raftkv-wal-model-", dir=shm)
        self.path = os.path.join(self.root, "wal")
        self.w = None
        self.log: list[Entry] = []  # invariant: log[i].index == i + 1
        self.hs = HardState()
        self.term = 1
        self.floor = WalSnapshot()  # the latest snapshot record saved
        self.reopens = 0

    @initialize(seg_size=st.integers(64, 700))
    def create(self, seg_size):
        self.seg_size = seg_size
        self.w = wal.create(self.path, b"meta", segment_size_bytes=seg_size, prepare_ahead=False)

    @rule(data=st.data(), n=st.integers(0, 6), with_hs=st.booleans())
    def save(self, data, n, with_hs):
        # Raft never rewrites committed entries: a save starts after the commit index
        first = data.draw(st.integers(self.hs.commit + 1, len(self.log) + 1), label="first")
        new = [
            Entry(
                term=self.term,
                index=first + k,
                data=data.draw(st.none() | st.binary(min_size=1, max_size=40)),
            )
            for k in range(n)
        ]
        hs = None
        if with_hs:
            last = first + n - 1 if n else len(self.log)
            commit = data.draw(st.integers(self.hs.commit, max(self.hs.commit, last)))
            hs = HardState(term=self.term, vote=data.draw(st.integers(0, 3)), commit=commit)
        if not new and hs is None:
            return
        self.w.save(hs, new)
        if new:
            self.log[first - 1 :] = new
        if hs is not None:
            self.hs = hs

    @rule()
    def new_term(self):
        self.term += 1

    @precondition(lambda self: self.hs.commit > self.floor.index)
    @rule(data=st.data(), release=st.booleans(), keep=st.integers(1, 3))
    def snapshot(self, data, release, keep):
        index = data.draw(st.integers(self.floor.index + 1, self.hs.commit))
        snap = WalSnapshot(index=index, term=self.log[index - 1].term)
        self.w.save_snapshot(snap)
        self.floor = snap
        if release:
            self.w.release_lock_to(index)
            wal.purge(self.path, keep=keep)

    @rule()
    def reopen(self):
        self.w.close()
        self.w = wal.open(
            self.path, self.floor, segment_size_bytes=self.seg_size, prepare_ahead=False
        )
        md, hs, ents = self.w.read_all()
        assert md == b"meta"
        assert hs == self.hs
        assert ents == self.log[self.floor.index :]
        self.reopens += 1

    @invariant()
    def readers_agree(self):
        if self.w is None:
            return
        # a concurrent read-only reader sees the same thing without disturbing the writer
        assert wal.verify(self.path, self.floor, allow_torn_tail=False) == self.hs

    def teardown(self):
        try:
            if self.w is not None:
                self.reopen()
                self.w.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


WalModel.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_read_all_matches_the_model = WalModel.TestCase
