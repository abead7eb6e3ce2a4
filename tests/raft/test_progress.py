"""Flow control and quorum bookkeeping: Inflights, Progress, quorum, ProgressTracker,
confchange, readonly, Config validation."""

import random

import pytest

from raft import (
    ConfChange,
    ConfChangeType,
    ConfigError,
    ConfState,
    Entry,
    MemoryStorage,
    Message,
    MessageType,
    ReadOnlyOption,
)
from raft.confchange import apply_change, restore
from raft.config import NO_LIMIT, Config
from raft.errors import ConfChangeError, RaftInvariantError
from raft.inflights import Inflights
from raft.progress import Progress, ProgressState
from raft.quorum import NO_LIMIT_INDEX, VoteResult, committed_index, vote_result
from raft.readonly import ReadOnly
from raft.tracker import ProgressTracker

# --- Inflights ---


def test_inflights_count_window():
    inf = Inflights(3, NO_LIMIT)
    for i in (1, 2, 3):
        assert not inf.full()
        inf.add(i, 10)
    assert inf.full() and inf.count() == 3
    with pytest.raises(RaftInvariantError):
        inf.add(4, 10)
    inf.free_le(1)
    assert not inf.full() and inf.count() == 2 and inf.bytes == 20
    inf.free_le(0)  # nothing at or below 0
    assert inf.count() == 2
    inf.free_le(10)
    assert inf.count() == 0 and inf.bytes == 0


def test_inflights_byte_window_admits_the_message_that_crosses_it():
    inf = Inflights(100, 25)
    inf.add(1, 10)
    inf.add(2, 10)
    assert not inf.full()
    inf.add(3, 10)  # 30 >= 25: admitted, but now full
    assert inf.full()
    inf.free_le(1)
    assert not inf.full() and inf.bytes == 20


def test_inflights_indexes_must_increase():
    inf = Inflights(10, NO_LIMIT)
    inf.add(5, 1)
    with pytest.raises(RaftInvariantError):
        inf.add(5, 1)


def test_inflights_reset():
    inf = Inflights(2, NO_LIMIT)
    inf.add(1, 1)
    inf.add(2, 1)
    inf.reset()
    assert not inf.full() and inf.count() == 0 and inf.bytes == 0


# --- Progress ---


def progress(match=0, next_index=1, state=ProgressState.PROBE, size=256):
    pr = Progress(match, next_index, Inflights(size, NO_LIMIT))
    pr.state = state
    return pr


def test_progress_become_probe():
    pr = progress(1, 5, ProgressState.REPLICATE)
    pr.become_probe()
    assert (pr.state, pr.match, pr.next) == (ProgressState.PROBE, 1, 2)
    # from snapshot: resume after the snapshot even if not yet acknowledged
    pr = progress(1, 5)
    pr.become_snapshot(10)
    pr.become_probe()
    assert (pr.state, pr.next) == (ProgressState.PROBE, 11)
    pr = progress(20, 21)
    pr.become_snapshot(10)
    pr.become_probe()
    assert pr.next == 21


def test_progress_become_replicate_and_snapshot():
    pr = progress(1, 5)
    pr.become_replicate()
    assert (pr.state, pr.next) == (ProgressState.REPLICATE, 2)
    pr.become_snapshot(10)
    assert (pr.state, pr.pending_snapshot, pr.match) == (ProgressState.SNAPSHOT, 10, 1)


def test_progress_maybe_update():
    pr = progress(3, 5)
    assert not pr.maybe_update(2)  # stale ack
    assert (pr.match, pr.next) == (3, 5)
    assert not pr.maybe_update(3)
    assert pr.maybe_update(4)
    assert (pr.match, pr.next) == (4, 5)
    assert pr.maybe_update(7)
    assert (pr.match, pr.next) == (7, 8)


@pytest.mark.parametrize(
    "state, match, next_index, rejected, hint, want_ok, want_next",
    [
        # replicate: a rejection at or below match is stale
        (ProgressState.REPLICATE, 5, 10, 5, 5, False, 10),
        (ProgressState.REPLICATE, 5, 10, 4, 4, False, 10),
        # replicate: a real rejection resets next to match+1
        (ProgressState.REPLICATE, 5, 10, 9, 9, True, 6),
        # probe: only the outstanding probe (next-1) counts
        (ProgressState.PROBE, 0, 10, 5, 5, False, 10),
        (ProgressState.PROBE, 0, 10, 9, 9, True, 9),
        (ProgressState.PROBE, 0, 10, 9, 3, True, 4),  # follower hint moves further back
        (ProgressState.PROBE, 0, 2, 1, 0, True, 1),  # never below 1
        (ProgressState.PROBE, 4, 10, 9, 1, True, 5),  # never at or below match
    ],
)
def test_progress_maybe_decr_to(state, match, next_index, rejected, hint, want_ok, want_next):
    pr = progress(match, next_index, state)
    assert pr.maybe_decr_to(rejected, hint) == want_ok
    assert pr.next == want_next


