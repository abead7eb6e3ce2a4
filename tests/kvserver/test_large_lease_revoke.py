"""Revoking a lease with many keys runs in steps, as a large delete does, and is still the
one-revision revoke every reader sees whole.

The state machine alone (``tests.support.apply_now`` runs an ``ApplyInSteps`` to its end as
the node's apply task does), next to a second one that revokes the same lease in one step:
their answers, events and snapshots must be equal. Counted, never timed: the loop turns
another task got while the revoke ran, and what the reads between the steps answered.
"""

from __future__ import annotations

import asyncio

import pytest

from kvserver.kvpb.errors import LeaseNotFoundError
from kvserver.kvpb.kv import PutRequest, RangeRequest, RequestOp, TxnRequest
from kvserver.kvpb.lease import LeaseRevokeRequest
from kvserver.mvcc.store import WRITE_STEP_KEYS
from kvserver.server.replicated_kv import RaftKV
from tests.support.apply_now import raftkv_without_raft

KEYS = 3 * WRITE_STEP_KEYS + 17
LEASE = 0x1234


async def loaded() -> RaftKV:
    kv = raftkv_without_raft(cluster_id=1, member_id=7, name="m", members=())
    await kv.lease_grant(600, LEASE)
    # keys in a shuffled order (the revoke deletes them sorted), one more without the lease
    order = sorted(range(KEYS), key=lambda i: (i * 7919) % KEYS)
    for i in range(0, KEYS, 100):
        ops = tuple(
            RequestOp(request_put=PutRequest(b"k/%06d" % j, b"v%d" % j, lease=LEASE))
            for j in order[i : i + 100]
        )
        await kv.txn(TxnRequest((), ops, ()))
    await kv.put(PutRequest(b"k/free", b"stays"))
    return kv


def _image(kv: RaftKV) -> bytes:
    return b"".join(kv.snapshot_chunks())


async def test_a_large_revoke_lets_the_loop_run_and_equals_the_one_step_revoke():
    kv, reference = await loaded(), await loaded()
    watched: list = []
    kv.watch_hub.notify = lambda revision, events: watched.append((revision, events))
    everything = RangeRequest(b"k/", b"k0", count_only=True)
    revision = kv.store.revision
    seen: set[tuple[int, int]] = set()
    turns = 0
    done = False

    async def reader() -> None:
        nonlocal turns
        while not done:
            turns += 1
            resp = await kv.range(everything)
            seen.add((resp.count, resp.header.revision))
            await asyncio.sleep(0)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0)
    await kv.lease_revoke(LEASE)
    done = True
    await task

    # one step, the lessor's ordinary path, on the reference
    expected = reference.lessor.apply(LeaseRevokeRequest(LEASE))
    assert turns >= KEYS // WRITE_STEP_KEYS
    assert seen <= {(KEYS + 1, revision), (1, revision + 1)}, seen
    [(event_revision, events)] = watched
    assert event_revision == revision + 1
    assert events == expected.events and len(events) == KEYS
    assert [e.kv.key for e in events] == sorted(e.kv.key for e in events)
    assert _image(kv) == _image(reference)
    assert not kv.lessor.exists(LEASE)
    assert (await kv.range(RangeRequest(b"k/", b"k0"))).kvs[0].key == b"k/free"
    with pytest.raises(LeaseNotFoundError):
        await kv.lease_revoke(LEASE)


async def test_a_retried_large_revoke_is_answered_its_first_outcome():
    kv = await loaded()
    first = await kv.lease_revoke(LEASE, client_id=9, request_id=1)
    revision = kv.store.revision
    again = await kv.lease_revoke(LEASE, client_id=9, request_id=1)
    assert again == first and kv.store.revision == revision
