"""The changefeed's cold replay (``ColdReplay``: ``RaftKV`` over an ``MVCCStore`` that keeps no
history) against a member's state machine with its whole store, entry by entry, over random
logs.

Each seed builds a log of the entries a member applies: plain txns of puts (the fast path,
retried with the same request id now and then), puts with leases and ``ignore_*`` flags,
deletes of one key, of ranges and of every key above one, txns with compares (ranges of keys
included) whose branches put, delete, read at compacted or future revisions and nest txns,
invalid requests (an empty key, a key twice in a txn, an unknown lease), lease grants,
revokes (which delete the attached keys) and checkpoints, compactions (valid or not), range
entries, undecodable entries and the NOSPACE alarm raised and cleared. ``RaftKV`` with its
``MVCCStore`` applies the log and records every event its watchers would get; snapshots of it
are taken along the way.

From the empty state and from each snapshot, the cold replay of the rest of the log must
give, after every entry, the same revision, and in total exactly the events of the watched
range the store gave (type, key, value, create and mod revision, version, lease and
``prev_kv``, in order), and end with the same live keys.
"""

from __future__ import annotations

import random

import msgpack
import pytest

from kvserver.archive.pitr import ReplayOnly
from kvserver.kvpb.alarm import AlarmAction, AlarmRequest, AlarmType
from kvserver.kvpb.errors import EtcdError
from kvserver.kvpb.kv import (
    CompactionRequest,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    Event,
    PutRequest,
    RangeRequest,
    RequestOp,
    TxnRequest,
    key_in_range,
)
from kvserver.kvpb.lease import LeaseGrantRequest, LeaseRevokeRequest
from kvserver.lease.codec import LeaseCheckpointRequest, encode_lease_entry
from kvserver.mvcc.codec import encode_entry
from kvserver.server.alarms import encode_alarm_entry
from kvserver.server.node import ApplyInSteps
from kvserver.server.replicated_kv import RaftKV
from kvserver.spark.source.cold_history import ColdReplay

WATCH_KEY, WATCH_END = b"a/", b"a0"  # the prefix a/
KEYS = [b"a/%d" % i for i in range(10)] + [b"b/%d" % i for i in range(5)] + [b"a", b"a0", b"c"]
FOREVER = 1 << 62


