"""Leadership transfer (thesis §3.10) with MsgTimeoutNow, as etcd implements it."""

import pytest

from raft import Message, MessageType, ProposalDroppedError, StateType
from tests.raft.harness import Cluster, drain, of_type


def test_3_10_transfer_to_an_up_to_date_follower_sends_timeout_now_at_once():
    """thesis §3.10: when the target's log is current the leader tells it to time out now;
    the target wins the next term."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    term = c.raft(1).term
    c.node(1).transfer_leader(2)
    msgs = drain(c, 1)
    assert [(m.type, m.to) for m in msgs] == [(MessageType.MsgTimeoutNow, 2)]
    c.queue.extend(msgs)
    c.stabilize()
    assert c.leaders() == [2]
    assert c.raft(2).term == term + 1
    assert c.raft(1).lead == 2


def test_3_10_lagging_target_is_caught_up_first():
    """thesis §3.10 step 1: "the prior leader ... sends it the log entries it is missing"
    before MsgTimeoutNow."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(3)
    for i in range(3):
        c.propose(1, f"x{i}".encode())
    c.stabilize()
    c.heal()
    c.node(1).transfer_leader(3)
    msgs = drain(c, 1)
    assert of_type(msgs, MessageType.MsgTimeoutNow) == []
    assert [m.to for m in of_type(msgs, MessageType.MsgApp)] == [3]
    c.queue.extend(msgs)
    c.stabilize()
    assert c.leaders() == [3]
    assert c.applied_data(3)[:3] == [b"x0", b"x1", b"x2"]
    assert any(m.type == MessageType.MsgTimeoutNow and m.to == 3 for m in c.delivered)


def test_3_10_proposals_are_refused_while_transferring_and_transfer_aborts_after_timeout():
    """thesis §3.10: the leader stops accepting client requests during the transfer; if the
    transfer does not complete within an election timeout it aborts and resumes."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(3)
    c.node(1).transfer_leader(3)
    assert c.raft(1).lead_transferee == 3
    assert c.node(1).status().lead_transferee == 3
    with pytest.raises(ProposalDroppedError):
        c.propose(1, b"during")
    c.tick_all(c.raft(1).election_timeout)
    assert c.raft(1).lead_transferee == 0
    assert c.leaders() == [1]
    c.propose(1, b"after")
    c.stabilize()
    assert c.applied_data(2) == [b"after"]


@pytest.mark.parametrize("target", [1, 4, 9])
def test_3_10_transfer_to_self_a_learner_or_a_stranger_is_ignored(target):
    c = Cluster([1, 2, 3], learners=[4])
    c.elect(1)
    c.node(1).transfer_leader(target)
    assert c.raft(1).lead_transferee == 0
    assert of_type(drain(c, 1), MessageType.MsgTimeoutNow) == []
    c.propose(1, b"ok")  # not blocked


def test_3_10_a_follower_forwards_the_request_to_the_leader():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.node(2).transfer_leader(3)
    (fwd,) = drain(c, 2)
    assert (fwd.type, fwd.to, fwd.frm) == (
        MessageType.MsgTransferLeader,
        1,
        3,
    )  # frm is the transferee
    c.queue.append(fwd)
    c.stabilize()
    assert c.leaders() == [3]


def test_3_10_transfer_election_overrides_leader_stickiness():
    """etcd: the transferee's MsgVote is marked as a transfer, so followers that just heard
    from the leader (check_quorum lease) still vote."""
    c = Cluster([1, 2, 3], check_quorum=True)
    c.elect(1)
    c.node(1).transfer_leader(2)
    c.stabilize()
    assert c.leaders() == [2]


def test_3_10_timeout_now_skips_prevote():
    """etcd: a transfer campaign goes straight to a real election (no pre-vote round)."""
    c = Cluster([1, 2, 3], pre_vote=True)
    c.elect(1)
    c.node(2).step(Message(MessageType.MsgTimeoutNow, to=2, frm=1, term=c.raft(1).term))
    msgs = drain(c, 2)
    assert c.raft(2).state == StateType.CANDIDATE
    assert {m.type for m in msgs} == {MessageType.MsgVote}
    assert all(m.context == b"CampaignTransfer" for m in msgs)


def test_3_10_a_new_transfer_replaces_the_pending_one():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(3)
    c.node(1).transfer_leader(3)
    c.node(1).transfer_leader(3)  # the same again: still pending
    assert c.raft(1).lead_transferee == 3
    c.node(1).transfer_leader(2)
    assert c.raft(1).lead_transferee == 2
    c.stabilize()
    assert c.leaders() == [2]