def test_progress_is_paused():
    pr = progress(0, 1, ProgressState.PROBE)
    assert not pr.is_paused()
    pr.sent_entries(1, 1, 10)  # a probe was sent: wait for its answer
    assert pr.is_paused()
    pr.maybe_update(1)  # answered
    assert not pr.is_paused()
    pr = progress(0, 1, ProgressState.REPLICATE, size=2)
    pr.sent_entries(1, 1, 1)
    assert not pr.is_paused()
    pr.sent_entries(2, 1, 1)
    assert pr.is_paused()  # window full
    assert pr.next == 3
    pr = progress(0, 1, ProgressState.SNAPSHOT)
    assert pr.is_paused()


def test_progress_str():
    pr = progress(3, 4, ProgressState.REPLICATE, size=1)
    pr.sent_entries(5, 2, 10)
    assert str(pr) == "StateReplicate match=3 next=6 paused inactive inflight=1[full]"


# --- quorum ---


@pytest.mark.parametrize(
    "acks, want",
    [
        ({1: 5}, 5),
        ({1: 5, 2: 3}, 3),
        ({1: 5, 2: 3, 3: 4}, 4),
        ({1: 5, 2: 3, 3: 1}, 3),
        ({1: 9, 2: 8, 3: 7, 4: 6}, 7),  # 3 of 4 must have it
        ({1: 9, 2: 8, 3: 7, 4: 6, 5: 5}, 7),
    ],
)
def test_committed_index_is_the_majority_th_highest(acks, want):
    assert committed_index(acks.keys(), acks.__getitem__) == want


def test_committed_index_missing_acks_count_as_zero_and_empty_is_unbounded():
    assert committed_index([1, 2, 3], lambda i: {1: 5, 2: 4}.get(i, 0)) == 4
    assert committed_index([], lambda i: 0) == NO_LIMIT_INDEX


@pytest.mark.parametrize(
    "voters, votes, want",
    [
        ([1], {}, VoteResult.PENDING),
        ([1], {1: True}, VoteResult.WON),
        ([1], {1: False}, VoteResult.LOST),
        ([1, 2, 3], {1: True}, VoteResult.PENDING),
        ([1, 2, 3], {1: True, 2: True}, VoteResult.WON),
        ([1, 2, 3], {1: True, 2: False}, VoteResult.PENDING),
        ([1, 2, 3], {1: True, 2: False, 3: False}, VoteResult.LOST),
        ([1, 2, 3, 4], {1: True, 2: True}, VoteResult.PENDING),
        ([1, 2, 3, 4], {1: True, 2: True, 3: True}, VoteResult.WON),
        ([1, 2, 3, 4], {1: False, 2: False}, VoteResult.LOST),
        ([1, 2, 3], {9: True, 8: True}, VoteResult.PENDING),  # non-voters do not count
        ([], {}, VoteResult.WON),
    ],
)
def test_vote_result(voters, votes, want):
    assert vote_result(voters, votes) == want


# --- ProgressTracker and conf changes ---


def tracker_with(voters=(1, 2, 3), learners=()):
    t = ProgressTracker(256, NO_LIMIT)
    restore(t, ConfState(voters=tuple(voters), learners=tuple(learners)), 10)
    return t


def test_tracker_committed_ignores_learners():
    t = tracker_with((1, 2, 3), (4,))
    for i, m in {1: 5, 2: 1, 3: 1, 4: 9}.items():
        t.progress[i].match = m
    assert t.committed() == 1
    t.progress[2].match = 5
    assert t.committed() == 5


def test_tracker_quorum_active():
    t = tracker_with((1, 2, 3), (4,))
    for pr in t.progress.values():
        pr.recent_active = False
    t.progress[1].recent_active = True
    t.progress[4].recent_active = True  # a learner does not count
    assert not t.quorum_active()
    t.progress[3].recent_active = True
    assert t.quorum_active()


