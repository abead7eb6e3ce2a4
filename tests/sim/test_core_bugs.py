"""Minimal reproductions of raft-core bugs the simulator found, kept as regression tests.

Each test drives a few ``RawNode``s by hand, with a network that is a plain list, so the
failure is readable without the simulator. A bug that is still open is marked
``xfail(strict=True, reason=...)`` with its replay command; once the core is fixed the strict
xfail fails and the marker comes off.
"""

from raft import (
    Config,
    ConfState,
    MemoryStorage,
    MessageType,
    RawNode,
    Snapshot,
    SnapshotMetadata,
    StateType,
)


def _cluster(ids=(1, 2, 3), **kw):
    nodes = {}
    for i in ids:
        s = MemoryStorage()
        s.apply_snapshot(
            Snapshot(metadata=SnapshotMetadata(conf_state=ConfState(voters=ids), index=1, term=1))
        )
        nodes[i] = (RawNode(Config(id=i, storage=s, election_tick=10, heartbeat_tick=1, **kw)), s)
    return nodes


def _drain(nodes, drop=lambda m: False):
    """Run every node's Ready loop (persist, send, advance) until quiet; return nothing."""
    inbox = []
    while True:
        for i in sorted(nodes):
            raw, storage = nodes[i]
            while raw.has_ready():
                rd = raw.ready()
                if rd.snapshot is not None and not rd.snapshot.is_empty():
                    storage.apply_snapshot(rd.snapshot)
                storage.append(rd.entries)
                if rd.hard_state is not None:
                    storage.set_hard_state(rd.hard_state)
                inbox.extend(m for m in rd.messages if not drop(m))
                raw.advance(rd)
        if not inbox:
            return
        batch, inbox[:] = list(inbox), []
        for m in batch:
            nodes[m.to][0].step(m)


# Found by the simulator (seed 62, 3 nodes, core 07fbed4); fixed in 8435ae6. Before the fix
# a follower in StateReplicate whose inflight window was full never recovered from a lost
# MsgApp: heartbeat responses did not free a slot as etcd's handleHeartbeatResponse does.
def test_lost_msgapp_with_full_inflight_window_is_resent():
    nodes = _cluster(max_inflight_msgs=1)
    nodes[1][0].campaign()
    _drain(nodes)
    leader = nodes[1][0]
    assert leader.status().soft_state.raft_state == StateType.LEADER
    leader.propose(b"x")
    # the one MsgApp carrying "x" to node 3 is lost (no unreachable report: a silent loss)
    _drain(nodes, drop=lambda m: m.type == MessageType.MsgApp and m.to == 3)
    for _ in range(30):  # three election timeouts of heartbeats on a healthy network
        leader.tick()
        _drain(nodes)
    want = nodes[1][1].last_index()
    assert nodes[3][1].last_index() == want, leader.status()
