"""Membership: learners (thesis §4.2.1) and single-server changes (thesis §4.1), with the
one-pending-change rule. Joint consensus (§4.3) is not implemented."""

import pytest

from raft import (
    ConfChange,
    ConfChangeType,
    ConfState,
    EntryType,
    Message,
    MessageType,
    ProposalDroppedError,
    StateType,
)
from tests.raft.harness import Cluster, drain

ADD = ConfChangeType.ADD_NODE
ADD_LEARNER = ConfChangeType.ADD_LEARNER_NODE
REMOVE = ConfChangeType.REMOVE_NODE


def conf_change(c: Cluster, leader: int, t: ConfChangeType, node_id: int) -> None:
    c.node(leader).propose_conf_change(ConfChange(t, node_id))
    c.stabilize()


# --- learners ---


def test_4_2_1_learners_receive_the_log_but_do_not_count_towards_commit():
    """thesis §4.2.1: non-voting members replicate the log; the leader's commit decision
    and elections consider voters only."""
    c = Cluster([1, 2, 3], learners=[4])
    c.elect(1)
    c.cut(1, 2)
    c.cut(1, 3)
    c.propose(1, b"x")
    c.stabilize()
    li = c.raft(1).log.last_index()
    assert c.raft(4).log.last_index() == li  # the learner has it...
    assert c.raft(1).log.committed < li  # ...but only voters count
    c.heal()
    c.tick_all(1)
    assert c.applied_data(4) == [b"x"]


def test_4_2_1_learner_votes_are_not_counted_and_it_never_campaigns():
    c = Cluster([1, 2], learners=[3])
    c.node(1).campaign()
    drain(c, 1)
    c.node(1).step(Message(MessageType.MsgVoteResp, to=1, frm=3, term=1))
    assert c.raft(1).state == StateType.CANDIDATE
    c.tick(3, 100)
    assert c.raft(3).state == StateType.FOLLOWER
    c.node(3).step(Message(MessageType.MsgTimeoutNow, to=3, frm=1, term=1))
    assert c.raft(3).state == StateType.FOLLOWER


def test_4_2_1_learner_is_promoted_by_add_node_and_then_counts():
    c = Cluster([1, 2], learners=[3])
    c.elect(1)
    conf_change(c, 1, ADD, 3)
    assert c.peers[3].conf_state == ConfState(voters=(1, 2, 3))
    assert c.peers[1].conf_state == ConfState(voters=(1, 2, 3))
    assert not c.raft(3).is_learner
    c.cut(1, 2)  # now 1 + 3 form a quorum
    c.propose(1, b"y")
    c.stabilize()
    assert c.applied_data(1) == [b"y"]
    c.isolate(1)
    c.heal()
    c.node(3).campaign()
    c.stabilize()
    assert c.raft(3).state == StateType.LEADER  # a promoted learner may lead


def test_4_2_1_a_new_node_added_as_learner_catches_up_through_a_snapshot():
    c = Cluster([1, 2, 3])
    c.elect(1)
    for i in range(5):
        c.propose(1, f"x{i}".encode())
    c.stabilize()
    c.add_peer(4)
    c.isolate(4)
    conf_change(c, 1, ADD_LEARNER, 4)
    # The leader's log no longer reaches back to where node 4 starts.
    c.compact(1)
    c.heal()
    c.tick_all(2)
    assert c.peers[4].snapshots_applied == 1
    assert c.raft(4).log.last_index() == c.raft(1).log.last_index()
    assert c.peers[4].conf_state == ConfState(voters=(1, 2, 3), learners=(4,))


# --- single-server changes ---


def test_4_1_add_voter_grows_the_quorum():
    """thesis §4.1: adding one server at a time; the new configuration takes effect when
    applied, and the quorum grows with it."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.add_peer(4)
    c.isolate(4)
    conf_change(c, 1, ADD, 4)
    c.compact(1)
    c.heal()
    c.tick_all(2)
    assert c.peers[4].conf_state == ConfState(voters=(1, 2, 3, 4))
    c.cut(1, 3)
    c.cut(1, 4)  # 1 + 2 is not a majority of 4
    c.propose(1, b"z")
    c.stabilize()
    assert c.applied_data(1) == []
    c.heal()
    c.tick_all(1)
    assert c.applied_data(4) == [b"z"]


def test_4_1_remove_voter_shrinks_the_quorum():
    c = Cluster([1, 2, 3])
    c.elect(1)
    conf_change(c, 1, REMOVE, 3)
    assert c.peers[1].conf_state == ConfState(voters=(1, 2))
    assert 3 not in c.raft(1).tracker.progress
    c.isolate(3)
    c.propose(1, b"w")
    c.stabilize()
    assert c.applied_data(2) == [b"w"]


def test_4_1_only_one_conf_change_may_be_pending():
    """thesis §4.1: "a leader must not begin a new configuration change until the previous
    one is applied" — etcd turns the second proposal into an empty entry."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(1)  # nothing commits, so the first change stays pending
    c.node(1).propose_conf_change(ConfChange(ADD_LEARNER, 4))
    c.node(1).propose_conf_change(ConfChange(ADD_LEARNER, 5))
    entries = c.raft(1).log.all_entries()[-2:]
    assert entries[0].type == EntryType.CONF_CHANGE
    assert (entries[1].type, entries[1].data) == (EntryType.NORMAL, b"")
    c.heal()
    c.tick_all(2)
    assert c.peers[1].conf_state == ConfState(voters=(1, 2, 3), learners=(4,))
    conf_change(c, 1, ADD_LEARNER, 5)  # accepted once the first is applied
    assert c.peers[1].conf_state == ConfState(voters=(1, 2, 3), learners=(4, 5))


