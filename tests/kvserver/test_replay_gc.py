"""A member that restarts applies its WAL's committed entries again with the cyclic GC
paused, as it restores its snapshot, and turns the GC back on (after freezing what the
replay built) once it has caught up with the commit index it had, or when it stops; it
takes no snapshot before then (kvserver.server.node)."""

import asyncio
import gc

from kvserver.server.node import PROPOSAL_HEADER_BYTES, Node, NodeHandlers, NodeOptions
from raft import (
    Config,
    ConfState,
    Entry,
    EntryType,
    HardState,
    RawNode,
    Snapshot,
    SnapshotMetadata,
)
from tests.kvserver.fakes import MemoryNodeStorage
from tests.support.wait import async_wait_for

WAIT_S = 10.0
COMMITTED = 200


class _RecordingSM:
    """Notes whether the cyclic GC was on when each entry was applied."""

    def __init__(self) -> None:
        self.gc_on: list[bool] = []

    def apply(self, index: int, payload: bytes) -> None:
        self.gc_on.append(gc.isenabled())


def _restarted_node(snapshot_count: int = 100_000) -> Node:
    """A single-voter node restored from a snapshot at index 1, whose log then holds
    COMMITTED committed entries, none of them applied."""
    storage = MemoryNodeStorage()
    voters = ConfState(voters=(1,))
    storage.raft_storage.apply_snapshot(
        Snapshot(metadata=SnapshotMetadata(conf_state=voters, index=1, term=1))
    )
    data = bytes(PROPOSAL_HEADER_BYTES) + b"put"
    last = 1 + COMMITTED
    storage.raft_storage.append(
        [Entry(term=1, index=i, type=EntryType.NORMAL, data=data) for i in range(2, last + 1)]
    )
    storage.raft_storage.set_hard_state(HardState(term=1, vote=1, commit=last))
    config = Config(
        id=1,
        storage=storage.raft_storage,
        election_tick=1000,
        heartbeat_tick=1,
        max_committed_size_per_ready_bytes=len(data) * 10,  # applied in batches, as at scale
    )
    raw = RawNode(config)
    return Node(
        raw=raw,
        node_id=1,
        storage=storage,  # type: ignore[arg-type]
        options=NodeOptions(
            heartbeat_interval_s=0.05, snapshot_in_child=False, snapshot_count=snapshot_count
        ),
        applied=1,
        conf_state=voters,
    )


async def test_the_replay_runs_with_the_gc_paused_and_turns_it_back_on():
    assert gc.isenabled()
    node = _restarted_node()
    assert node.recovered_commit == 1 + COMMITTED and not node.recovered.is_set()
    sm = _RecordingSM()
    node.start(NodeHandlers(state_machine=sm, send=lambda msgs: None))
    try:
        await async_wait_for(lambda: node.recovered.is_set(), WAIT_S, "the replay done")
        assert len(sm.gc_on) == COMMITTED
        assert not any(sm.gc_on)  # paused for every replayed entry
        assert gc.isenabled()  # and on again once caught up
    finally:
        await node.stop()
        gc.unfreeze()
    assert gc.isenabled()


async def test_a_node_stopped_during_its_replay_turns_the_gc_back_on():
    node = _restarted_node()
    node.start(NodeHandlers(state_machine=_RecordingSM(), send=lambda msgs: None))
    assert not gc.isenabled()  # paused from the start
    await asyncio.sleep(0)  # the node's tasks begin
    await node.stop()
    assert gc.isenabled()


async def test_a_node_with_nothing_to_replay_leaves_the_gc_alone():
    node = _restarted_node()
    node.recovered.set()  # as when the snapshot covers the commit index
    node.start(NodeHandlers(state_machine=_RecordingSM(), send=lambda msgs: None))
    try:
        await asyncio.sleep(0)
        assert gc.isenabled()
    finally:
        await node.stop()


async def test_no_snapshot_is_taken_until_the_replay_is_done():
    """The replayed entries are more than a snapshot's count, but a snapshot is started
    only once the node has caught up with its commit index."""
    node = _restarted_node(snapshot_count=COMMITTED // 4)
    started: list[tuple[int, bool]] = []
    node._start_snapshot = lambda: started.append((node.applied, node.recovered.is_set()))
    node.start(NodeHandlers(state_machine=_RecordingSM(), send=lambda msgs: None))
    try:
        await async_wait_for(lambda: node.recovered.is_set(), WAIT_S, "the replay done")
        assert started == [(1 + COMMITTED, True)]
    finally:
        await node.stop()
        gc.unfreeze()