class _Recorder:
    """The reference's watch hub: every (revision, events) it is handed."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, tuple[Event, ...]]] = []

    def notify(self, revision: int, events) -> None:
        self.batches.append((revision, tuple(events)))

    def reset(self, store) -> None:
        return None

    def close(self) -> None:
        return None


def _apply(member: RaftKV, index: int, payload: bytes) -> object:
    result = member.apply(index, payload)
    if type(result) is ApplyInSteps:  # a large delete or revoke: all of it, as a member does
        result = result.run_now()
    return result


def _member() -> tuple[RaftKV, _Recorder]:
    kv = RaftKV(
        cluster_id=1,
        member_id=2,
        name="ref",
        members=(),
        node=ReplayOnly(),  # type: ignore[arg-type]
        membership=None,
    )
    kv.watch_hub.close()
    rec = _Recorder()
    kv.watch_hub = rec  # type: ignore[assignment]
    return kv, rec


class _Log:
    """Random entries, chosen against the reference's current state."""

    def __init__(self, rng: random.Random, ref: RaftKV) -> None:
        self.rng = rng
        self.ref = ref
        self.request_ids = {7: 0, 8: 0}
        self.sent: list[tuple[int, int, object]] = []  # (client, request id, request)
        self.leases: list[int] = []
        self.next_lease = 100
        self.alarm = False
        self.retries = 0

    def key(self) -> bytes:
        return self.rng.choice(KEYS)

    def value(self) -> bytes:
        return self.rng.choice([b"", b"v", b"w", b"x" * self.rng.randint(1, 40)])

    def lease(self) -> int:
        r = self.rng.random()
        if r < 0.6 or not self.leases:
            return 0
        if r < 0.95:
            return self.rng.choice(self.leases)
        return 999_999  # no such lease

    def kv_entry(self, request) -> bytes:
        r = self.rng.random()
        if r < 0.3:
            return encode_entry(request)
        if r < 0.4 and self.sent:  # a retry: the same ids, usually the same request
            self.retries += 1
            client, rid, old = self.rng.choice(self.sent[-80:])
            return encode_entry(old if self.rng.random() < 0.8 else request, client, rid)
        client = self.rng.choice([7, 8])
        self.request_ids[client] += 1
        rid = self.request_ids[client]
        self.sent.append((client, rid, request))
        return encode_entry(request, client, rid)

    def put(self) -> PutRequest:
        rng = self.rng
        r = rng.random()
        if r < 0.1:
            return PutRequest(self.key(), b"", ignore_value=True, prev_kv=rng.random() < 0.5)
        if r < 0.2:
            return PutRequest(self.key(), self.value(), ignore_lease=True)
        if r < 0.22:
            return PutRequest(b"", b"no key")
        return PutRequest(self.key(), self.value(), self.lease(), prev_kv=rng.random() < 0.3)

    def delete(self) -> DeleteRangeRequest:
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            return DeleteRangeRequest(self.key(), prev_kv=rng.random() < 0.5)
        if r < 0.85:
            a, b = sorted((self.key(), self.key()))
            return DeleteRangeRequest(a, b)
        return DeleteRangeRequest(self.key(), b"\0")

    def compare(self) -> Compare:
        rng = self.rng
        key = self.key()
        cur = self.ref.store.get(key)
        target = rng.choice(list(CompareTarget))
        result = rng.choice(list(CompareResult))
        range_end = b""
        if rng.random() < 0.2:
            range_end = rng.choice([b"a0", b"b/3", b"\0"])
        near = cur if cur is not None and rng.random() < 0.7 else None
        return Compare(
            result,
            target,
            key,
            version=near.version if near else rng.randint(0, 3),
            create_revision=near.create_revision if near else rng.randint(0, 50),
            mod_revision=near.mod_revision if near else rng.randint(0, 50),
            value=near.value if near else self.value(),
            lease=near.lease if near else 0,
            range_end=range_end,
        )

    def op(self, depth: int) -> RequestOp:
        rng = self.rng
        r = rng.random()
        if r < 0.5:
            return RequestOp(request_put=self.put())
        if r < 0.75:
            return RequestOp(request_delete_range=self.delete())
        if r < 0.9 or depth > 1:
            rev = self.ref.store.revision
            revision = rng.choice([0, 0, rev, rev + 3, max(self.ref.store.compact_revision - 1, 1)])
            return RequestOp(request_range=RangeRequest(self.key(), revision=revision))
        return RequestOp(request_txn=self.txn(depth + 1))

    def txn(self, depth: int = 0) -> TxnRequest:
        rng = self.rng
        compares = tuple(self.compare() for _ in range(rng.randint(0, 2)))
        success = tuple(self.op(depth) for _ in range(rng.randint(0, 3)))
        failure = tuple(self.op(depth) for _ in range(rng.randint(0, 2)))
        return TxnRequest(compares, success, failure)

    def plain_puts(self) -> TxnRequest:
        keys = self.rng.sample(KEYS, self.rng.randint(1, 6))
        if self.rng.random() < 0.05:
            keys.append(keys[0])  # a key twice: refused
        return TxnRequest(
            (), tuple(RequestOp(request_put=PutRequest(k, self.value())) for k in keys)
        )

    def next(self) -> bytes:
        rng = self.rng
        r = rng.random()
        if r < 0.35:
            return self.kv_entry(self.plain_puts() if rng.random() < 0.8 else self.put())
        if r < 0.45:
            lease = rng.choice(self.leases) if self.leases and rng.random() < 0.5 else 0
            return self.kv_entry(PutRequest(self.key(), self.value(), lease))
        if r < 0.55:
            return self.kv_entry(self.delete())
        if r < 0.75:
            return self.kv_entry(self.txn())
        if r < 0.8:
            self.next_lease += 1
            self.leases.append(self.next_lease)
            return encode_lease_entry(LeaseGrantRequest(60, self.next_lease))
        if r < 0.85:
            attached = self.ref.store.lease_ids()  # leases with keys: the revoke deletes them
            if attached and rng.random() < 0.7:
                lease = rng.choice(attached)
            else:
                lease = rng.choice(self.leases) if self.leases and rng.random() < 0.9 else 12345
            return encode_lease_entry(
                LeaseRevokeRequest(lease), rng.choice([0, 9]), rng.randint(1, 5)
            )
        if r < 0.87 and self.leases:
            return encode_lease_entry(LeaseCheckpointRequest(((rng.choice(self.leases), 30),)))
        if r < 0.91:
            store = self.ref.store
            rev = rng.randint(max(store.compact_revision - 1, 0), store.revision + 1)
            return self.kv_entry(CompactionRequest(rev))
        if r < 0.93:
            return self.kv_entry(RangeRequest(self.key(), b"\0"))
        if r < 0.94:
            return b"\x94\x01" + rng.randbytes(rng.randint(0, 6))  # undecodable
        if r < 0.96:
            self.alarm = not self.alarm
            action = AlarmAction.ACTIVATE if self.alarm else AlarmAction.DEACTIVATE
            return encode_alarm_entry(AlarmRequest(action, 2, AlarmType.NOSPACE))
        return msgpack.packb([1, 0, 0, [11, self.key(), b"z", 0, True, False, False]])


def _watched(batches, after: int) -> list[Event]:
    return [
        ev
        for rev, evs in batches
        if rev > after
        for ev in evs
        if key_in_range(ev.kv.key, WATCH_KEY, WATCH_END)
    ]