def test_4_1_new_leader_blocks_conf_changes_until_its_log_is_applied():
    """etcd: a new leader cannot know whether an uncommitted conf change is in its log, so
    it refuses conf changes until everything up to its election is applied."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    r = c.raft(1)
    assert r.pending_conf_index == r.log.last_index() - 1  # the index before its empty entry
    c.isolate(1)
    c.elect(2)
    c.node(2).propose_conf_change(ConfChange(ADD_LEARNER, 4))
    c.stabilize()
    assert c.peers[2].conf_state == ConfState(voters=(1, 2, 3), learners=(4,))


def test_4_1_node_with_unapplied_committed_conf_change_does_not_campaign():
    """etcd: until it applied committed conf changes a node's configuration may be stale,
    so it must not start an election."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.node(1).propose_conf_change(ConfChange(ADD_LEARNER, 4))
    # Deliver everything, but let node 2 only learn the commit, not apply it: step the
    # messages, never handle its Ready.
    for _ in range(6):
        c.process_ready(1) if c.node(1).has_ready() else None
        c.process_ready(3) if c.node(3).has_ready() else None
        c.deliver()
    r2 = c.raft(2)
    assert r2.log.committed > r2.log.applied
    r2.step(Message(MessageType.MsgHup, to=2, frm=2))
    assert r2.state == StateType.FOLLOWER


def test_4_1_removed_leader_steps_down_and_the_rest_elect_a_new_one():
    """thesis §4.2.2: a leader removed from the configuration steps down once the removal
    is committed (here: once the remaining voters know it is); they elect a leader among
    themselves and the removed server never campaigns."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    conf_change(c, 1, REMOVE, 1)
    assert c.raft(1).state == StateType.FOLLOWER
    assert c.peers[2].conf_state == ConfState(voters=(2, 3))
    c.tick_all(3 * c.raft(2).election_timeout)
    leaders = c.leaders()
    assert len(leaders) == 1 and leaders[0] in (2, 3)
    assert c.raft(1).state == StateType.FOLLOWER  # never campaigned
    c.propose(leaders[0], b"after")
    c.stabilize()
    assert c.applied_data(2) == [b"after"] and c.applied_data(3) == [b"after"]


def test_4_1_removed_leader_hands_over_without_an_election_timeout():
    """On stepping down, the removed leader sends MsgTimeoutNow to a voter of the new
    configuration that has its whole log: a new leader is elected with no tick at all, in
    one election (term + 1). If that message is lost, the others time out as usual."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    term = c.raft(1).term
    conf_change(c, 1, REMOVE, 1)  # delivers everything; no tick
    assert c.leaders() == [2]
    assert c.raft(2).term == c.raft(3).term == term + 1
    timeout_now = [m for m in c.delivered if m.type == MessageType.MsgTimeoutNow]
    assert [(m.frm, m.to) for m in timeout_now] == [(1, 2)]

    c2 = Cluster([1, 2, 3])
    c2.elect(1)
    c2.dropped_types.add(MessageType.MsgTimeoutNow)
    conf_change(c2, 1, REMOVE, 1)
    assert c2.leaders() == []
    c2.tick_all(3 * c2.raft(2).election_timeout)
    assert len(c2.leaders()) == 1 and c2.leaders()[0] in (2, 3)


@pytest.mark.parametrize("change", [REMOVE, ADD_LEARNER])
def test_4_1_removed_leader_keeps_leading_until_the_new_configuration_knows(change):
    """A removed (or demoted) leader must not step down before the remaining voters learn
    that the change committed: they apply it only then, and until they do they still need
    the old leader's vote — which it refuses if its log is longer than theirs. Here every
    message after the leader applied its removal is lost (including an entry it appended
    after the change); the leader keeps leading, refusing proposals and reads, and leaves
    only once the new configuration has caught up."""
    c = Cluster([1, 2])
    c.elect(1)
    c.node(1).propose_conf_change(ConfChange(change, 1))
    c.propose(1, b"tail")  # appended after the change, before it applies
    c.msg_filter = lambda m: m.frm == 1 and 1 not in c.peers[1].conf_state.voters
    c.stabilize()
    assert 1 not in c.peers[1].conf_state.voters
    assert c.peers[2].conf_state == ConfState(voters=(1, 2))  # 2 does not know yet
    assert c.raft(1).state == StateType.LEADER
    with pytest.raises(ProposalDroppedError):
        c.propose(1, b"x")
    with pytest.raises(ProposalDroppedError):
        c.node(1).read_index(b"r")
    c.heal()
    c.tick_all(1)
    assert c.raft(1).state == StateType.FOLLOWER
    assert c.peers[2].conf_state.voters == (2,)
    c.tick_all(3 * c.raft(2).election_timeout)
    assert c.leaders() == [2]
    assert c.applied_data(2) == [b"tail"]


def test_4_1_removing_the_last_voter_is_ignored_everywhere():
    c = Cluster([1], learners=[2])
    c.elect(1)
    conf_change(c, 1, REMOVE, 1)
    assert c.peers[1].conf_state == ConfState(voters=(1,), learners=(2,))
    assert c.peers[2].conf_state == ConfState(voters=(1,), learners=(2,))
    assert c.raft(1).state == StateType.LEADER


def test_4_1_removed_follower_no_longer_receives_anything():
    c = Cluster([1, 2, 3])
    c.elect(1)
    conf_change(c, 1, REMOVE, 3)
    c.delivered.clear()
    c.propose(1, b"q")
    c.tick_all(3)
    assert all(m.to != 3 for m in c.delivered)
