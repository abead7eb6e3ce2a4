"""When a node takes its next snapshot, and how its apply task shares the loop
(kvserver.server.node).

A member restarts from its newest snapshot and applies every entry after it again, so a
snapshot is due after ``snapshot_count`` entries or after ``snapshot_bytes`` bytes of them,
whichever comes first: a store loaded in big txns passes the bytes long before the count.
And the apply task yields to the loop at least every few milliseconds, however big the
entries, so heartbeats go out while a member replays its WAL.
"""

import asyncio
import time

import pytest

from kvserver.server.node import (
    PROPOSAL_HEADER_BYTES,
    SNAPSHOT_SPACING_MIN_BYTES,
    SNAPSHOT_SPACING_S,
    Node,
    NodeOptions,
    snapshot_threshold,
)
from raft import Config, ConfState, Entry, EntryType, MemoryStorage, RawNode, SnapshotMetadata

NODE_ID = 1


class _Storage:
    def __init__(self) -> None:
        self.raft_storage = MemoryStorage()


class _SlowStateMachine:
    """Applies an entry in at least ``seconds`` of wall-clock time (busy, holding the loop)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.applied: list[int] = []

    def apply(self, index: int, payload: bytes) -> None:
        until = time.perf_counter() + self.seconds
        while time.perf_counter() < until:
            pass
        self.applied.append(index)


def _entries(count: int, payload_bytes: int) -> list[Entry]:
    data = bytes(PROPOSAL_HEADER_BYTES) + b"x" * payload_bytes
    return [Entry(term=1, index=i, type=EntryType.NORMAL, data=data) for i in range(1, count + 1)]


def _node(entries: list[Entry], **options: int) -> Node:
    storage = _Storage()
    storage.raft_storage.append(entries)
    raw = RawNode(
        Config(id=NODE_ID, storage=storage.raft_storage, election_tick=10, heartbeat_tick=1)
    )
    return Node(
        raw=raw,
        node_id=NODE_ID,
        storage=storage,  # type: ignore[arg-type]  # only raft_storage is used here
        options=NodeOptions(**options),
        applied=0,
        conf_state=ConfState(voters=(NODE_ID,)),
    )


async def _apply(node: Node, entries: list[Entry], seconds_each: float = 0.0) -> None:
    node.sm = _SlowStateMachine(seconds_each)  # type: ignore[assignment]
    await node._apply(tuple(entries))


def test_big_entries_make_a_snapshot_due_long_before_the_count():
    entries = _entries(100, 1000)
    node = _node(entries, snapshot_count=10**9, snapshot_bytes=20_000)
    asyncio.run(_apply(node, entries[:10]))
    assert node.applied_bytes == 10 * (PROPOSAL_HEADER_BYTES + 1000)
    assert not node.snapshot_due()
    asyncio.run(_apply(node, entries[10:]))
    assert node.applied == 100
    assert node.applied_bytes > snapshot_threshold(NODE_ID, 20_000)
    assert node.snapshot_due()


def test_zero_snapshot_bytes_leaves_only_the_count():
    entries = _entries(100, 1000)
    node = _node(entries, snapshot_count=60, snapshot_bytes=0)
    asyncio.run(_apply(node, entries[:50]))
    assert not node.snapshot_due()
    asyncio.run(_apply(node, entries[50:]))
    assert node.snapshot_due()  # 100 entries > 60 and up to a quarter more


def test_a_kept_snapshot_counts_the_bytes_again_from_its_index():
    entries = _entries(100, 1000)
    node = _node(
        entries, snapshot_count=10**9, snapshot_bytes=20_000, snapshot_catchup_entries=10**6
    )
    asyncio.run(_apply(node, entries[:60]))
    assert node.snapshot_due()
    # what _start_snapshot records at index 60, then the file is kept
    node._snapshot_started = (60, node.applied_bytes)
    metadata = SnapshotMetadata(conf_state=node.conf_state, index=60, term=1)
    node._keep_snapshot(metadata, b"image", "made in a test", "loop")
    assert node.snapshot_index == 60
    assert not node.snapshot_due()
    asyncio.run(_apply(node, entries[60:]))
    assert node.snapshot_due()  # 40 more entries: 40,640 bytes since the snapshot


def test_applying_big_entries_yields_to_the_loop_every_few_milliseconds():
    entries = _entries(60, 10)
    node = _node(entries)
    turns = 0

    async def run() -> None:
        nonlocal turns
        stop = asyncio.Event()

        async def count_turns() -> None:
            nonlocal turns
            while not stop.is_set():
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.get_running_loop().create_task(count_turns())
        await asyncio.sleep(0)
        turns = 0
        await _apply(node, entries, seconds_each=0.002)
        stop.set()
        await counter

    asyncio.run(run())
    assert node.applied == 60
    # each entry holds the loop >= 2 ms, so a slice of 10 ms covers at most 6 of them:
    # 60 entries give the other task at least 8 turns (it got none before the last entry
    # with a yield every 512 entries)
    assert turns >= 8


@pytest.mark.parametrize("big", [True, False])
def test_the_next_snapshot_waits_a_little_after_a_big_one_was_kept(big):
    # a big snapshot's end and the next one's fork each hold up writes: not at once
    entries = _entries(100, 1000)
    node = _node(
        entries, snapshot_count=10**9, snapshot_bytes=20_000, snapshot_catchup_entries=10**6
    )
    node.recovered.set()
    asyncio.run(_apply(node, entries[:60]))
    assert node.snapshot_may_start(time.monotonic())
    node._snapshot_started = (60, node.applied_bytes)
    metadata = SnapshotMetadata(conf_state=node.conf_state, index=60, term=1)
    image = bytes(SNAPSHOT_SPACING_MIN_BYTES if big else 1000)
    node._keep_snapshot(metadata, image, "made in a test", "loop")
    kept = time.monotonic()
    asyncio.run(_apply(node, entries[60:]))
    assert node.snapshot_due()  # 40 more entries: due again at once
    assert node.snapshot_may_start(kept) is not big
    assert node.snapshot_may_start(kept + SNAPSHOT_SPACING_S / 2) is not big
    assert node.snapshot_may_start(kept + SNAPSHOT_SPACING_S + 0.01)
