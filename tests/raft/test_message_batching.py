"""Messages per round: entries per message, messages per round.

The leader builds its MsgApps when a Ready is assembled, from the progress it has by then,
so everything that happened since the previous Ready shares them:

* a burst of acknowledgements that advances the commit index several times yields at most
  one commit-only MsgApp per follower, carrying the final commit index;
* proposals made between two Readies (a driver serving many clients calls ``propose()`` many
  times per Ready) reach each follower in one MsgApp, split only by max_size_per_msg_bytes
  and stopped only by the inflight window;
* a heartbeat response from a replicating follower gets no empty MsgApp for entries sent
  after that heartbeat (they are simply in flight); one is sent only when entries sent
  before the heartbeat are still unacknowledged — a follower answers in order, so they
  were probably lost — and it recovers them.

Every test asserts a count of messages, never a timing.
"""

from raft import Message, MessageType, ProgressState
from raft.types import ENTRY_OVERHEAD_BYTES
from tests.raft.harness import Cluster, drain


def _apps_to(msgs, node_id: int) -> list[Message]:
    return [m for m in msgs if m.to == node_id and m.type == MessageType.MsgApp]


def _one_message_per_ready(c: Cluster, leader: int, n: int) -> None:
    """Propose ``n`` entries, one Ready each, so each goes out in its own MsgApp."""
    for i in range(n):
        c.propose(leader, f"v{i}".encode())
        c.process_ready(leader)


def test_burst_of_acks_yields_one_commit_message_per_follower_per_ready():
    c = Cluster([1, 2, 3])
    c.elect(1)
    n = 5
    _one_message_per_ready(c, 1, n)
    # Each follower receives its n MsgApps and acknowledges each of them in one Ready.
    c.deliver(lambda m: m.to in (2, 3))
    for f in (2, 3):
        c.process_ready(f)
    acks = [m for m in c.queue if m.to == 1 and m.type == MessageType.MsgAppResp]
    assert len(acks) == 2 * n
    # The leader steps the whole burst before its next Ready: node 2's acks alone advance
    # the commit index n times.
    c.deliver(lambda m: m.to == 1)
    last = c.raft(1).log.last_index()
    assert c.raft(1).log.committed == last
    rd = c.process_ready(1)
    for f in (2, 3):
        apps = _apps_to(rd.messages, f)
        assert len(apps) == 1, [str(m) for m in apps]
        assert apps[0].commit == last and not apps[0].entries
    c.stabilize()
    assert c.applied_data(2) == c.applied_data(3) == c.applied_data(1)


def test_follower_caught_up_by_one_message_gets_no_extra_commit_message():
    """A lagging follower is sent the missing entries together with a commit index covering
    all of them; its acknowledgement needs no commit-only MsgApp after it (the leader
    remembers the highest commit index it sent, as etcd's Progress.sentCommit)."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.isolate(3)
    for i in range(3):
        c.propose(1, f"x{i}".encode())
        c.stabilize()
    c.heal()
    c.node(1).report_unreachable(3)  # StateProbe: the next MsgApp starts from match + 1
    c.delivered.clear()
    c.tick(1)
    c.stabilize()
    apps = _apps_to(c.delivered, 3)
    last = c.raft(1).log.last_index()
    assert len(apps) == 1, [str(m) for m in apps]  # was two: entries, then Commit again
    assert apps[0].entries[-1].index == last and apps[0].commit == last
    assert c.applied_data(3) == c.applied_data(1)


def test_proposals_between_readies_share_one_message_per_follower():
    """64 proposals (a driver serving 64 clients) between two Readies: one MsgApp per
    follower carries all of them."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    n = 64
    for i in range(n):
        c.propose(1, f"client-{i}".encode())
    rd = c.process_ready(1)
    assert len(rd.entries) == n
    for f in (2, 3):
        apps = _apps_to(rd.messages, f)
        assert len(apps) == 1
        assert [e.data for e in apps[0].entries] == [f"client-{i}".encode() for i in range(n)]
    c.stabilize()
    assert c.applied_data(2) == c.applied_data(1)


def test_proposals_between_readies_respect_the_message_size_cap():
    # 100-byte entries (payload plus framing), at most 1000 bytes per message: ten entries
    # per MsgApp.
    c = Cluster([1, 2, 3], max_size_per_msg_bytes=1000)
    c.elect(1)
    for i in range(64):
        c.propose(1, bytes([i]) * (100 - ENTRY_OVERHEAD_BYTES))
    rd = c.process_ready(1)
    apps = _apps_to(rd.messages, 2)
    assert [len(m.entries) for m in apps] == [10] * 6 + [4]
    c.stabilize()
    assert c.applied_data(2) == c.applied_data(1)


def test_proposals_between_readies_respect_the_inflight_window():
    c = Cluster([1, 2, 3], max_size_per_msg_bytes=1000, max_inflight_msgs=3)
    c.elect(1)
    for i in range(64):
        c.propose(1, bytes([i]) * (100 - ENTRY_OVERHEAD_BYTES))
    rd = c.process_ready(1)
    apps = _apps_to(rd.messages, 2)
    assert [len(m.entries) for m in apps] == [10, 10, 10]  # the window is full
    assert c.raft(1).tracker.progress[2].is_paused()
    c.stabilize()
    assert c.applied_data(2) == c.applied_data(1)


def test_heartbeat_response_sends_no_empty_message_for_entries_sent_after_the_heartbeat():
    c = Cluster([1, 2, 3])
    c.elect(1)
    c.propose(1, b"x")
    c.tick(1)  # the heartbeat follows x's MsgApps
    c.process_ready(1)
    c.propose(1, b"y")  # and y's MsgApps follow the heartbeat
    c.process_ready(1)
    # The followers answer what arrived before y: x's MsgApp and the heartbeat.
    c.deliver(
        lambda m: (
            m.type == MessageType.MsgHeartbeat or (m.type == MessageType.MsgApp and m.index == 1)
        )
    )
    for f in (2, 3):
        c.process_ready(f)
    c.deliver(lambda m: m.to == 1)
    assert c.raft(1).tracker.progress[2].match == 2  # x; y is still in flight
    out = drain(c, 1)
    # Only the commit index of x (one message per follower); no empty MsgApp because y
    # is unacknowledged (which there used to be: one per heartbeat response).
    for f in (2, 3):
        apps = _apps_to(out, f)
        assert [(m.commit, m.entries) for m in apps] == [(2, ())]


def test_lost_message_is_recovered_by_the_next_heartbeat_round():
    """MsgApps to node 2 are lost (its window is not full; no report from the transport).
    At the next heartbeat response it is still unacknowledged although the heartbeat went
    out after it: the leader probes with an empty MsgApp, node 2 rejects it (it lacks the
    entry) and the leader resends from match."""
    c = Cluster([1, 2, 3])
    c.elect(1)
    # The transport loses every MsgApp to node 2 for a while (also the commit-only one
    # that would otherwise have served as a probe).
    c.msg_filter = lambda m: m.to == 2 and m.type == MessageType.MsgApp
    c.propose(1, b"lost")
    c.stabilize()
    c.heal()
    assert c.applied_data(1) == [b"lost"] and c.applied_data(2) == []
    c.tick(1)
    c.stabilize()
    assert c.applied_data(2) == [b"lost"]
    assert c.raft(1).tracker.progress[2].state == ProgressState.REPLICATE
