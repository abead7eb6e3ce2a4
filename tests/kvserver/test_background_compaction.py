"""RaftKV cuts the old versions of an applied compaction in the background, in batches.

The state machine alone (proposals apply at once: ``tests.support.apply_now``). The answer
to the compaction comes first, with the work pending; the task then calls
``compact_step(COMPACTION_BATCH_KEYS)`` once per loop turn until it is done.
"""

from __future__ import annotations

import asyncio

import pytest

from kvserver.kvpb.errors import CompactedError
from kvserver.kvpb.kv import CompactionRequest, PutRequest, RangeRequest
from kvserver.mvcc.store import MVCCStore
from kvserver.server.replicated_kv import COMPACTION_BATCH_KEYS, RaftKV
from tests.support.apply_now import raftkv_without_raft

MAX_TURNS = 1000  # a bound on loop turns, far above what the work needs


def make(on_memory_freed=None) -> RaftKV:
    # no pause between batches: the test counts loop turns, not time
    return raftkv_without_raft(
        cluster_id=1,
        member_id=7,
        name="m",
        members=(),
        compaction_pause_s=0.0,
        on_memory_freed=on_memory_freed,
    )


async def until_compacted(kv: RaftKV) -> int:
    """Yield the loop until the store's compaction work is done; the turns it took."""
    for turn in range(MAX_TURNS):
        if not kv.store.compaction_pending and kv._compaction_task is None:
            return turn
        await asyncio.sleep(0)
    raise AssertionError("background compaction did not finish")


async def test_compaction_answers_first_and_cuts_in_batches():
    freed: list[str] = []
    kv = make(on_memory_freed=freed.append)
    keys = 2 * COMPACTION_BATCH_KEYS + 500
    for i in range(keys):
        await kv.put(PutRequest(b"k%05d" % i, b"old"))
    for i in range(keys):
        await kv.put(PutRequest(b"k%05d" % i, b"new"))
    reference = MVCCStore()  # the same history, compacted inside the apply
    for value in (b"old", b"new"):
        for i in range(keys):
            reference.put(b"k%05d" % i, value)
    revision = kv.store.revision
    await kv.compact(CompactionRequest(revision))
    reference.compact(revision)
    # Answered with the old versions still there; reads already see the compacted store.
    assert kv.store.compaction_pending
    assert kv.store.history_size == 2 * keys
    with pytest.raises(CompactedError):
        await kv.range(RangeRequest(b"k00000", revision=revision - 1))
    assert (await kv.range(RangeRequest(b"k", b"l", count_only=True))).count == keys
    assert kv.store.compaction_backlog == 2 * keys  # one visit per old version
    turns = await until_compacted(kv)
    assert turns >= 5
    assert kv.compaction_batches == 5  # 5000 visits in batches of 1000
    assert freed == ["compacted"]  # once, when the versions are cut
    assert kv.store.history_size == reference.history_size == keys
    assert kv.store.db_size_bytes == reference.db_size_bytes
    assert b"".join(kv.store.serialize()) == b"".join(reference.serialize())
    await kv.stop()


async def test_a_compaction_while_one_is_running_joins_it():
    kv = make()
    for rnd in range(3):
        for i in range(1500):
            await kv.put(PutRequest(b"k%05d" % i, b"%d" % rnd))
    await kv.compact(CompactionRequest(1500))
    await asyncio.sleep(0)  # one batch done
    assert kv.store.compaction_pending and kv._compaction_task is not None
    task = kv._compaction_task
    await kv.compact(CompactionRequest(kv.store.revision))
    assert kv._compaction_task is task  # one task at a time
    await until_compacted(kv)
    assert kv.store.history_size == 1500
    await kv.stop()


async def test_stop_cancels_the_background_work():
    kv = make()
    for i in range(3 * COMPACTION_BATCH_KEYS):
        await kv.put(PutRequest(b"k%05d" % i, b"v"))
        await kv.put(PutRequest(b"k%05d" % i, b"w"))
    await kv.compact(CompactionRequest(kv.store.revision))
    await asyncio.sleep(0)
    await kv.stop()
    assert kv._compaction_task is None
    assert kv.store.compaction_pending  # left undone; a restart replays or restores anyway
