"""RawNode: the Ready contract (persist -> send -> apply -> advance), bootstrap, restart,
typed errors and status()."""

import pytest

from raft import (
    Config,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    ProgressState,
    RaftInvariantError,
    RawNode,
    SoftState,
    StateType,
    StepLocalMsgError,
    StepPeerNotFoundError,
)
from raft.errors import ConfigError
from tests.raft.harness import Cluster


def test_bootstrap_emits_committed_conf_changes_and_a_hard_state():
    s = MemoryStorage()
    n = RawNode(Config(id=1, storage=s))
    n.bootstrap([1, 2, 3])
    rd = n.ready()
    assert rd.hard_state == HardState(term=1, vote=0, commit=3)
    assert [(e.term, e.index, e.type) for e in rd.entries] == [
        (1, i, EntryType.CONF_CHANGE) for i in (1, 2, 3)
    ]
    assert rd.committed_entries == rd.entries
    assert rd.must_sync
    assert n.raft.tracker.conf_state() == ConfState(voters=(1, 2, 3))
    s.append(rd.entries)
    s.set_hard_state(rd.hard_state)
    n.advance(rd)
    assert not n.has_ready()
    with pytest.raises(ConfigError):
        RawNode(Config(id=1, storage=s)).bootstrap([1])
    with pytest.raises(ConfigError):
        RawNode(Config(id=1, storage=MemoryStorage())).bootstrap([])


def test_bootstrapped_three_node_cluster_elects_and_replicates():
    c = Cluster([])
    for i in (1, 2, 3):
        p = c.add_peer(i)
        p.node.bootstrap([1, 2, 3])
    c.stabilize()
    c.elect(2)
    c.propose(2, b"v")
    c.stabilize()
    assert all(c.applied_data(i) == [b"v"] for i in (1, 2, 3))
    assert all(c.peers[i].conf_state == ConfState(voters=(1, 2, 3)) for i in (1, 2, 3))


def test_ready_and_advance_must_alternate():
    c = Cluster([1, 2, 3])
    n = c.node(1)
    n.campaign()
    assert n.has_ready()
    rd = n.ready()
    assert not n.has_ready()  # nothing new while a Ready is outstanding
    with pytest.raises(RaftInvariantError):
        n.ready()
    n.step(Message(MessageType.MsgVoteResp, to=1, frm=2, term=1))  # input is fine meanwhile
    n.advance(rd)
    with pytest.raises(RaftInvariantError):
        n.advance()
    assert n.has_ready()
    rd2 = n.ready()
    with pytest.raises(RaftInvariantError):
        n.advance(rd)  # not the outstanding one
    n.advance(rd2)


def test_must_sync_for_entries_and_term_or_vote_changes_only():
    """Ready contract: fsync when entries (or a snapshot) are present or term/vote changed;
    a commit-only HardState change needs no sync."""
    c = Cluster([1, 2, 3])
    c.node(2).step(Message(MessageType.MsgVote, to=2, frm=1, term=1))
    rd = c.process_ready(2)
    assert rd.hard_state == HardState(1, 1, 0) and not rd.entries and rd.must_sync
    c.queue.clear()
    c.node(2).step(Message(MessageType.MsgApp, to=2, frm=1, term=1))
    c.node(2).step(Message(MessageType.MsgHeartbeat, to=2, frm=1, term=1, commit=0))
    rd = c.process_ready(2)
    assert rd.hard_state is None  # unchanged
    assert rd.soft_state == SoftState(lead=1, raft_state=StateType.FOLLOWER)
    c.elect(1)
    c.propose(1, b"x")
    c.process_ready(1)
    c.deliver()
    rd = c.process_ready(2)  # follower appends: must sync before acknowledging
    assert rd.entries and rd.must_sync
    assert [m.type for m in rd.messages] == [MessageType.MsgAppResp]
    c.deliver()
    c.process_all_ready()
    c.deliver()
    rd = c.process_ready(2)  # only the commit index moved
    assert rd.hard_state is not None and not rd.entries and not rd.must_sync
    assert rd.committed_entries


