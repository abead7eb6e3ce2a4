"""Replication mechanics beyond the paper's rules, as etcd implements them: per-follower
progress (probe / replicate / snapshot), the inflight window (count and bytes), the
per-message size cap, snapshots for followers behind the compacted log (thesis §5.1),
proposal forwarding, and the uncommitted-bytes bound."""

import pytest

from raft import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Message,
    MessageType,
    ProgressState,
    ProposalDroppedError,
    Snapshot,
    SnapshotMetadata,
    StateType,
)
from tests.raft.harness import Cluster, drain


def progress(c: Cluster, leader: int, node_id: int):
    return c.raft(leader).tracker.progress[node_id]


def test_probe_state_sends_one_message_per_heartbeat_until_acknowledged():
    """etcd: while probing, the leader sends one MsgApp and waits (paused) for the answer or
    the next heartbeat response before sending another."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(2)
    progress(c, 1, 2).become_probe()
    for i in range(3):
        c.propose(1, f"p{i}".encode())
    msgs = [m for m in drain(c, 1) if m.to == 2 and m.type == MessageType.MsgApp]
    assert len(msgs) == 1  # the first proposal's probe; then paused
    assert progress(c, 1, 2).is_paused()
    c.tick(1)  # heartbeat; its response would unpause
    c.node(1).step(Message(MessageType.MsgHeartbeatResp, to=1, frm=2, term=c.raft(1).term))
    msgs = [m for m in drain(c, 1) if m.to == 2 and m.type == MessageType.MsgApp]
    assert len(msgs) == 1


def test_probe_turns_into_replicate_after_a_successful_append():
    c = Cluster([1, 2, 3])
    c.elect(1)
    assert progress(c, 1, 2).state == ProgressState.REPLICATE
    c.node(1).report_unreachable(2)
    assert progress(c, 1, 2).state == ProgressState.PROBE
    c.propose(1, b"x")
    c.stabilize()
    assert progress(c, 1, 2).state == ProgressState.REPLICATE
    assert progress(c, 1, 2).match == c.raft(1).log.last_index()


def test_replicate_state_streams_until_the_inflight_count_window_is_full():
    """etcd: in replicate state MsgApps go out optimistically, at most max_inflight_msgs
    unacknowledged per follower; an acknowledgement frees the window."""
    c = Cluster([1, 2, 3], max_inflight_msgs=2)
    c.elect(1)
    msgs = []
    for i in range(5):  # one Ready per proposal: one MsgApp each while the window allows
        c.propose(1, f"x{i}".encode())
        msgs += [m for m in drain(c, 1) if m.to == 2 and m.type == MessageType.MsgApp]
    assert [[e.data for e in m.entries] for m in msgs] == [[b"x0"], [b"x1"]]
    pr = progress(c, 1, 2)
    assert pr.is_paused() and pr.inflights.count() == 2
    c.node(1).step(
        Message(MessageType.MsgAppResp, to=1, frm=2, term=1, index=msgs[0].entries[-1].index)
    )
    more = [m for m in drain(c, 1) if m.to == 2 and m.type == MessageType.MsgApp]
    assert len(more) == 1  # one slot freed; the rest batches the remaining proposals
    assert [e.data for e in more[0].entries] == [b"x2", b"x3", b"x4"]


def test_inflight_byte_window():
    c = Cluster([1, 2, 3], max_inflight_bytes=2048, max_size_per_msg_bytes=1024)
    c.elect(1)
    for i in range(6):
        c.propose(1, bytes([i]) * 1000)
    msgs = [m for m in drain(c, 1) if m.to == 2 and m.type == MessageType.MsgApp]
    assert len(msgs) == 3  # 1000 + 1000 < 2048, the third crosses the limit and fills it
    assert progress(c, 1, 2).inflights.bytes == 3000


def test_message_size_cap_splits_entries_across_messages():
    c = Cluster([1, 2, 3], max_size_per_msg_bytes=300)
    c.elect(1)
    c.isolate(2)
    for i in range(6):
        c.propose(1, bytes([65 + i]) * 100)
    c.stabilize()
    c.heal()
    c.delivered.clear()
    c.tick_all(1)
    apps = [m for m in c.delivered if m.to == 2 and m.type == MessageType.MsgApp and m.entries]
    assert len(apps) >= 3
    assert all(len(m.entries) <= 2 for m in apps)
    assert c.applied_data(2) == c.applied_data(1)


def test_rejection_hint_skips_a_whole_conflicting_term():
    """etcd's fast backtracking: one round trip per term instead of one per entry."""
    from raft import HardState
    from tests.raft.harness import log_of_terms

    c = Cluster(
        [1, 2, 3],
        logs={1: log_of_terms([1, 1, 4, 4, 4, 4]), 2: log_of_terms([1, 1, 2, 2, 2, 2, 2, 2, 2])},
        hard_states={1: HardState(term=5), 2: HardState(term=5), 3: HardState(term=5)},
    )
    c.elect(1)
    rejects = [
        m for m in c.delivered if m.frm == 2 and m.type == MessageType.MsgAppResp and m.reject
    ]
    assert len(rejects) == 1  # entry by entry it would take four (indexes 6, 5, 4, 3)
    assert c.log_terms(2) == c.log_terms(1)


