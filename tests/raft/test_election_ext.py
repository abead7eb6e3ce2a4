"""Election extensions from Ongaro's thesis: PreVote (§9.6), CheckQuorum (§6.2) and leader
stickiness (§4.2.3), with etcd's handling of higher/lower-term messages."""

from raft import HardState, Message, MessageType, StateType
from tests.raft.harness import Cluster, drain, of_type


def test_9_6_prevote_keeps_a_partitioned_node_from_inflating_its_term():
    """thesis §9.6: a node that cannot win a pre-election does not increment its term, so
    rejoining after a partition does not disrupt the leader."""
    c = Cluster([1, 2, 3], pre_vote=True)
    c.elect(1)
    term = c.raft(1).term
    c.isolate(3)
    for _ in range(100):
        c.tick(3)
        c.stabilize()
    assert c.raft(3).term == term  # campaigned (pre-vote) many times, term unchanged
    assert c.raft(3).state == StateType.PRE_CANDIDATE
    c.heal()
    c.tick_all(3)
    assert c.leaders() == [1]
    assert all(c.raft(i).term == term for i in (1, 2, 3))
    assert c.raft(3).lead == 1


def test_9_6_without_prevote_a_rejoining_node_disrupts_the_leader():
    """The contrast to the PreVote test: without it the partitioned node's inflated term
    forces the leader to step down when it rejoins (the problem PreVote solves)."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    term = c.raft(1).term
    c.isolate(3)
    for _ in range(60):
        c.tick(3)
        c.stabilize()
    assert c.raft(3).term > term + 1
    c.heal()
    c.tick_all(1)
    c.node(3).campaign()
    c.stabilize()
    assert c.raft(1).term > term  # the old leader had to give up its term


def test_9_6_prevote_win_is_followed_by_a_real_election_at_term_plus_one():
    """thesis §9.6: a pre-candidate that would win (pre-votes from a majority, sent for
    term+1 without changing anyone's term) then runs the real election."""
    c = Cluster([1, 2, 3], pre_vote=True)
    c.node(1).campaign()
    msgs = drain(c, 1)
    assert c.raft(1).state == StateType.PRE_CANDIDATE and c.raft(1).term == 0
    assert {(m.type, m.term) for m in msgs} == {(MessageType.MsgPreVote, 1)}
    c.queue.extend(msgs)
    c.deliver()
    # Voters answered with the pre-vote term but kept their own term and vote.
    assert all((c.raft(i).term, c.raft(i).vote) == (0, 0) for i in (2, 3))
    c.stabilize()
    assert c.raft(1).state == StateType.LEADER and c.raft(1).term == 1


def test_9_6_prevote_is_refused_to_a_candidate_with_a_stale_log():
    """thesis §9.6: pre-votes use the same up-to-date check as votes (§5.4.1)."""
    c = Cluster([1, 2, 3], pre_vote=True)
    c.elect(1)
    c.propose(1, b"x")
    c.stabilize()
    c.node(3).step(Message(MessageType.MsgPreVote, to=3, frm=2, term=5, index=1, log_term=1))
    (resp,) = drain(c, 3)
    assert (resp.type, resp.reject) == (MessageType.MsgPreVoteResp, True)
    assert c.raft(3).term == 1  # a pre-vote never changes the term


def test_9_6_prevote_rejection_with_a_higher_term_ends_the_pre_campaign():
    """etcd: a rejected MsgPreVoteResp carries the voter's (higher) term; the pre-candidate
    becomes a follower at that term."""
    c = Cluster([1, 2, 3], pre_vote=True)
    c.node(1).campaign()
    drain(c, 1)
    c.node(1).step(Message(MessageType.MsgPreVoteResp, to=1, frm=2, term=7, reject=True))
    assert (c.raft(1).state, c.raft(1).term) == (StateType.FOLLOWER, 7)


def test_9_6_lower_term_prevote_is_answered_with_our_term():
    """etcd: a pre-vote request for a term below ours is rejected with our term so the
    pre-candidate catches up instead of retrying forever."""
    c = Cluster([1, 2, 3], pre_vote=True, hard_states={1: HardState(term=5)})
    c.node(1).step(Message(MessageType.MsgPreVote, to=1, frm=2, term=3))
    (resp,) = drain(c, 1)
    assert (resp.type, resp.term, resp.reject) == (MessageType.MsgPreVoteResp, 5, True)


def test_6_2_check_quorum_leader_steps_down_without_an_active_quorum():
    """thesis §6.2: "a leader steps down if an election timeout elapses without a successful
    round of heartbeats to a majority of its cluster"."""
    c = Cluster([1, 2, 3], check_quorum=True)
    c.elect(1)
    et = c.raft(1).election_timeout
    c.tick_all(et)
    assert c.raft(1).state == StateType.LEADER  # heard from everyone
    c.isolate(1)
    c.tick(1, et)
    c.stabilize()
    assert c.raft(1).state == StateType.LEADER  # the first check still sees old activity
    c.tick(1, et)
    c.stabilize()
    assert (c.raft(1).state, c.raft(1).lead) == (StateType.FOLLOWER, 0)


def test_6_2_check_quorum_leader_with_one_live_follower_stays():
    """thesis §6.2: a majority (leader + one of two followers) keeps the leader in office."""
    c = Cluster([1, 2, 3], check_quorum=True)
    c.elect(1)
    c.isolate(3)
    c.tick_all(5 * c.raft(1).election_timeout)
    assert c.leaders() == [1]


def test_4_2_3_leader_stickiness_ignores_votes_while_a_leader_is_live():
    """thesis §4.2.3: with check_quorum a server that heard from a leader within the minimum
    election timeout ignores RequestVote — it neither updates its term nor grants the vote."""
    c = Cluster([1, 2, 3], check_quorum=True)
    c.elect(1)
    term = c.raft(2).term
    c.node(2).step(
        Message(MessageType.MsgVote, to=2, frm=3, term=term + 1, index=100, log_term=100)
    )
    assert drain(c, 2) == []
    assert (c.raft(2).term, c.raft(2).lead) == (term, 1)
    # After an election timeout of silence the lease is over and the vote is considered.
    c.tick(2, c.raft(2).election_timeout)
    c.node(2).step(
        Message(MessageType.MsgVote, to=2, frm=3, term=term + 1, index=100, log_term=100)
    )
    (resp,) = of_type(drain(c, 2), MessageType.MsgVoteResp)
    assert not resp.reject and c.raft(2).term == term + 1


def test_6_2_stuck_candidate_is_freed_by_answering_the_leader_with_its_higher_term():
    """etcd (TestFreeStuckCandidateWithCheckQuorum): a node that campaigned alone in a
    partition has a higher term that live followers ignore (stickiness). When it hears the
    stale leader's heartbeat it answers with its term; the leader steps down and a new
    election (at a higher term) brings the node back."""
    c = Cluster([1, 2, 3], check_quorum=True)
    c.elect(1)
    c.isolate(3)
    c.node(3).campaign()
    c.stabilize()
    c.node(3).campaign()
    c.stabilize()
    assert c.raft(3).state == StateType.CANDIDATE
    stuck_term = c.raft(3).term
    assert stuck_term > c.raft(1).term
    c.heal()
    c.tick(1, c.raft(1).heartbeat_timeout)
    c.stabilize()
    assert c.raft(1).state == StateType.FOLLOWER and c.raft(1).term == stuck_term
    c.tick_all(3 * c.raft(1).election_timeout)
    assert len(c.leaders()) == 1
    assert all(c.raft(i).term > stuck_term - 1 for i in (1, 2, 3))


def test_5_2_candidate_rejects_other_candidates_in_the_same_term():
    """§5.2: a candidate has voted for itself, so it denies other candidates of its term."""
    c = Cluster([1, 2, 3])
    c.node(1).campaign()
    drain(c, 1)
    c.node(1).step(Message(MessageType.MsgVote, to=1, frm=2, term=1))
    (resp,) = drain(c, 1)
    assert (resp.type, resp.reject) == (MessageType.MsgVoteResp, True)


def test_5_2_follower_that_knows_a_leader_does_not_vote_for_another_candidate_in_that_term():
    """etcd: a follower that has a leader in this term (but no recorded vote, e.g. it learnt
    the leader via AppendEntries) refuses votes in that term."""
    c = Cluster([1, 2, 3])
    c.node(2).step(Message(MessageType.MsgApp, to=2, frm=1, term=2))
    drain(c, 2)
    c.node(2).step(Message(MessageType.MsgVote, to=2, frm=3, term=2))
    (resp,) = drain(c, 2)
    assert (resp.type, resp.reject) == (MessageType.MsgVoteResp, True)


def test_5_2_a_learner_or_removed_node_never_campaigns():
    """thesis §4.2.1: learners are not promotable; neither is a node outside the config."""
    c = Cluster([1, 2], learners=[3])
    c.tick(3, 100)
    c.node(3).campaign()
    assert c.raft(3).state == StateType.FOLLOWER and c.raft(3).term == 0