def test_tracker_votes_first_answer_counts():
    t = tracker_with((1, 2, 3))
    t.record_vote(1, True)
    t.record_vote(2, False)
    t.record_vote(2, True)  # a second answer from 2 is ignored
    assert t.tally_votes() == (1, 1, VoteResult.PENDING)
    t.record_vote(3, True)
    assert t.tally_votes() == (2, 1, VoteResult.WON)


def test_confchange_add_promote_demote_remove():
    t = tracker_with((1,))
    apply_change(t, ConfChange(ConfChangeType.ADD_LEARNER_NODE, 2), 10)
    assert t.conf_state() == ConfState(voters=(1,), learners=(2,))
    assert t.progress[2].is_learner and t.progress[2].next == 10
    t.progress[2].match = 7
    apply_change(t, ConfChange(ConfChangeType.ADD_NODE, 2), 10)  # promote keeps progress
    assert t.conf_state() == ConfState(voters=(1, 2))
    assert not t.progress[2].is_learner and t.progress[2].match == 7
    apply_change(t, ConfChange(ConfChangeType.ADD_NODE, 2), 10)  # idempotent
    apply_change(t, ConfChange(ConfChangeType.ADD_LEARNER_NODE, 2), 10)  # demote
    assert t.conf_state() == ConfState(voters=(1,), learners=(2,))
    apply_change(t, ConfChange(ConfChangeType.REMOVE_NODE, 2), 10)
    assert t.conf_state() == ConfState(voters=(1,)) and 2 not in t.progress
    apply_change(t, ConfChange(ConfChangeType.REMOVE_NODE, 9), 10)  # unknown: no-op
    apply_change(t, ConfChange(ConfChangeType.UPDATE_NODE, 1), 10)  # no-op
    assert t.conf_state() == ConfState(voters=(1,))


def test_confchange_refuses_to_remove_the_last_voter():
    t = tracker_with((1,), (2,))
    with pytest.raises(ConfChangeError):
        apply_change(t, ConfChange(ConfChangeType.REMOVE_NODE, 1), 10)
    with pytest.raises(ConfChangeError):
        apply_change(t, ConfChange(ConfChangeType.ADD_LEARNER_NODE, 1), 10)
    assert t.conf_state() == ConfState(voters=(1,), learners=(2,))


def test_confchange_restore_rejects_joint_and_overlapping_configs():
    t = ProgressTracker(256, NO_LIMIT)
    with pytest.raises(ConfChangeError):
        restore(t, ConfState(voters=(1,), voters_outgoing=(2,)), 1)
    with pytest.raises(ConfChangeError):
        restore(t, ConfState(voters=(1,), learners=(1,)), 1)


# --- ReadOnly ---


def read_req(ctx: bytes, frm: int = 1) -> Message:
    return Message(MessageType.MsgReadIndex, to=1, frm=frm, entries=(Entry(0, 0, data=ctx),))


def test_readonly_advance_releases_all_earlier_requests():
    ro = ReadOnly(ReadOnlyOption.SAFE)
    for i, ctx in enumerate((b"a", b"b", b"c")):
        ro.add_request(10 + i, read_req(ctx))
    ro.add_request(99, read_req(b"b"))  # duplicate context ignored
    assert ro.last_pending_request_ctx() == b"c"
    assert ro.recv_ack(2, b"b") == {2}
    assert ro.recv_ack(2, b"zz") is None
    done = ro.advance(b"b")
    assert [(s.req.entries[0].data, s.index) for s in done] == [(b"a", 10), (b"b", 11)]
    assert ro.queue == [b"c"] and list(ro.pending) == [b"c"]
    assert ro.advance(b"a") == []


# --- Config ---


@pytest.mark.parametrize(
    "kw",
    [
        {"id": 0},
        {"heartbeat_tick": 0},
        {"election_tick": 1, "heartbeat_tick": 1},
        {"max_inflight_msgs": 0},
        {"max_inflight_bytes": 10, "max_size_per_msg_bytes": 100},
        {"read_only_option": ReadOnlyOption.LEASE_BASED},
        {"max_uncommitted_entries_size_bytes": -1},
        {"rng": 42},
    ],
)
def test_config_validate_rejects(kw):
    args = {"id": 1, "storage": MemoryStorage(), **kw}
    with pytest.raises(ConfigError):
        Config(**args).validate()


def test_config_defaults_are_valid():
    Config(id=1, storage=MemoryStorage()).validate()
    Config(
        id=1,
        storage=MemoryStorage(),
        check_quorum=True,
        read_only_option=ReadOnlyOption.LEASE_BASED,
        rng=random.Random(3),
    ).validate()