def test_5_1_follower_behind_the_compacted_log_gets_a_snapshot():
    """thesis §5.1 (log compaction): the leader sends its snapshot (InstallSnapshot) to a
    follower that needs entries it has discarded; the follower restores it and replication
    continues from there."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(3)
    for i in range(5):
        c.propose(1, f"x{i}".encode())
    c.stabilize()
    c.compact(1)
    c.heal()
    c.tick_all(1)
    assert c.peers[3].snapshots_applied == 1
    snap = c.peers[3].storage.snapshot()
    assert snap.data == b"state"
    assert snap.metadata.index == c.peers[1].storage.snapshot().metadata.index
    c.propose(1, b"after")
    c.stabilize()
    assert progress(c, 1, 3).state == ProgressState.REPLICATE
    assert c.applied_data(3) == [b"after"]  # older data came inside the snapshot
    assert c.raft(3).log.applied == c.raft(1).log.applied


def test_snapshot_state_waits_for_the_report_and_retries_after_a_failure():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(3)
    c.propose(1, b"x")
    c.stabilize()
    c.compact(1)
    c.dropped_types.add(MessageType.MsgSnap)  # the transport "loses" the snapshot
    for pair in list(c.dropped_pairs):
        if 3 in pair:
            c.dropped_pairs.discard(pair)
    c.tick_all(1)
    pr = progress(c, 1, 3)
    assert pr.state == ProgressState.SNAPSHOT and pr.is_paused()
    c.node(1).report_snapshot(3, failed=True)
    assert pr.state == ProgressState.PROBE and pr.pending_snapshot == 0 and pr.is_paused()
    c.heal()
    c.tick_all(2)
    assert c.peers[3].snapshots_applied == 1
    assert progress(c, 1, 3).state == ProgressState.REPLICATE


def test_follower_ignores_a_snapshot_that_is_not_newer_than_its_commit():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.propose(1, b"x")
    c.stabilize()
    old = Snapshot(metadata=SnapshotMetadata(ConfState(voters=(1, 2, 3)), index=1, term=1))
    c.node(2).step(Message(MessageType.MsgSnap, to=2, frm=1, term=1, snapshot=old))
    (resp,) = drain(c, 2)
    assert (resp.type, resp.index) == (MessageType.MsgAppResp, c.raft(2).log.committed)
    assert c.peers[2].snapshots_applied == 0


def test_joining_node_installs_a_snapshot_taken_before_it_was_added():
    """Deviation from etcd (which refuses such a snapshot): the leader's latest snapshot may
    predate the conf change that added the new node; the node installs it anyway and joins
    the configuration when that conf change reaches it through the log."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.propose(1, b"x")
    c.stabilize()
    c.compact(1)  # snapshot without node 4
    c.add_peer(4)
    c.node(1).propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER_NODE, 4))
    c.stabilize()
    c.tick_all(2)
    assert c.peers[4].snapshots_applied == 1
    assert c.peers[4].storage.snapshot().metadata.conf_state == ConfState(voters=(1, 2, 3))
    assert c.peers[4].conf_state == ConfState(voters=(1, 2, 3), learners=(4,))
    assert c.raft(4).log.last_index() == c.raft(1).log.last_index()