@pytest.mark.parametrize("seed", range(40))
def test_cold_replay_equals_the_state_machine(seed):
    rng = random.Random(seed)
    ref, rec = _member()
    log = _Log(rng, ref)
    entries: list[bytes] = []
    revisions: list[int] = []  # the reference's revision after each entry
    snapshots: list[tuple[int, bytes]] = [(0, b"")]  # (entries applied, image)
    for i in range(300):
        payload = log.next()
        entries.append(payload)
        _apply(ref, i + 1, payload)
        revisions.append(ref.store.revision)
        if rng.random() < 0.02:
            snapshots.append((i + 1, b"".join(ref.snapshot_chunks())))
    live = ref.store.range(b"\x00", b"\0").kvs

    for done, image in snapshots:
        replay = ColdReplay(WATCH_KEY, WATCH_END, 1, FOREVER)
        if image:
            replay.restore(image)
        start = revisions[done - 1] if done else 1
        assert replay.revision == start
        for i in range(done, len(entries)):
            replay.apply(i + 1, entries[i])
            assert replay.revision == revisions[i], f"entry {i + 1}: {entries[i]!r}"
        assert replay.events == _watched(rec.batches, start)
        assert replay.store.range(b"\x00", b"\0").kvs == live


def test_the_log_exercises_every_kind_of_change():
    """The random logs above are worth something only if they hold deletes, revokes that
    delete keys, refused writes and retries: count them over the seeds."""
    deletes = revoke_deletes = prev_puts = fast = refused = retries = 0
    for seed in range(40):
        rng = random.Random(seed)
        ref, rec = _member()
        log = _Log(rng, ref)
        for i in range(300):
            payload = log.next()
            before = len(rec.batches)
            refused += isinstance(_apply(ref, i + 1, payload), EtcdError)
            new = [ev for _, evs in rec.batches[before:] for ev in evs]
            deletes += sum(1 for ev in new if ev.type.name == "DELETE")
            prev_puts += sum(1 for ev in new if ev.type.name == "PUT" and ev.prev_kv is not None)
            if payload[:2] == b"\x94\x4c" and new:
                revoke_deletes += 1
            fast += payload[:2] == b"\x94\x01"
        retries += log.retries
    assert deletes > 500
    assert revoke_deletes > 25
    assert prev_puts > 1000
    assert fast > 3000
    assert refused > 500
    assert retries > 300


def _replay_equals_reference(entries: list[bytes]) -> None:
    ref, rec = _member()
    revisions = []
    for i, payload in enumerate(entries):
        _apply(ref, i + 1, payload)
        revisions.append(ref.store.revision)
    replay = ColdReplay(WATCH_KEY, WATCH_END, 1, FOREVER)
    for i, payload in enumerate(entries):
        replay.apply(i + 1, payload)
        assert replay.revision == revisions[i], f"entry {i + 1}"
    assert replay.events == _watched(rec.batches, 1)


def _puts(n: int, tag: bytes) -> TxnRequest:
    return TxnRequest(
        (), tuple(RequestOp(request_put=PutRequest(b"a/%d" % i, tag)) for i in range(n))
    )


def test_txns_at_and_over_the_op_limit():
    """128 puts apply; 129 are refused (etcd's --max-txn-ops default), nothing changes."""
    _replay_equals_reference(
        [
            encode_entry(_puts(128, b"x")),
            encode_entry(_puts(129, b"y")),
            encode_entry(_puts(3, b"z")),
        ]
    )


def test_a_plain_put_detaches_a_key_from_its_lease():
    """A key put again without a lease is no longer deleted by the lease's revoke."""
    _replay_equals_reference(
        [
            encode_lease_entry(LeaseGrantRequest(60, 5)),
            encode_entry(PutRequest(b"a/1", b"leased", 5)),
            encode_entry(PutRequest(b"a/2", b"leased", 5)),
            encode_entry(_puts(2, b"plain")),  # a/0 and a/1: a/1 leaves the lease
            encode_lease_entry(LeaseRevokeRequest(5)),  # deletes a/2 only
            encode_lease_entry(LeaseRevokeRequest(5)),  # gone: an error, no revision
        ]
    )


def test_a_revoke_and_a_delete_of_many_keys():
    """More keys than a member deletes in one step: the store revokes the lease and deletes
    the range in steps, the replay at once; the same revisions and events in key order."""
    keys = [b"a/%05d" % i for i in range(2100)] + [b"b/%05d" % i for i in range(100)]
    _replay_equals_reference(
        [
            encode_lease_entry(LeaseGrantRequest(60, 5)),
            *[encode_entry(PutRequest(k, b"v", 5)) for k in keys],
            encode_lease_entry(LeaseRevokeRequest(5), 9, 1),
            *[encode_entry(PutRequest(k, b"w")) for k in keys],
            encode_entry(DeleteRangeRequest(b"a/", b"b/00050", prev_kv=True), 9, 2),
        ]
    )
