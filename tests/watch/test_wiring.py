"""The watch hub wired into the state machine (``kvserver.server.replicated_kv.RaftKV``), without raft.

RaftKV's contract with the hub: every applied entry that produced events — a put, a delete,
a txn, a lease revoke deleting attached keys — is notified in apply order; entries that change
nothing (a duplicate, a failed request, a compaction, a revoke of a lease without keys) are
not; a snapshot restore swaps the store and the hub's watchers continue from the new store's
history (or learn that it was compacted); ``stop()`` cancels every watcher with
``etcdserver: server stopped``. Entries are fed to ``apply`` as the node would, in order.
"""

from __future__ import annotations

from kvserver.kvpb.kv import (
    CompactionRequest,
    DeleteRangeRequest,
    PutRequest,
    RequestOp,
    TxnRequest,
)
from kvserver.kvpb.lease import LeaseGrantRequest, LeaseRevokeRequest
from kvserver.kvpb.watch import WatchCreateRequest
from kvserver.lease.codec import encode_lease_entry
from kvserver.mvcc.codec import encode_entry
from kvserver.server.replicated_kv import RaftKV
from kvserver.watch.hub import MSG_WATCH_STOPPED
from tests.support.apply_now import raftkv_without_raft


def make_kv() -> RaftKV:
    return raftkv_without_raft(cluster_id=1, member_id=2, name="m", members=())


class Feeder:
    """Applies entries to a RaftKV with increasing indexes, as the node does."""

    def __init__(self, kv: RaftKV) -> None:
        self.kv = kv
        self.index = 0

    def __call__(self, request, client_id: int = 0, request_id: int = 0):
        self.index += 1
        if isinstance(request, LeaseGrantRequest | LeaseRevokeRequest):
            payload = encode_lease_entry(request, client_id, request_id)
        else:
            payload = encode_entry(request, client_id, request_id)
        return self.kv.apply(self.index, payload)


def drain(stream) -> list:
    out = []
    while (resp := stream.poll()) is not None:
        out.append(resp)
    return out


def events_of(responses) -> list[tuple[str, bytes, int]]:
    return [(ev.type.name, ev.kv.key, ev.kv.mod_revision) for r in responses for ev in r.events]


def test_applied_writes_and_lease_revokes_are_notified_in_order():
    kv = make_kv()
    apply = Feeder(kv)
    stream = kv.watch_stream()
    stream.create(WatchCreateRequest(key=b"a", range_end=b"\0"))
    assert drain(stream)[0].created
    apply(PutRequest(b"a", b"1"))  # rev 2
    apply(PutRequest(b"b", b"1"), client_id=7, request_id=1)  # rev 3
    apply(PutRequest(b"b", b"1"), client_id=7, request_id=1)  # duplicate: nothing
    apply(DeleteRangeRequest(b"zz"))  # deletes nothing: no revision
    apply(PutRequest(b"", b"x"))  # refused: nothing
    apply(
        TxnRequest(
            success=(RequestOp.of(PutRequest(b"c", b"1")), RequestOp.of(PutRequest(b"d", b"1")))
        )
    )  # rev 4, two events
    apply(CompactionRequest(3))  # no events
    apply(LeaseGrantRequest(60, 99))
    apply(PutRequest(b"e", b"1", lease=99))  # rev 5
    apply(PutRequest(b"f", b"1", lease=99))  # rev 6
    apply(LeaseRevokeRequest(99))  # rev 7: both keys deleted in one revision
    apply(LeaseGrantRequest(60, 100))
    apply(LeaseRevokeRequest(100))  # no keys: no revision
    got = drain(stream)
    assert events_of(got) == [
        ("PUT", b"a", 2),
        ("PUT", b"b", 3),
        ("PUT", b"c", 4),
        ("PUT", b"d", 4),
        ("PUT", b"e", 5),
        ("PUT", b"f", 6),
        ("DELETE", b"e", 7),
        ("DELETE", b"f", 7),
    ]
    assert [r.revision for r in got] == [2, 3, 4, 5, 6, 7]  # one response per revision
    assert kv.watch_hub.revision == kv.store.revision == 7
    assert kv.watch_hub.stats["gaps"] == 0


def test_snapshot_restore_continues_watchers_from_the_new_store():
    leader, follower = make_kv(), make_kv()
    to_leader, to_follower = Feeder(leader), Feeder(follower)
    for feed in (to_leader, to_follower):
        feed(PutRequest(b"k", b"1"))  # rev 2 on both
    stream = follower.watch_stream()
    stream.create(WatchCreateRequest(key=b"k", prev_kv=True))
    other = follower.watch_stream()
    other.create(WatchCreateRequest(key=b"old"))
    assert drain(stream)[0].created and drain(other)[0].created
    # The follower falls behind; the leader applies more and snapshots.
    to_leader(PutRequest(b"k", b"2"))  # 3
    to_leader(PutRequest(b"x", b"1"))  # 4
    to_leader(DeleteRangeRequest(b"k"))  # 5
    follower.restore(b"".join(leader.snapshot_chunks()))
    got = drain(stream)
    assert events_of(got) == [("PUT", b"k", 3), ("DELETE", b"k", 5)]
    assert got[-1].events[-1].prev_kv.value == b"2"
    assert drain(other) == []
    # Live again on the new store.
    follower.apply(to_leader.index + 1, encode_entry(PutRequest(b"k", b"3"), 0, 0))  # 6
    assert events_of(drain(stream)) == [("PUT", b"k", 6)]
    assert follower.watch_hub.revision == 6


def test_restore_past_a_compaction_tells_the_watcher_it_was_compacted():
    leader, follower = make_kv(), make_kv()
    for feed in (Feeder(leader), Feeder(follower)):
        feed(PutRequest(b"k", b"1"))
    stream = follower.watch_stream()
    w = stream.create(WatchCreateRequest(key=b"k"))
    assert drain(stream)[0].created
    apply = Feeder(leader)
    apply.index = 1
    for i in range(4):
        apply(PutRequest(b"k", str(i).encode()))  # 3..6
    apply(CompactionRequest(5))
    follower.restore(b"".join(leader.snapshot_chunks()))
    (resp,) = drain(stream)
    assert resp.canceled and resp.compact_revision == 5 and w.done


async def test_stop_cancels_every_watcher():
    kv = make_kv()
    kv.start()
    stream = kv.watch_stream()
    stream.create(WatchCreateRequest(key=b"k"))
    await kv.stop()
    got = [r async for r in stream]  # the stream ends after the final responses
    assert got[0].created and got[-1].canceled
    assert got[-1].cancel_reason == MSG_WATCH_STOPPED
    assert kv.watch_hub.watcher_count == 0