def test_node_restarts_from_a_snapshot_in_storage():
    from raft import Config, MemoryStorage, RawNode

    s = MemoryStorage()
    s.apply_snapshot(
        Snapshot(metadata=SnapshotMetadata(conf_state=ConfState(voters=(1, 2, 3)), index=7, term=2))
    )
    n = RawNode(Config(id=1, storage=s))
    r = n.raft
    assert (r.log.first_index(), r.log.last_index(), r.log.committed, r.log.applied) == (8, 7, 7, 7)
    assert r.tracker.conf_state() == ConfState(voters=(1, 2, 3))
    assert not n.has_ready()


# --- proposals ---


def test_follower_forwards_proposals_to_the_leader():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.propose(2, b"fwd")
    (m,) = drain(c, 2)
    assert (m.type, m.to, m.frm, m.term) == (MessageType.MsgProp, 1, 2, 0)
    c.queue.append(m)
    c.stabilize()
    assert c.applied_data(3) == [b"fwd"]


def test_proposal_forwarding_can_be_disabled():
    c = Cluster([1, 2, 3], disable_proposal_forwarding=True)
    c.elect(1)
    with pytest.raises(ProposalDroppedError):
        c.propose(2, b"x")


def test_proposal_without_a_leader_is_dropped():
    c = Cluster([1, 2, 3])
    with pytest.raises(ProposalDroppedError):
        c.propose(1, b"x")
    c.node(1).campaign()
    assert c.raft(1).state == StateType.CANDIDATE
    with pytest.raises(ProposalDroppedError):
        c.propose(1, b"x")


def test_forwarded_proposal_dropped_by_the_leader_does_not_raise_from_step():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(3)
    c.node(1).transfer_leader(3)
    c.node(1).step(
        Message(MessageType.MsgProp, to=1, frm=2, entries=(c.log_entries(1)[0],))
    )  # no raise


def test_uncommitted_bytes_bound_drops_proposals_until_entries_are_applied():
    """etcd's MaxUncommittedEntriesSize: the leader refuses proposals once too many payload
    bytes are appended but not applied; it always admits one when nothing is pending."""
    c = Cluster([1, 2, 3], max_uncommitted_entries_size_bytes=250)
    c.elect(1)
    c.isolate(1)  # nothing commits
    c.propose(1, b"a" * 100)
    c.propose(1, b"b" * 100)
    with pytest.raises(ProposalDroppedError):
        c.propose(1, b"c" * 100)
    c.heal()
    c.stabilize()
    c.tick_all(1)
    c.propose(1, b"c" * 100)  # accepted again after commit + apply
    c.stabilize()
    assert c.applied_data(2) == [b"a" * 100, b"b" * 100, b"c" * 100]
    # a single oversized entry is accepted when nothing is uncommitted
    c.propose(1, b"d" * 1000)


def test_removed_leader_drops_proposals():
    from raft import ConfChange, ConfChangeType

    c = Cluster([1, 2, 3])
    c.elect(1)
    c.node(1).propose_conf_change(ConfChange(ConfChangeType.REMOVE_NODE, 1))
    c.stabilize()
    with pytest.raises(ProposalDroppedError):
        c.propose(1, b"x")


def test_committed_entries_per_ready_are_bounded():
    c = Cluster([1], max_committed_size_per_ready_bytes=250)
    c.elect(1)
    for i in range(6):
        c.propose(1, bytes([i]) * 100)
    rd = c.process_ready(1)  # persist; the leader acknowledges itself on advance
    sizes = []
    while c.node(1).has_ready():
        rd = c.process_ready(1)
        if rd.committed_entries:
            sizes.append(len(rd.committed_entries))
    assert sum(sizes) == 6 and max(sizes) <= 2