def test_a_vote_alone_at_an_unchanged_term_still_requires_a_sync():
    """§5.2 / Figure 2: votedFor is persistent state. Here the term is already known (from a
    rejected vote request) and only the vote changes: the Ready must still demand an fsync,
    or a crash could let the node vote twice in the term."""
    c = Cluster([1, 2, 3], logs={1: [Entry(1, 1)]})
    c.node(1).step(Message(MessageType.MsgVote, to=1, frm=2, term=5))  # 2's log is stale: rejected
    rd = c.process_ready(1)
    assert rd.hard_state == HardState(term=5, vote=0, commit=0) and rd.must_sync
    c.node(1).step(Message(MessageType.MsgVote, to=1, frm=3, term=5, index=1, log_term=1))
    rd = c.process_ready(1)
    assert rd.hard_state == HardState(term=5, vote=3, commit=0)
    assert not rd.entries and rd.must_sync
    assert [(m.type, m.reject) for m in rd.messages] == [(MessageType.MsgVoteResp, False)]


def test_leader_counts_itself_towards_commit_only_after_its_write_is_reported():
    """Ready contract / thesis §10.2.1: the leader's own entry counts for the quorum once
    advance() reports it persisted — even in a one-node cluster."""
    c = Cluster([1])
    c.elect(1)
    li = c.raft(1).log.last_index()
    c.propose(1, b"solo")
    rd = c.node(1).ready()
    assert rd.entries and not rd.committed_entries
    assert c.raft(1).log.committed == li
    c.peers[1].storage.append(rd.entries)
    c.node(1).advance(rd)
    assert c.raft(1).log.committed == li + 1
    rd = c.node(1).ready()
    assert [e.data for e in rd.committed_entries] == [b"solo"]
    c.node(1).advance(rd)


def test_step_rejects_local_messages_and_responses_from_strangers():
    c = Cluster([1, 2, 3])
    for t in (
        MessageType.MsgHup,
        MessageType.MsgBeat,
        MessageType.MsgUnreachable,
        MessageType.MsgSnapStatus,
        MessageType.MsgCheckQuorum,
    ):
        with pytest.raises(StepLocalMsgError):
            c.node(1).step(Message(t, to=1, frm=1))
    with pytest.raises(StepPeerNotFoundError):
        c.node(1).step(Message(MessageType.MsgAppResp, to=1, frm=9, term=1))
    c.node(1).step(Message(MessageType.MsgHeartbeat, to=1, frm=9, term=1))  # not a response: fine


def test_restart_recovers_term_vote_commit_and_log():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.propose(1, b"a")
    c.stabilize()
    hs = c.raft(2).hard_state()
    last = c.raft(2).log.last_index()
    n = c.restart(2)
    assert n.raft.hard_state() == hs
    assert n.raft.log.last_index() == last
    assert n.raft.log.applied == c.peers[2].applied[-1].index
    assert n.raft.state == StateType.FOLLOWER and n.raft.lead == 0
    assert not n.has_ready()  # nothing to re-apply: Config.applied was given
    c.tick_all(1)
    assert c.raft(2).lead == 1


def test_restart_without_applied_replays_committed_entries():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.propose(1, b"a")
    c.stabilize()
    p = c.peers[2]
    n = RawNode(Config(id=2, storage=p.storage))
    rd = n.ready()
    assert b"a" in [e.data for e in rd.committed_entries]


def test_status_reports_progress_on_the_leader_only():
    c = Cluster([1, 2, 3], learners=[4])
    c.elect(1)
    st = c.node(1).status()
    assert st.soft_state == SoftState(1, StateType.LEADER)
    assert st.conf_state == ConfState(voters=(1, 2, 3), learners=(4,))
    assert set(st.progress) == {1, 2, 3, 4}
    assert st.progress[4].is_learner
    assert st.progress[2].state == ProgressState.REPLICATE
    assert st.progress[2].match == c.raft(1).log.last_index()
    assert st.applied == c.raft(1).log.applied
    assert "StateReplicate match=" in str(st)
    assert c.node(2).status().progress == {}


def test_unknown_entry_types_do_not_break_the_str_of_a_ready():
    c = Cluster([1])
    c.elect(1)
    c.propose(1, "ünïcode".encode())
    assert "ünïcode" in str(c.node(1).ready())


def test_restart_with_applied_beyond_the_unsynced_commit_index():
    """A commit-only HardState is written without fsync, so after a crash the stored commit
    index can lag what the state machine applied; Config.applied pulls it forward."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.propose(1, b"a")
    c.stabilize()
    p = c.peers[2]
    applied = p.applied[-1].index
    p.storage.set_hard_state(HardState(term=1, vote=1, commit=applied - 1))  # lost update
    n = c.restart(2)
    assert (n.raft.log.committed, n.raft.log.applied) == (applied, applied)
    with pytest.raises(RaftInvariantError):
        RawNode(Config(id=2, storage=p.storage, applied=p.storage.last_index() + 1))
