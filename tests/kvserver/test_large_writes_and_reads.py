"""RaftKV applies a large delete and serves a large read in steps, one loop turn per step.

The state machine alone (proposals apply at once: ``tests.support.apply_now``, which runs an
``ApplyInSteps`` to its end as the node's apply task does). Counted, never timed: how many
loop turns another task got while the work ran, and that every read taken between the steps
answered the state from before the delete.
"""

from __future__ import annotations

import asyncio

from kvserver.kvpb.alarm import AlarmAction, AlarmRequest, AlarmType
from kvserver.kvpb.kv import DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest
from kvserver.mvcc.store import READ_STEP_KEYS, WRITE_STEP_KEYS
from kvserver.server.replicated_kv import RaftKV
from tests.support.apply_now import raftkv_without_raft

KEYS = 4 * WRITE_STEP_KEYS + 100


async def loaded() -> RaftKV:
    kv = raftkv_without_raft(cluster_id=1, member_id=7, name="m", members=())
    for i in range(0, KEYS, 100):
        ops = tuple(
            RequestOp(request_put=PutRequest(b"k/%06d" % j, b"v"))
            for j in range(i, min(i + 100, KEYS))
        )
        await kv.txn(TxnRequest((), ops, ()))
    return kv


async def test_a_large_delete_lets_the_loop_run_and_reads_see_it_whole():
    kv = await loaded()
    everything = RangeRequest(b"k/", b"k0", count_only=True)
    revision = kv.store.revision
    seen: list[tuple[int, int]] = []  # (count, header revision) of reads between the steps
    during = 0  # reads that started while the delete was half done
    done = False

    async def reader() -> None:
        nonlocal during
        while not done:
            during += kv.store.key_count not in (0, KEYS)
            resp = await kv.range(everything)
            seen.append((resp.count, resp.header.revision))
            await asyncio.sleep(0)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)
    resp = await kv.delete_range(DeleteRangeRequest(b"k/", b"k0"))
    done = True
    await task
    assert resp.deleted == KEYS and resp.header.revision == revision + 1
    # the reader ran while the delete was half done ...
    assert during >= 1
    # ... and every read saw all of the keys or none of them
    assert all(s in ((KEYS, revision), (0, revision + 1)) for s in seen), set(seen)
    assert (await kv.range(everything)).count == 0


async def test_a_read_of_every_key_takes_several_loop_turns():
    kv = await loaded()
    turns = 0
    done = False

    async def other() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    resp = await kv.range(RangeRequest(b"k/", b"k0"))  # no limit: every key
    done = True
    await task
    assert len(resp.kvs) == KEYS and resp.count == KEYS
    assert turns >= KEYS // READ_STEP_KEYS


async def test_a_large_delete_frees_space_while_nospace_is_raised():
    """Deletes are never refused under NOSPACE; a large one goes through the same steps."""
    kv = await loaded()
    await kv.alarm(AlarmRequest(AlarmAction.ACTIVATE, 7, AlarmType.NOSPACE))
    resp = await kv.delete_range(DeleteRangeRequest(b"k/", b"k0"))
    assert resp.deleted == KEYS
    assert (await kv.range(RangeRequest(b"k/", b"k0", count_only=True))).count == 0
