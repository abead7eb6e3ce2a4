"""The node driver's failure contract (kvserver.server.node), one process.

- A heartbeat whose commit index is past this follower's log means the follower lost entries
  it acknowledged: the raft loop stops with the typed ``CommitOutOfRangeError`` (etcd panics),
  ``/health`` turns false, pending proposals fail — it is never dropped at DEBUG.
- A follower is not healthy before a heartbeat of its current leader went through.
- An unexpected error on one peer message drops that message, is logged at ERROR and makes
  the node unhealthy for a while; the node keeps running.
"""

import asyncio
import logging
import re

import pytest

from kvserver.kvpb import service_errors as errors
from kvserver.server.node import Node, NodeHandlers, NodeOptions
from raft import Config, ConfState, Message, MessageType, RawNode
from raft.errors import CommitOutOfRangeError
from tests.kvserver.fakes import MemoryNodeStorage
from tests.support.wait import async_wait_for

WAIT_S = 5.0


class _SM:
    def apply(self, index, payload):
        return None

    def snapshot_chunks(self, chunk_size_bytes=0):
        return iter(())

    async def install_snapshot(self, data):
        pass


def _follower(**options) -> Node:
    storage = MemoryNodeStorage()
    raw = RawNode(Config(id=1, storage=storage.raft_storage, election_tick=1000, heartbeat_tick=1))
    raw.bootstrap([1, 2, 3])  # log: indexes 1..3, committed
    return Node(
        raw=raw,
        node_id=1,
        storage=storage,
        # the fake storage writes no files: snapshots on the loop
        options=NodeOptions(heartbeat_interval_s=10, snapshot_in_child=False, **options),
        applied=0,
        conf_state=ConfState(voters=(1, 2, 3)),
    )


def _heartbeat(commit: int) -> Message:
    return Message(type=MessageType.MsgHeartbeat, to=1, frm=2, term=1, commit=commit)


async def test_heartbeat_past_the_log_stops_the_node_with_a_typed_failure():
    node = _follower()
    node.start(NodeHandlers(state_machine=_SM(), send=lambda msgs: None))
    try:
        node.receive([_heartbeat(3)])
        await async_wait_for(lambda: node.leader == 2, WAIT_S, "the leader known")
        assert node.health_problem() == ""
        proposal = asyncio.ensure_future(node.propose(b"x", timeout_s=30))
        await asyncio.sleep(0)
        node.receive([_heartbeat(7)])  # the leader thinks we acknowledged up to 7
        await async_wait_for(node.failed.is_set, WAIT_S, "the raft loop to stop")
        assert isinstance(node.failure, CommitOutOfRangeError)
        assert (node.failure.commit, node.failure.last_index) == (7, 3)
        assert node.health_problem().startswith("RAFT LOOP FAILED: commit 7 is out of range")
        with pytest.raises(errors.ServiceError):
            await proposal  # failed at once, not after its timeout
    finally:
        await node.stop()


async def test_follower_is_unhealthy_until_its_leader_heartbeat_goes_through():
    node = _follower()
    node.start(NodeHandlers(state_machine=_SM(), send=lambda msgs: None))
    try:
        # A MsgApp makes the leader known; it does not check the commit index against what
        # we acknowledged, so it does not make the follower healthy.
        node.receive(
            [Message(type=MessageType.MsgApp, to=1, frm=2, term=1, log_term=1, index=3, commit=3)]
        )
        await async_wait_for(lambda: node.leader == 2, WAIT_S, "the leader known")
        assert node.health_problem() == "RAFT LEADER NOT CONFIRMED"
        node.receive([_heartbeat(3)])
        await async_wait_for(
            lambda: node.health_problem() == "",
            WAIT_S,
            "confirmed by a heartbeat",
        )
    finally:
        await node.stop()


async def test_unexpected_error_on_a_peer_message_is_logged_and_unhealthy_not_fatal(caplog):
    node = _follower()
    real_step = node.raw.step

    def step(m):
        if m.commit == 99:
            raise ValueError("boom")
        real_step(m)

    node.raw.step = step
    node.start(NodeHandlers(state_machine=_SM(), send=lambda msgs: None))
    try:
        with caplog.at_level(logging.ERROR, logger="kvserver.server.node"):
            node.receive([_heartbeat(99)])
            await async_wait_for(
                lambda: (
                    node.health_problem() != "RAFT LEADER NOT CONFIRMED"
                    and node.health_problem() != ""
                ),
                WAIT_S,
                "the failure recorded",
            )
        assert node.health_problem() == "RAFT LOOP FAILING: ValueError: boom"
        assert any("dropped message" in r.getMessage() for r in caplog.records)
        node.receive([_heartbeat(3)])
        await async_wait_for(lambda: node.leader == 2, WAIT_S, "the next message taken")
        assert not node.failed.is_set()
    finally:
        await node.stop()


async def test_snapshot_log_line_never_shows_a_negative_index(caplog):
    # Not "snapshot at 301 (compacted to -4699)" when there are fewer entries than the
    # catch-up window.
    node = _follower()
    node.opts.snapshot_count = 1
    node.start(NodeHandlers(state_machine=_SM(), send=lambda msgs: None))
    try:
        with caplog.at_level(logging.INFO, logger="kvserver.server.node"):
            node.receive([_heartbeat(3)])
            await async_wait_for(lambda: node.snapshot_index == 3, WAIT_S, "a snapshot at 3")
        lines = [r.getMessage() for r in caplog.records if "snapshot at" in r.getMessage()]
        assert lines and "log not compacted" in lines[0]
        assert not re.search(r"-\d", lines[0]), lines[0]
    finally:
        await node.stop()


def test_failure_message_of_a_full_disk_names_the_file_and_what_to_free():
    from kvserver.assembly.member import failure_message
    from kvserver.server.config import ServerConfig
    from wal.errors import WalFailedError

    cfg = ServerConfig(name="n1", data_dir="/data/n1")
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as exc:
            raise WalFailedError("writing /data/n1/member/wal/0.wal: No space left") from exc
    except WalFailedError as exc:
        message = failure_message(cfg, 0xAB, exc)
    assert "stopped: the disk is full: writing /data/n1/member/wal/0.wal" in message
    assert "Free space on the file system holding /data/n1" in message
    assert "--max-snapshots/--max-wals" in message
    lost = failure_message(cfg, 0xAB, CommitOutOfRangeError(9, 8))
    assert "lost raft log entries" in lost and "/data/n1" in lost


async def test_a_canceled_proposal_counts_until_its_time_is_up():
    """A caller that goes away (a client resetting its call) does not free its proposal's
    place in ``max_pending_proposals``: the proposal is still on its way through raft."""
    node = _follower(max_pending_proposals=3)
    node.start(NodeHandlers(state_machine=_SM(), send=lambda msgs: None))
    try:
        node.receive([_heartbeat(3)])
        await async_wait_for(lambda: node.leader == 2, WAIT_S, "the leader known")
        callers = [asyncio.ensure_future(node.propose(b"x", timeout_s=0.5)) for _ in range(3)]
        await asyncio.sleep(0)
        for caller in callers:
            caller.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        assert node.pending_proposals == 3  # forwarded to the leader, never answered
        with pytest.raises(errors.ServiceError) as refused:
            await node.propose(b"y", timeout_s=0.5)
        assert refused.value.code == errors.GrpcCode.RESOURCE_EXHAUSTED
        await async_wait_for(lambda: node.pending_proposals == 0, WAIT_S, "their time up")
    finally:
        await node.stop()
